"""Programmatic dependent launch of the decode step's own kernels (lab switch ``GAAC_PDL=1``, off by default):
``include/gaac/ptx.cuh``'s ``pdl_wait`` / ``pdl_launch_dependents``, ``runtime.launch`` with programmatic stream
serialization for a module built with ``GAAC_PDL=1``, the v4 attention kernel and the tail append.

CPU: with ``GAAC_PDL=0`` every planned v4 launch and the tail append build exactly the product cubins; with
``GAAC_PDL=1`` they build within their register caps, without spills, and their PTX waits (``griddepcontrol.wait``);
the switch reaches the planner's defines; a source that never waits cannot be built for it.
GPU (marker ``gpu``): a chain of steps where each tail append is followed at once by the attention that reads
the row it wrote (and attention by attention), eager and replayed from a CUDA graph: the outputs with
``GAAC_PDL=1`` are bit-identical to those without (an attention that read before its predecessor finished would
see the previous step's tail and differ)."""
from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from gaac_hf.kernels import LaunchConfig
from gaac_hf.kernels.cuda import attention as A
from gaac_hf.kernels.cuda import fused_attention_v4 as F4
from gaac_hf.kernels.cuda import runtime, tail

NVCC = shutil.which("nvcc")


def _nvcc(source, defines, out, ptx=False):
    cmd = runtime.nvcc_command(source, defines, "sm_90a", str(out))
    if ptx:
        cmd = ["nvcc", "-ptx", *cmd[2:]]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return runtime.parse_ptxas(res.stdout + res.stderr)


