"""CPU checks of the CUDA C++ kernels: they compile for sm_90a, use no local memory and stay inside
their register budget (CI has nvcc/ptxas but no GPU). A planted spill must fail the check.

The build line is ``runtime.nvcc_command``: the same source, include path and -D parameters that
NVRTC compiles at run time. Where ``cuda.core`` is installed the NVRTC path is compiled too.
"""
from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from gaac_hf.kernels.cuda import runtime
from gaac_hf.kernels import LaunchConfig
from gaac_hf.kernels.cuda.attention import SOURCE, _default_stages, plan

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH (the CUDA toolkit's compiler)")

# (head_dim, group, block size, warps): the tuned shapes, odd head_dims, GQA groups 1..16
CONFIGS = [
    (128, 4, 64, 4), (64, 3, 64, 4), (256, 4, 64, 4), (128, 1, 64, 4), (128, 16, 64, 4),
    (80, 10, 64, 4), (96, 3, 32, 4), (112, 4, 128, 4), (16, 4, 16, 1), (128, 4, 64, 8),
]
REGISTER_BUDGET = 255  # one CTA per SM of 128-256 threads: the hardware cap, and never local memory


def _build(tmp_path, defines, extra=()):
    out = tmp_path / "k.cubin"
    cmd = runtime.nvcc_command(SOURCE, defines, "sm_90a", str(out)) + list(extra)
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return runtime.parse_ptxas(res.stdout + res.stderr)


LOADER_CASES = [(c, 0) for c in CONFIGS] + [(c, 1) for c in CONFIGS[:3]]  # the copy-engine loader on the tuned shapes


@pytest.mark.parametrize("cfg,loader", LOADER_CASES)
def test_decode_kernel_compiles_without_spills(tmp_path, cfg, loader):
    d, g, t, w = cfg
    defines = dict(HEAD_DIM=d, GROUP=g, PAGE=t, WARPS=w, STAGES=_default_stages(d, w), LOADER=loader)
    report = _build(tmp_path, defines)
    assert set(report) == {"gaac_bf16_decode_split", "gaac_decode_combine"}
    assert runtime.resource_problems(report, REGISTER_BUDGET) == []


@pytest.mark.parametrize("d,w,streams", [(64, 8, 48), (128, 4, 8), (128, 4, 128), (256, 4, 16), (80, 4, 40),
                                         (256, 4, 1)])
def test_chosen_occupancy_compiles_without_spills(tmp_path, monkeypatch, d, w, streams):
    """Whatever CTAs-per-SM the planner picks (it sets the register cap), the kernel must not spill; the
    merge as prepare_launch sets it (one stream at d = 256: two levels)."""
    from gaac_hf.kernels.cuda import attention as A

    monkeypatch.setattr(A, "_sm_count", lambda device: 132)
    p = A.plan(streams, 1, 4, 64, d, 65536 + 64, None, LaunchConfig(num_warps=w))
    defines = dict(p["defines"], MERGE_CHUNK=A.merge_chunk(4, p["splits"], d))
    report = _build(tmp_path, defines)
    assert set(report) == {"gaac_bf16_decode_split", "gaac_decode_combine"}
    assert runtime.resource_problems(report, REGISTER_BUDGET) == []


@pytest.mark.parametrize("d,w,streams", [(64, 8, 48), (128, 4, 8), (128, 4, 128), (256, 4, 16)])
def test_spec_entries_builds_within_the_planned_cap_and_changes_the_kernel(tmp_path, monkeypatch, d, w, streams):
    """SPEC_ENTRIES (a define GPU calls A/B, off by default) builds at the planner's launches within their
    register cap (64K / (threads x CTAs per SM)) without local memory, and changes the cubin (a define that
    compiled to nothing would A/B noise)."""
    from gaac_hf.kernels.cuda import attention as A

    monkeypatch.setattr(A, "_sm_count", lambda device: 132)
    p = A.plan(streams, 1, 4, 64, d, 65536 + 64, None, LaunchConfig(num_warps=w))
    defines = dict(p["defines"], MERGE_CHUNK=A.merge_chunk(4, p["splits"], d))
    cap = min(255, 65536 // (p["threads"] * defines["MIN_CTAS_PER_SM"]) // 8 * 8)
    cubins = []
    for value in (0, 1):
        assert runtime.resource_problems(_build(tmp_path, dict(defines, SPEC_ENTRIES=value)), cap) == [], value
        cubins.append((tmp_path / "k.cubin").read_bytes())
    assert cubins[0] != cubins[1], d


@pytest.mark.parametrize("d,w,streams", [(128, 4, 128), (256, 4, 16)])
def test_twin_lab_defines_build_within_the_planned_cap_and_change_the_kernel(tmp_path, monkeypatch, d, w, streams):
    """The twin's other lab defines (attend.cuh, shared with the v4 kernel, and decode_attention.cu): ROW_PAD=0
    (staged rows unpadded), SWIZZLE=1 (unpadded rows, XOR-permuted chunks), MERGE_BATCH=1 / 2, PLAIN_COPY=1 and
    COPY_QUADS=1 (alone and swizzled) build at the planner's launches within the register cap without local memory,
    each changes the cubin; a padding the host does not size shared memory for, SWIZZLE with the bulk-copy loader, and
    SWIZZLE or COPY_QUADS at a head_dim not a multiple of 64, are refused at compile time."""
    from gaac_hf.kernels.cuda import attention as A

    monkeypatch.setattr(A, "_sm_count", lambda device: 132)
    p = A.plan(streams, 1, 4, 64, d, 65536 + 64, None, LaunchConfig(num_warps=w))
    defines = dict(p["defines"], MERGE_CHUNK=A.merge_chunk(4, p["splits"], d))
    cap = min(255, 65536 // (p["threads"] * defines["MIN_CTAS_PER_SM"]) // 8 * 8)
    cubins = []
    for extra in ({}, dict(ROW_PAD=0), dict(SWIZZLE=1), dict(MERGE_BATCH=1), dict(MERGE_BATCH=2), dict(PLAIN_COPY=1),
                  dict(COPY_QUADS=1), dict(COPY_QUADS=1, SWIZZLE=1)):
        assert runtime.resource_problems(_build(tmp_path, dict(defines, **extra)), cap) == [], extra
        cubins.append((tmp_path / "k.cubin").read_bytes())
    assert len(set(cubins)) == len(cubins), d
    res = subprocess.run(runtime.nvcc_command(SOURCE, dict(defines, ROW_PAD=16), "sm_90a", str(tmp_path / "k.cubin")),
                         capture_output=True, text=True)
    assert res.returncode != 0 and "ROW_PAD" in res.stdout + res.stderr
    res = subprocess.run(runtime.nvcc_command(SOURCE, dict(defines, SWIZZLE=1, LOADER=1), "sm_90a",
                                              str(tmp_path / "k.cubin")), capture_output=True, text=True)
    assert res.returncode != 0 and "SWIZZLE" in res.stdout + res.stderr
    # chunk ^ (r & 7) stays inside the row only when the row is whole 128-byte groups (80, 96, 112 are not)
    res = subprocess.run(runtime.nvcc_command(SOURCE, dict(defines, SWIZZLE=1, HEAD_DIM=80), "sm_90a",
                                              str(tmp_path / "k.cubin")), capture_output=True, text=True)
    assert res.returncode != 0 and "HEAD_DIM % 64" in res.stdout + res.stderr
    res = subprocess.run(runtime.nvcc_command(SOURCE, dict(defines, COPY_QUADS=1, HEAD_DIM=80), "sm_90a",
                                              str(tmp_path / "k.cubin")), capture_output=True, text=True)
    assert res.returncode != 0 and "COPY_QUADS" in res.stdout + res.stderr


@pytest.mark.parametrize("d,w,streams", [(128, 4, 128), (64, 8, 48)])
def test_l2_hint_builds_within_the_planned_cap_and_leaves_the_default_alone(tmp_path, monkeypatch, d, w, streams):
    """L2_HINT (ptx.cuh's copy hint, a define GPU calls A/B, off by default): every value builds at the planner's
    launch within its register cap without local memory; the PTX of 0 (and of no define) has copies without a
    hint, 128 / 256 put exactly that hint on every 16-byte copy (a hint that compiled to nothing would A/B noise)."""
    from gaac_hf.kernels.cuda import attention as A

    monkeypatch.setattr(A, "_sm_count", lambda device: 132)
    p = A.plan(streams, 1, 4, 64, d, 65536 + 64, None, LaunchConfig(num_warps=w))
    defines = dict(p["defines"], MERGE_CHUNK=A.merge_chunk(4, p["splits"], d))
    cap = min(255, 65536 // (p["threads"] * defines["MIN_CTAS_PER_SM"]) // 8 * 8)
    for value in (None, 0, 128, 256):
        full = dict(defines, **({} if value is None else dict(L2_HINT=value)))
        assert runtime.resource_problems(_build(tmp_path, full), cap) == [], value
        cmd = [a for a in runtime.nvcc_command(SOURCE, full, "sm_90a", str(tmp_path / "k.ptx")) if a != "-cubin"]
        res = subprocess.run(cmd[:1] + ["-ptx"] + cmd[1:], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-2000:]
        copies = [ln for ln in (tmp_path / "k.ptx").read_text().splitlines() if "cp.async.cg.shared.global" in ln]
        assert copies, value
        want = f".L2::{value}B" if value else None
        assert all(("L2::" in ln) == bool(want) and (want is None or want in ln) for ln in copies), (value, copies[:2])


def test_planted_spill_is_caught(tmp_path):
    """8 CTAs per SM caps the d=128 kernel at 64 registers, so it spills: the check must report it."""
    defines = dict(HEAD_DIM=128, GROUP=4, PAGE=64, WARPS=4, STAGES=4, MIN_CTAS_PER_SM=8)
    report = _build(tmp_path, defines)
    problems = runtime.resource_problems(report, REGISTER_BUDGET)
    assert any("local memory" in p for p in problems), report
    assert runtime.resource_problems(report, 16) and any("budget" in p for p in runtime.resource_problems(report, 16))


def test_bad_parameters_fail_to_compile(tmp_path):
    out = tmp_path / "k.cubin"
    cmd = runtime.nvcc_command(SOURCE, dict(HEAD_DIM=72, GROUP=4, PAGE=64, WARPS=4, STAGES=2), "sm_90a", str(out))
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode != 0 and "multiple of 16" in res.stdout + res.stderr


def test_nvrtc_path_when_cuda_core_is_installed(tmp_path, monkeypatch):
    pytest.importorskip("cuda.core")
    monkeypatch.setenv("GAAC_CUDA_CACHE", str(tmp_path))
    defines = dict(HEAD_DIM=128, GROUP=4, PAGE=64, WARPS=4, STAGES=4)
    cubin, log, key = runtime.compile_cubin(SOURCE, defines, "sm_90a")
    assert cubin[:4] == b"\x7fELF"
    report = runtime.parse_ptxas(log)
    assert runtime.resource_problems(report, REGISTER_BUDGET) == []
    again, _, key2 = runtime.compile_cubin(SOURCE, defines, "sm_90a")  # from the disk cache
    assert again == cubin and key2 == key and len(list(tmp_path.glob("*.cubin"))) == 1
    _, _, key3 = runtime.compile_cubin(SOURCE, dict(defines, STAGES=3), "sm_90a")
    assert key3 != key


def test_launch_config_defaults_fit_shared_memory():
    from gaac_hf.kernels.cuda.attention import _smem_bytes

    for d in range(16, 257, 16):
        assert _smem_bytes(d, 4, _default_stages(d, 4)) <= 227 * 1024
    # 8 warps at d = 256 fit with one stage only (the twin of the v4 kernel's compact-slot launch); 16 do not fit
    p = plan(1, 1, 4, 64, 256, 4096, None, LaunchConfig(num_warps=8, num_splits=1))
    assert p["defines"]["STAGES"] == 1 and p["defines"]["LOADER"] == 0
    with pytest.raises(ValueError, match="shared memory"):
        plan(1, 1, 4, 64, 256, 4096, None, LaunchConfig(num_warps=16, num_splits=1))
    with pytest.raises(ValueError, match="cp.async"):
        plan(1, 1, 4, 64, 256, 4096, None, LaunchConfig(num_warps=8, num_splits=1, loader="bulk"))
    assert LaunchConfig().num_warps is None


def test_one_stage_ring_compiles_without_spills_and_needs_cp_async(tmp_path):
    """STAGES=1 (no copy overlaps compute): builds with the cp.async loader, within the cap, no local memory;
    the copy-engine loader refuses it at compile time. tests/test_v4_gpu.py checks its bits on the GPU (it is
    the BF16 twin of the v4 kernel's 8-warp compact-slot launch at d = 256)."""
    defines = dict(HEAD_DIM=256, GROUP=4, PAGE=64, WARPS=8, STAGES=1)
    assert runtime.resource_problems(_build(tmp_path, defines), REGISTER_BUDGET) == []
    res = subprocess.run(runtime.nvcc_command(SOURCE, dict(defines, LOADER=1), "sm_90a", str(tmp_path / "b.cubin")),
                         capture_output=True, text=True)
    assert res.returncode != 0 and "1 only with the cp.async loader" in res.stdout + res.stderr


# ---- the fused GAAC v3 kernel (decode_attention_v3.cu) ----
FUSED_CONFIGS = [(64, 3), (128, 4), (256, 4), (128, 16)]  # (head_dim, query heads per kv head): the tuned shapes + two n-tiles


def _assert_fused_builds_without_spills(tmp_path, p: dict) -> None:
    """nvcc sm_90a of the fused kernel at plan ``p``: builds, one kernel, within the register cap of the
    planned CTAs per SM, no spills or local memory."""
    from gaac_hf.kernels.cuda import fused_attention as F

    out = tmp_path / "k.cubin"
    res = subprocess.run(runtime.nvcc_command(F.SOURCE, p["defines"], "sm_90a", str(out)), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    report = runtime.parse_ptxas(res.stdout + res.stderr)
    assert set(report) == {"gaac_v3_decode_split"}
    assert runtime.resource_problems(report, 65536 // (p["threads"] * p["defines"]["MIN_CTAS_PER_SM"])) == []


@pytest.mark.parametrize("d,g", FUSED_CONFIGS)
def test_fused_kernel_compiles_without_spills(tmp_path, monkeypatch, d, g):
    """At the CTAs-per-SM the planner picks for a one-wave grid (that sets the register cap)."""
    from gaac_hf.kernels.cuda import attention as A
    from gaac_hf.kernels.cuda import fused_attention as F

    monkeypatch.setattr(A, "_sm_count", lambda device: 132)
    p = F.plan(8 if d < 256 else 1, 1, g, 64, d, 32768 + 64, None, LaunchConfig())
    _assert_fused_builds_without_spills(tmp_path, p)


@pytest.mark.parametrize("d,pseg,kinds", [(64, 1, 2), (128, 1, 2), (128, 2, 2), (256, 2, 2), (64, 1, 1), (128, 2, 1),
                                          (256, 2, 1)])
def test_fused_register_table_matches_ptxas(tmp_path, d, pseg, kinds):
    """The planner's table of registers the kernel needs: at the most CTAs per SM the table allows
    (the tightest register cap the planner can choose), ptxas must not spill."""
    from gaac_hf.kernels.cuda import fused_attention as F

    threads = F.threads_of(d, F.DEFAULT_WARPS, pseg, kinds)
    per_sm = max(p for p in (1, 2, 3, 4) if 65536 // (threads * p) >= F.regs_needed(d, 4, pseg, kinds))
    defines = dict(HEAD_DIM=d, QUERY_GROUP=4, PAGE=64, WARPS=F.DEFAULT_WARPS, PROD_SEGS=pseg,
                   KIND_SPLIT=int(kinds == 1), STAGES=F.default_stages(d, F.DEFAULT_WARPS, pseg, kinds),
                   MIN_CTAS_PER_SM=per_sm)
    out = tmp_path / "k.cubin"
    res = subprocess.run(runtime.nvcc_command(F.SOURCE, defines, "sm_90a", str(out)), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    report = runtime.parse_ptxas(res.stdout + res.stderr)
    assert runtime.resource_problems(report, 65536 // (threads * per_sm)) == [], (per_sm, report)


def test_fused_kernel_refuses_other_head_dims(tmp_path):
    from gaac_hf.kernels.cuda import fused_attention as F

    cmd = runtime.nvcc_command(F.SOURCE, dict(HEAD_DIM=80, QUERY_GROUP=4, PAGE=64, WARPS=2, DEC_STAGES=2), "sm_90a",
                               str(tmp_path / "k.cubin"))
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode != 0 and "64, 128 or 256" in res.stdout + res.stderr


def test_launch_arguments_must_be_contiguous():
    """A kernel reads only a tensor's data pointer: a strided view (a block-table column) is refused
    instead of being read as dense (it once decoded the wrong blocks into a cropped v3 tail)."""
    from gaac_hf.kernels.cuda import runtime

    t = torch.arange(12, dtype=torch.int64).view(3, 4)
    assert runtime._arg(t) == t.data_ptr() and runtime._arg(None) == 0
    with pytest.raises(ValueError, match="not contiguous"):
        runtime._arg(t[:, 1].reshape(-1))


@pytest.mark.parametrize("d,g", [(64, 3), (128, 4), (128, 8)])
def test_one_slot_k_ring_fits_four_ctas_without_spills(tmp_path, d, g):
    """decoded_k_slots=1 frees the shared memory for a 4th CTA per SM at d <= 128; its register cap
    (65536 / (192 * 4) = 85) must not make the kernel spill."""
    from gaac_hf.kernels.cuda import fused_attention as F

    defines = dict(HEAD_DIM=d, QUERY_GROUP=g, PAGE=64, WARPS=F.DEFAULT_WARPS, PROD_SEGS=F.segments_per_producer(d),
                   KIND_SPLIT=1, STAGES=2, DEC_K_STAGES=1, MIN_CTAS_PER_SM=4, ENTRY_CHUNKS=F.entry_chunks(d))
    threads = F.threads_of(d, F.DEFAULT_WARPS, None, 1)
    assert 4 * (F.cta_bytes(d, F.DEFAULT_WARPS, 2, None, 1, k_slots=1) + 1024) <= 228 * 1024
    out = tmp_path / "k.cubin"
    res = subprocess.run(runtime.nvcc_command(F.SOURCE, defines, "sm_90a", str(out)), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    report = runtime.parse_ptxas(res.stdout + res.stderr)
    assert runtime.resource_problems(report, 65536 // (threads * 4)) == [], report


def test_decoded_slots_planner_rules():
    """decoded_slots: 2 by default (K ring of one slot at d=128), 3 deepens both rings; others refused."""
    from gaac_hf.kernels.cuda import fused_attention as F

    base = F.plan(1, 8, 4, 64, 128, 65536 + 64, None, LaunchConfig(num_splits=8))["defines"]
    assert base["DEC_STAGES"] == 2 and base["DEC_K_STAGES"] == 1
    three = F.plan(1, 8, 4, 64, 128, 65536 + 64, None, LaunchConfig(num_splits=8, decoded_slots=3))["defines"]
    assert three["DEC_STAGES"] == three["DEC_K_STAGES"] == 3
    with pytest.raises(ValueError, match="decoded_slots must be"):
        F.plan(1, 8, 4, 64, 128, 4096, None, LaunchConfig(num_splits=8, decoded_slots=5))
    with pytest.raises(ValueError, match="decoded_k_slots"):
        F.plan(1, 8, 4, 64, 128, 4096, None, LaunchConfig(num_splits=8, decoded_slots=3, decoded_k_slots=2))


def test_merge_levels_rule():
    """Two merge levels only where the last CTA would read > 128 KiB of partials; the override wins; the
    counters cover one final and one per chunk for every (sequence, kv head)."""
    from gaac_hf.kernels.cuda import attention as A

    assert A.merge_chunk(4, 128, 256) == A.MERGE_TREE_CHUNK  # Gemma3, one kv head: 512 KiB
    assert A.merge_chunk(3, 86, 64) == 0                     # SmolLM2: 64.5 KiB
    assert A.merge_chunk(4, 16, 128) == 0                    # Qwen3 B=1
    assert A.merge_chunk(4, 128, 256, override=0) == 0
    assert A.merge_chunk(4, 11, 64, override=4) == 4
    assert A.merge_chunk(4, 4, 64, override=4) == 0          # one chunk would hold every split
    with pytest.raises(ValueError, match="merge_chunk"):
        A.merge_chunk(4, 11, 64, override=1)
    assert A.merge_counters(2, 3, 11, 4) == 2 * 3 * (1 + 3)
    assert A.merge_counters(2, 3, 11, 0) == 6
