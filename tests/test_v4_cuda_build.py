"""CPU checks of the fused v4 CUDA kernel (``kernels/cuda/decode_attention_v4.cu``): every launch the planner
can choose compiles for sm_90a with no local memory and within its register cap; a planted spill fails the
check; the static instruction count of a warp-tile stays under the budget the H200 timings were made at;
the NVRTC path builds the same source where ``cuda.core`` is installed. No GPU needed (CI has nvcc/ptxas)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gaac_hf.kernels import LaunchConfig
from gaac_hf.kernels.cuda import fused_attention_v4 as F4
from gaac_hf.kernels.cuda import runtime

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH (the CUDA toolkit's compiler)")


def _build(tmp_path, defines):
    out = tmp_path / "k.cubin"
    res = subprocess.run(runtime.nvcc_command(F4.SOURCE, defines, "sm_90a", str(out)), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return runtime.parse_ptxas(res.stdout + res.stderr)


def _cap(defines) -> int:
    """The register cap ptxas works under: 64K registers / (threads x resident CTAs), at most 255."""
    return min(255, 65536 // (32 * defines["WARPS"] * defines["MIN_CTAS_PER_SM"]) // 8 * 8)


# (head_dim, GQA group, batch x kv heads): the tuned shapes and the edges of the group range
PLANS = [(128, 4, 8), (128, 4, 64), (128, 1, 8), (128, 16, 8), (128, 8, 32), (64, 3, 3), (64, 3, 48), (64, 16, 2),
         (64, 1, 8), (256, 4, 1), (256, 8, 16), (256, 1, 4)]


@pytest.mark.parametrize("d,g,streams", PLANS)
def test_planned_launch_compiles_without_spills(tmp_path, monkeypatch, d, g, streams):
    """Whatever the planner picks (warps, stages, CTAs per SM: the register cap), the kernel must not spill."""
    from gaac_hf.kernels.cuda import attention as A

    monkeypatch.setattr(A, "_sm_count", lambda device: 132)
    monkeypatch.setattr(F4, "_sm_count", lambda device: 132)
    p = F4.plan(streams, 1, g, 64, d, 65536 + 64, None, LaunchConfig())
    # the split merge as prepare_launch sets it (two levels where one CTA would read > 128 KiB: d = 256, 1 stream)
    report = _build(tmp_path, dict(p["defines"], MERGE_CHUNK=A.merge_chunk(g, p["splits"], d)))
    assert set(report) == {"gaac_v4_decode_split", "gaac_v4_decode_blocks"}
    assert runtime.resource_problems(report, _cap(p["defines"])) == []


# launches that fit only with compact slots (COMPACT_SLOTS: a compressed tile per slot; tests/test_v4_gpu.py runs them)
COMPACT_PLANS = [(256, 4, dict(num_warps=8)), (256, 8, dict(num_warps=8)), (256, 4, dict(num_warps=4, ctas_per_sm=2)),
                 (128, 4, dict(num_warps=8, num_stages=4)), (64, 3, dict(num_warps=8, num_stages=8, ctas_per_sm=1))]


@pytest.mark.parametrize("d,g,kw", COMPACT_PLANS)
def test_compact_slot_launches_compile_without_spills(tmp_path, monkeypatch, d, g, kw):
    from gaac_hf.kernels.cuda import attention as A

    monkeypatch.setattr(F4, "_sm_count", lambda device: 132)
    p = F4.plan(1, 1, g, 64, d, 16384 + 64, None, LaunchConfig(**kw))
    assert p["defines"]["COMPACT_SLOTS"] == 1
    assert p["smem"] == max(F4.smem_bytes(d, kw["num_warps"], kw.get("num_stages", 2), compact=True),
                            A.merge_smem_bytes(g, p["splits"]), 4 * (2 * kw["num_warps"] * 8 + kw["num_warps"] * 8 * d))
    report = _build(tmp_path, dict(p["defines"], MERGE_CHUNK=A.merge_chunk(g, p["splits"], d)))
    assert runtime.resource_problems(report, _cap(p["defines"])) == []


def test_full_slots_build_the_same_kernel_as_before_compact_slots(tmp_path):
    """COMPACT_SLOTS=0 (every default launch) compiles to the same SASS with or without the define spelled out."""
    base = dict(HEAD_DIM=256, QUERY_GROUP=4, PAGE=64, WARPS=4, STAGES=2, MIN_CTAS_PER_SM=1, CONST_REGS=1)
    cubins = []
    for extra in ({}, dict(COMPACT_SLOTS=0), dict(COMPACT_SLOTS=1)):
        out = tmp_path / f"k{len(cubins)}.cubin"
        res = subprocess.run(runtime.nvcc_command(F4.SOURCE, base | extra, "sm_90a", str(out)), capture_output=True,
                             text=True)
        assert res.returncode == 0, res.stderr[-2000:]
        cubins.append(out.read_bytes())
    assert cubins[0] == cubins[1] and cubins[0] != cubins[2]


@pytest.mark.parametrize("warps,ctas", [(4, 4), (8, 2), (2, 8)])
def test_sixteen_warps_per_sm_fit_128_registers(tmp_path, warps, ctas):
    """The launches call R4 measured at 16 warps per SM (the fastest at d = 64 and for many streams at d = 128)."""
    for d in (64, 128):
        defines = dict(HEAD_DIM=d, QUERY_GROUP=4, PAGE=64, WARPS=warps, STAGES=2, MIN_CTAS_PER_SM=ctas)
        assert runtime.resource_problems(_build(tmp_path, defines), 128) == [], (d, warps, ctas)


@pytest.mark.parametrize("name", ["SPEC_TABLE", "ARRIVE_RELEASE", "MERGE_BATCH", "EARLY_LOADS"])
def test_lab_defines_build_without_spills_and_change_the_kernel(tmp_path, name):
    """The kernel defines that GPU calls A/B (ARRIVE_RELEASE on by default since call Y14, SPEC_TABLE and EARLY_LOADS
    since call Y19, MERGE_BATCH chosen by head_dim by the planner since call Y21; its values 1 and 2 both built) build at the planned d = 128 and d = 256 launches
    within their register caps every way, and each value changes the cubin (a define that compiled to nothing would
    A/B noise)."""
    for d, w in ((128, 8), (256, 4)):
        defines = dict(HEAD_DIM=d, QUERY_GROUP=4, PAGE=64, WARPS=w, STAGES=2, MIN_CTAS_PER_SM=1, CONST_REGS=1,
                       MERGE_CHUNK=16)
        cubins = []
        for value in ((0, 1, 2) if name == "MERGE_BATCH" else (0, 1)):
            assert runtime.resource_problems(_build(tmp_path, dict(defines, **{name: value})), _cap(defines)) == []
            cubins.append((tmp_path / "k.cubin").read_bytes())
        assert len(set(cubins)) == len(cubins), (name, d)


def test_planted_spill_is_caught(tmp_path):
    """4 CTAs of 8 warps per SM cap the kernel at 64 registers: it spills, and the check must say so."""
    defines = dict(HEAD_DIM=128, QUERY_GROUP=4, PAGE=64, WARPS=8, STAGES=2, MIN_CTAS_PER_SM=4)
    problems = runtime.resource_problems(_build(tmp_path, defines), 255)
    assert any("local memory" in p for p in problems), problems


def test_bad_parameters_fail_to_compile(tmp_path):
    for bad, text in ((dict(HEAD_DIM=96), "head_dim 64, 128, 192 or 256"), (dict(PAGE=24), "multiple of 16"),
                      (dict(STAGES=1), "STAGES")):
        defines = dict(HEAD_DIM=128, QUERY_GROUP=4, PAGE=64, WARPS=8, STAGES=2) | bad
        res = subprocess.run(runtime.nvcc_command(F4.SOURCE, defines, "sm_90a", str(tmp_path / "k.cubin")),
                             capture_output=True, text=True)
        assert res.returncode != 0 and text in res.stdout + res.stderr, (bad, res.stderr[-500:])


def test_planner_rules(monkeypatch):
    monkeypatch.setattr(F4, "_sm_count", lambda device: 132)
    p = F4.plan(1, 8, 4, 64, 128, 65536 + 64, None, LaunchConfig())
    assert p["defines"]["WARPS"] == 8 and p["defines"]["MIN_CTAS_PER_SM"] == 1
    assert p["splits"] == 16 and p["tokens_per_split"] % 128 == 0  # 8 kv heads x 16 splits = 128 CTAs <= 132
    p = F4.plan(1, 3, 3, 64, 64, 65536 + 64, None, LaunchConfig())
    assert p["defines"]["MIN_CTAS_PER_SM"] == 2 and p["splits"] == 86  # 264 slots / 3 streams = 88, whole tiles per split
    p = F4.plan(16, 8, 4, 64, 128, 32768 + 64, None, LaunchConfig())
    assert p["splits"] == 1  # 128 streams already fill the wave
    p = F4.plan(1, 8, 4, 64, 128, 1000, None, LaunchConfig())
    assert p["splits"] == 8 and p["tokens_per_split"] == 128  # one pipeline step (128 tokens) per split at least
    p = F4.plan(1, 3, 3, 64, 64, 4096 + 64, None, LaunchConfig())
    assert p["splits"] == 33 and p["tokens_per_split"] == 128  # SmolLM2 4K + tail block: rounding up gave 17 of 256
    p = F4.plan(1, 3, 3, 64, 64, 4096 + 64, None, LaunchConfig(num_splits=32))
    assert p["splits"] <= 32  # an asked count is a ceiling
    for d in (64, 128, 256):  # the defaults keep full slots (no second copy on BF16 tiles)
        assert F4.plan(1, 1, 4, 64, d, 65536 + 64, None, LaunchConfig())["defines"]["COMPACT_SLOTS"] == 0
    for d, batch in ((64, 0), (80, 0), (112, 0), (128, 2), (256, 2)):  # merge load runs where calls Y20 / Y21 gained
        assert F4.plan(1, 1, 4, 64, d, 16384 + 64, None, LaunchConfig())["defines"]["MERGE_BATCH"] == batch, d
    p = F4.plan(1, 1, 4, 64, 256, 16384 + 64, None, LaunchConfig(num_warps=8))  # 270 KB of full slots: compact
    assert p["defines"]["COMPACT_SLOTS"] == 1 and p["smem"] == 8192 + 8 * 2 * 2 * (24 * 256 + 32)
    with pytest.raises(ValueError, match="even with compact slots"):
        F4.plan(1, 1, 4, 64, 256, 4096, None, LaunchConfig(num_warps=8, num_stages=3))
    with pytest.raises(ValueError, match="num_stages"):
        F4.plan(1, 8, 4, 64, 128, 4096, None, LaunchConfig(num_stages=1))
    with pytest.raises(ValueError, match="shared memory"):
        F4.plan(1, 8, 4, 64, 128, 4096, None, LaunchConfig(num_warps=16, num_stages=4))
    with pytest.raises(ValueError, match="do not fit one SM"):
        F4.plan(1, 8, 4, 64, 128, 4096, None, LaunchConfig(ctas_per_sm=4))
    with pytest.raises(ValueError, match="bulk"):
        F4.plan(1, 8, 4, 64, 128, 4096, None, LaunchConfig(loader="cp.async"))


#: instructions per warp-tile (16 tokens of K and V, 4 query heads) in the loop body, at the commit session 19's
#: calls T5 / T7 timed (the table window: d = 128 492 fast / 679 raw, d = 64 318 / 434; call R4's kernel had 556 /
#: ~750 at d = 128) plus ~4%: a layout or code change that adds ALU work fails here
SASS_BUDGET = {(128, False): 510, (128, True): 705, (64, False): 330, (64, True): 450,
               # d = 256 (session 27: 839 / 1,173): its two bodies together (32 KB) are what call Y8 found the kernel
               # instruction-fetch bound on, so they must not grow either
               (256, False): 875, (256, True): 1220}


@pytest.mark.parametrize("d,raw", sorted(SASS_BUDGET))
def test_warp_tile_instruction_budget(tmp_path, d, raw):
    sys.path.insert(0, str(REPO / "eval"))
    import sass_v4

    try:
        row = sass_v4.measure(d, raw, str(tmp_path))
    except FileNotFoundError as e:  # cuobjdump neither in Triton's wheel nor on PATH
        pytest.skip(f"cuobjdump not found: {e}")
    assert row["hmma"] > 0
    assert row["instructions"] <= SASS_BUDGET[(d, raw)], row
    assert row["registers"] <= (128 if d <= 128 else 255), row  # d = 256 runs 4 warps x 1 CTA per SM


def _merge_load_runs(sass: str) -> list[int]:
    """Lengths of the runs of the split merge's partial loads (``LDG.E.128.STRONG.GPU``, the merge's ``__ldcg``
    float4 loads: nothing else in the kernel issues them) with no FFMA between two loads of a run."""
    runs, cur = [], 0
    for line in sass.splitlines():
        if "LDG.E.128.STRONG.GPU" in line:
            cur += 1
        elif "FFMA" in line and cur:
            runs.append(cur)
            cur = 0
    return runs + ([cur] if cur else [])


@pytest.mark.parametrize("d,warps,ctas", [(256, 4, 1), (64, 8, 2)])
def test_merge_batch_issues_the_partials_loads_in_runs_of_16(tmp_path, d, warps, ctas):
    """MERGE_BATCH=1 (attend.cuh merge_splits): every partial load of the split merge sits in a run of 16 issued
    before their FMAs (one L2 round trip per 16 splits). The build without it must fail the same check: its
    `#pragma unroll 16` remainder issues one load per FMA group (one round trip per split), which is what it fixes.
    MERGE_BATCH=2: at each merge, runs of exactly 16, 8, 4, 2 and 1 loads (the remainder without unused loads)."""
    sys.path.insert(0, str(REPO / "eval"))
    from sass_decoder import tool

    defines = dict(HEAD_DIM=d, QUERY_GROUP=4, PAGE=64, WARPS=warps, STAGES=2, MIN_CTAS_PER_SM=ctas,
                   CONST_REGS=int(F4.const_regs_fit(d, warps, ctas)), MERGE_CHUNK=16)
    runs = {}
    for value in (0, 1, 2):
        assert runtime.resource_problems(_build(tmp_path, dict(defines, MERGE_BATCH=value)), _cap(defines)) == []
        try:
            sass = subprocess.run([tool("cuobjdump"), "-sass", str(tmp_path / "k.cubin")], capture_output=True,
                                  text=True, check=True).stdout
        except FileNotFoundError as e:
            pytest.skip(f"cuobjdump not found: {e}")
        runs[value] = _merge_load_runs(sass)
    assert runs[1] and all(r >= 16 for r in runs[1]), runs[1]
    assert any(r < 16 for r in runs[0]), runs[0]
    assert runs[2] and len(runs[2]) % 5 == 0 and runs[2] == [16, 8, 4, 2, 1] * (len(runs[2]) // 5), runs[2]


def test_nvrtc_path_when_cuda_core_is_installed(tmp_path, monkeypatch):
    pytest.importorskip("cuda.core")
    monkeypatch.setenv("GAAC_CUDA_CACHE", str(tmp_path))
    defines = dict(HEAD_DIM=128, QUERY_GROUP=4, PAGE=64, WARPS=8, STAGES=2, MIN_CTAS_PER_SM=1)
    try:
        cubin, _, log = runtime.compile_cubin(F4.SOURCE, defines, "sm_90a")
    except Exception as e:  # noqa: BLE001
        if "nvrtc" in str(e).lower() and "load" in str(e).lower():
            pytest.skip(f"NVRTC not loadable here: {e}")
        raise
    assert cubin[:4] == b"\x7fELF"


def test_pack_paged_v4_decodes_to_its_input(monkeypatch):
    """The benchmarks' and GPU tests' packer (CPU here): every table entry decodes to its block, tails hold the
    rest, the guard is intact, chunked encoding places blocks as one call would."""
    import torch

    from gaac_hf.calibration.synthetic import calibrate, synthetic_kv
    from gaac_hf.codec.v4 import decode_pool_v4

    monkeypatch.setattr(F4, "PACK_CHUNK", 5)  # several chunks
    B, H, D, T, lens = 2, 2, 64, 16, [200, 37]
    k = synthetic_kv((B, H, 200, D), "k", 1)
    v = synthetic_kv((B, H, 200, D), "v", 2)
    k[0, 1, 16:32] = float("nan")  # a block stored as BF16
    bases = torch.stack([calibrate(k)[1], calibrate(v)[1]])
    kv = F4.pack_paged_v4(k, v, lens, T, bases, generator=torch.Generator().manual_seed(0))
    assert kv.format_version == 4 and int(kv.k.table[0, 1, 1]) & 1 == 1
    for p, x in ((kv.k, k), (kv.v, v)):
        assert bool((p.pool[-256:] == 0xA5).all())
        for b in range(B):
            nb = lens[b] // T
            e = p.table[b, :, :nb].reshape(-1)
            heads = torch.arange(H).repeat_interleave(nb)
            got = decode_pool_v4(p.pool, e, p.base16[heads], kv.geometry, p.kind)
            want = x[b, :, : nb * T].reshape(H * nb, T, D)
            assert torch.equal(got.view(torch.int16), want.view(torch.int16))
            r = lens[b] - nb * T
            assert torch.equal(p.tail[b, :, :r].view(torch.int16), x[b, :, nb * T: lens[b]].view(torch.int16))


def test_stamps_build_compiles_and_leaves_the_product_cubin_alone(tmp_path, monkeypatch):
    """GAAC_STAMPS=1 (gaac/stamps.cuh: per-CTA phase timestamps for lab/experiments/v4_stamps.py) must build for the
    planners' d = 256 launches of the fused kernel and of the BF16 twin, and GAAC_STAMPS=0 must build exactly the
    product cubins (the stamps compile away)."""
    from gaac_hf.kernels.cuda import attention as A

    monkeypatch.setattr(A, "_sm_count", lambda device: 132)
    monkeypatch.setattr(F4, "_sm_count", lambda device: 132)
    for source, planner in ((F4.SOURCE, F4.plan), (A.SOURCE, A.plan)):  # the fused kernel and its BF16 twin
        p = planner(1, 1, 4, 64, 256, 16384 + 64, None, LaunchConfig())
        defines = dict(p["defines"], MERGE_CHUNK=A.merge_chunk(4, p["splits"], 256))
        cubins = {}
        for name, extra in (("product", {}), ("off", dict(GAAC_STAMPS=0)), ("on", dict(GAAC_STAMPS=1))):
            out = tmp_path / f"{name}.cubin"
            res = subprocess.run(runtime.nvcc_command(source, dict(defines, **extra), "sm_90a", str(out)),
                                 capture_output=True, text=True)
            assert res.returncode == 0, res.stderr[-3000:]
            cubins[name] = out.read_bytes()
            report = runtime.parse_ptxas(res.stdout + res.stderr)
            if name == "on":  # printf's arguments take a stack frame: the only local memory allowed, no spills
                assert all(r.get("spill_stores", 0) == 0 and r.get("spill_loads", 0) == 0 for r in report.values())
            else:
                assert runtime.resource_problems(report, _cap(defines)) == [], (source, report)
        assert cubins["off"] == cubins["product"], source
        assert cubins["on"] != cubins["product"] and b"GAAC_STAMP" in cubins["on"], source