def _planned(monkeypatch, d):
    monkeypatch.setattr(F4, "_sm_count", lambda device: 132)
    p = F4.plan(1, 8, 4, 64, d, 65536 + 64, None, LaunchConfig())
    return dict(p["defines"], MERGE_CHUNK=A.merge_chunk(4, p["splits"], d))


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("source,d", [(F4.SOURCE, 64), (F4.SOURCE, 128), (F4.SOURCE, 256), (tail.SOURCE, None)])
def test_pdl_builds_wait_and_leave_the_product_cubins_alone(tmp_path, monkeypatch, source, d):
    monkeypatch.delenv("GAAC_PDL", raising=False)
    defines = _planned(monkeypatch, d) if d else {}
    cubins = {}
    for name, extra in (("product", {}), ("off", {"GAAC_PDL": 0}), ("on", {"GAAC_PDL": 1})):
        report = _nvcc(source, dict(defines, **extra), tmp_path / f"{name}.cubin")
        cap = min(255, 65536 // (32 * defines["WARPS"] * defines["MIN_CTAS_PER_SM"]) // 8 * 8) if d else 255
        assert runtime.resource_problems(report, cap) == [], (name, report)
        cubins[name] = (tmp_path / f"{name}.cubin").read_bytes()
    assert cubins["off"] == cubins["product"]
    assert cubins["on"] != cubins["product"]
    _nvcc(source, dict(defines, GAAC_PDL=1), tmp_path / "on.ptx", ptx=True)
    ptx = (tmp_path / "on.ptx").read_text()
    # every kernel of the source waits (runtime.launch launches all of a PDL module's kernels early)
    assert ptx.count("griddepcontrol.wait") >= ptx.count(".entry"), source
    if source == tail.SOURCE:
        assert "griddepcontrol.launch_dependents" in ptx


def test_switch_reaches_the_planner_and_a_source_without_the_wait_is_refused(monkeypatch):
    monkeypatch.setattr(F4, "_sm_count", lambda device: 132)
    monkeypatch.delenv("GAAC_PDL", raising=False)
    assert not runtime.pdl_requested()
    assert "GAAC_PDL" not in F4.plan(1, 8, 4, 64, 128, 4096, None, LaunchConfig())["defines"]
    monkeypatch.setenv("GAAC_PDL", "1")
    assert runtime.pdl_requested()
    assert F4.plan(1, 8, 4, 64, 128, 4096, None, LaunchConfig())["defines"]["GAAC_PDL"] == 1
    assert runtime._pdl_define(F4.SOURCE, {"GAAC_PDL": 1}) and runtime._pdl_define(tail.SOURCE, {"GAAC_PDL": 1})
    assert not runtime._pdl_define(F4.SOURCE, {}) and not runtime._pdl_define(F4.SOURCE, {"GAAC_PDL": 0})
    # the BF16 twin has no pdl_wait: launched early it could read a tail before the append wrote it
    with pytest.raises(ValueError, match="pdl_wait"):
        runtime.load(A.SOURCE, {"GAAC_PDL": 1}, torch.device("cpu"))


# ---- GPU -------------------------------------------------------------------------------------------------
def _chain(steps: int, graph: bool) -> list[torch.Tensor]:
    """``steps`` decode steps on one v4 cache: each appends a new K/V row to the tails (tail kernel), attends
    with the attention kernel right after it, then attends again (attention after attention); the next query is
    built from the output. Returns every output."""
    from gaac_hf.calibration.synthetic import calibrate, synthetic_kv

    dev = torch.device("cuda")
    B, HQ, HKV, D, T, S = 2, 32, 8, 128, 64, 64 * 40 + 3
    k = synthetic_kv((B, HKV, S + steps, D), "k", 5).to(dev)
    v = synthetic_kv((B, HKV, S + steps, D), "v", 6).to(dev)
    bases16 = torch.stack([calibrate(k.cpu())[1], calibrate(v.cpu())[1]]).to(dev)
    kv = F4.pack_paged_v4(k[:, :, :S], v[:, :, :S], [S, S], T, bases16)
    q = torch.randn(B, HQ, D, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16).to(dev)
    pos = torch.full((1,), S % T - 1, dtype=torch.int64, device=dev)
    new_k, new_v = torch.empty_like(k[:, :, :1]), torch.empty_like(v[:, :, :1])
    step_i = torch.zeros((), dtype=torch.int64, device=dev)
    out1, out2 = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    outs = []

    def step():
        pos.add_(1)
        kv.tail_len.add_(1)
        new_k.copy_(k.index_select(2, S + step_i.view(1)))
        new_v.copy_(v.index_select(2, S + step_i.view(1)))
        step_i.add_(1)
        tail.tail_append(new_k, new_v, kv.k.tail, kv.v.tail, pos)  # then at once the attention that reads it
        F4.gaac_decode_attention_v4(q, kv, out=out1)
        F4.gaac_decode_attention_v4(out1, kv, out=out2)  # attention after attention
        q.copy_(out2)

    if not graph:
        for _ in range(steps):
            step()
            outs += [out1.clone(), out2.clone()]
        torch.cuda.synchronize()
        return outs
    first = (pos.clone(), kv.tail_len.clone(), step_i.clone(), q.clone())
    step()  # compile and load outside the capture, then undo what it advanced
    pos.copy_(first[0]), kv.tail_len.copy_(first[1]), step_i.copy_(first[2]), q.copy_(first[3])
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    pos.copy_(first[0]), kv.tail_len.copy_(first[1]), step_i.copy_(first[2]), q.copy_(first[3])
    for _ in range(steps):
        g.replay()
        outs += [out1.clone(), out2.clone()]
    torch.cuda.synchronize()
    return outs


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_gpu_pdl_chain_is_bit_identical(monkeypatch, graph):
    reason = runtime.why_unavailable() if torch.cuda.is_available() else "no CUDA device"
    if reason is not None:
        pytest.skip(f"CUDA C++ path unavailable: {reason}")
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the v4 kernel is built for Hopper (sm_90a)")
    monkeypatch.delenv("GAAC_PDL", raising=False)
    plain = _chain(20, graph)
    monkeypatch.setenv("GAAC_PDL", "1")
    mod = runtime.load(tail.SOURCE, {"GAAC_PDL": 1}, torch.device("cuda"))
    assert mod.pdl
    early = _chain(20, graph)
    assert len(plain) == len(early) == 40
    for i, (a, b) in enumerate(zip(plain, early)):
        assert not torch.isnan(a).any(), i
        assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"output {i} differs with GAAC_PDL=1"
    assert not torch.equal(plain[0].view(torch.int16), plain[2].view(torch.int16))  # the steps do change the tails
