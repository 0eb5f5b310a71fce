"""The one-launch tail append of graph-mode decode steps (kernels/cuda/tail_append.cu, kernels/cuda/tail.py).

CPU: the kernel compiles for sm_90a without local memory; the launcher's arguments, read the way the kernel
reads them (a NumPy model of its loop over raw addresses), write exactly what two ``index_copy_`` calls write,
for strided sources (views of a stacked q/k/v projection) at the first, a middle and the last tail position;
a GAACCache whose eager and graph-mode decode steps append through that launch gives the logits and bytes of
one that copies (a random tiny model, and real SmolLM2 K/V on WikiText-2).
GPU (marker ``gpu``): the kernel itself against ``index_copy_``, tails poisoned with NaN first (every other
position must keep its poison bits), and a captured graph replayed at advancing positions.
"""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import torch

from gaac_hf.kernels.cuda import runtime, tail

NVCC = shutil.which("nvcc")
SHAPES = [(1, 8, 64, 128), (3, 2, 64, 64), (2, 4, 32, 80), (2, 3, 16, 256)]  # B, H, T, D


def _sources(b, h, d, device, seed=0):
    """K and V as the fused model hands them: views of one [B, 1, (Hq + 2H) * D] projection, transposed to
    [B, H, 1, D] (batch stride (Hq + 2H) * D, head stride D); random bf16 bit patterns, NaN / Inf included."""
    g = torch.Generator().manual_seed(seed)
    hq = 2 * h
    bits = torch.randint(-32768, 32768, (b, 1, (hq + 2 * h) * d), generator=g, dtype=torch.int32).to(torch.int16)
    # every row starts with the special patterns, whatever the draw: +-0, +-Inf, NaNs (quiet, signalling-style,
    # negative, with payload), the smallest / largest subnormals, the smallest / largest normals
    specials = torch.tensor([0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFC1, 0x7FFF, 0x0001, 0x807F,
                             0x0080, 0x7F7F, 0xFF7F, 0x8001, 0x007F, 0x3F80], dtype=torch.int32).to(torch.int16)
    rows = bits.view(b, 1, hq + 2 * h, d)
    rows[..., : min(d, len(specials))] = specials[:d]
    qkv = bits.view(torch.bfloat16).to(device)
    k = qkv[..., hq * d:(hq + h) * d].view(b, 1, h, d).transpose(1, 2)
    v = qkv[..., (hq + h) * d:].view(b, 1, h, d).transpose(1, 2)
    return k, v


def _poisoned(b, h, t, d, device):
    return [torch.full((b, h, t, d), float("nan"), dtype=torch.bfloat16, device=device) for _ in range(2)]


def _bits(x):
    return x.contiguous().view(torch.int16)


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
def test_kernel_compiles_without_local_memory(tmp_path):
    out = tmp_path / "t.cubin"
    res = subprocess.run(runtime.nvcc_command(tail.SOURCE, {}, "sm_90a", str(out)), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    report = runtime.parse_ptxas(res.stdout + res.stderr)
    assert set(report) == {"gaac_tail_append"}
    assert runtime.resource_problems(report, 64) == []


def _emulate(captured, tensors):
    """The kernel's loop (tail_append.cu) over the launch's arguments, on CPU tensors addressed by raw pointer."""
    (grid,), (threads,), args = captured
    k_src, v_src, k_sb, k_sh, v_sb, v_sh, k_tail, v_tail, heads, t, vecs, pos = args

    def vec_view(ptr):  # the 16-byte vectors from address ptr on, within the tensor that holds it
        for x in tensors:
            base = x.untyped_storage().data_ptr()
            if base <= int(ptr) < base + x.untyped_storage().nbytes():
                raw = torch.empty(0, dtype=torch.uint8).set_(x.untyped_storage()).numpy()[int(ptr) - base:]
                return raw[: len(raw) // 16 * 16].view(np.uint64).reshape(-1, 2)
        raise AssertionError(f"address {ptr:#x} is in no tensor")

    p = int(pos.item())
    assert 0 <= p < t
    for row in range(grid):
        b, h = divmod(row, int(heads))
        for i in range(2 * int(vecs)):
            is_v = i >= vecs
            j = i - vecs if is_v else i
            start = b * v_sb + h * v_sh if is_v else b * k_sb + h * k_sh
            src = vec_view(v_src if is_v else k_src)[start:]
            dst = vec_view((v_tail if is_v else k_tail).data_ptr())
            dst[(row * int(t) + p) * int(vecs) + j] = src[j]
    assert threads >= 32 and threads % 32 == 0


@pytest.mark.parametrize("b,h,t,d", SHAPES)
def test_launch_arguments_write_what_index_copy_writes(monkeypatch, b, h, t, d):
    k, v = _sources(b, h, d, "cpu", seed=b * d)
    captured = []
    monkeypatch.setattr(runtime, "load", lambda *a, **kw: None)
    monkeypatch.setattr(runtime, "launch", lambda mod, name, grid, block, smem, *args, device: captured.append(
        (grid, block, args)))
    for p in (0, t // 2 + 1, t - 1):
        got, want = _poisoned(b, h, t, d, "cpu"), _poisoned(b, h, t, d, "cpu")
        pos = torch.tensor([p])
        tail.tail_append(k, v, got[0], got[1], pos)
        _emulate(captured.pop(), [k, got[0], got[1]])
        want[0].index_copy_(2, pos, k)
        want[1].index_copy_(2, pos, v)
        for g, w in zip(got, want):
            assert torch.equal(_bits(g), _bits(w)), (b, h, t, d, p)


def test_takes_refuses_what_the_kernel_cannot_read():
    k, v = _sources(2, 4, 128, "cpu")
    kt, vt = _poisoned(2, 4, 64, 128, "cpu")
    assert not tail.takes(k, v, kt, vt)  # a CPU tensor: index_copy_ there
    with pytest.raises(ValueError, match="pos must be int64"):
        tail.tail_append(k, v, kt, vt, torch.tensor([3], dtype=torch.int32))


@pytest.fixture
def launch_emulated(monkeypatch):
    """tail.tail_append runs its launcher for real; the launch itself runs the NumPy model of the kernel (CPU).
    Yields the list of launches made."""
    from gaac_hf.cache import graphs, layer

    captured, launches = [], []
    real = tail.tail_append
    monkeypatch.setattr(runtime, "load", lambda *a, **kw: None)
    monkeypatch.setattr(runtime, "launch", lambda mod, name, grid, block, smem, *args, device: captured.append(
        (grid, block, args)))

    def appended(k, v, k_tail, v_tail, pos):
        real(k, v, k_tail, v_tail, pos)
        _emulate(captured.pop(), [k, v, k_tail, v_tail])
        launches.append(int(pos.item()))

    monkeypatch.setattr(tail, "tail_append", appended)
    for mod in (layer, graphs):  # the cache asks whether the kernel applies (on the CPU it never would)
        monkeypatch.setattr(mod, "_tail_kernel", lambda k, v, tails: True)
    yield launches


def test_cache_decode_steps_through_the_launch_equal_copies(launch_emulated, monkeypatch):
    """A GAACCache's eager decode steps, then graph-mode steps, with the tail written by the launch (as on CUDA):
    logits bit for bit those of a cache that copies, and the same pool bytes, tables and tails."""
    from test_cache import same_bits
    from test_cuda_graphs import _prefilled, _same_bytes, _state, tiny_model

    from gaac_hf.cache import pool_v3
    from gaac_hf.integrations.cuda_graphs import DecodeGraphs
    from gaac_hf.models import cache_kwargs

    monkeypatch.setattr(pool_v3, "CPU_SYNC_FREE", True)  # graph mode on the CPU needs device-offset pools
    model, table = tiny_model()
    steps = 40  # 37 + 40 tokens, blocks of 16: eager steps 0-19 (step 10 closes a block), graph-mode 20-39 (26 closes)
    with monkeypatch.context() as m:  # the reference: copies
        from gaac_hf.cache import graphs, layer
        for mod in (layer, graphs):
            m.setattr(mod, "_tail_kernel", lambda k, v, tails: False)
        ref_cache, tok = _prefilled(model, table)
        feed, ref = [tok], []
        with torch.no_grad():
            for i in range(steps):
                logits = model(feed[-1], **cache_kwargs(model, ref_cache), position_ids=torch.full((2, 1), 37 + i)).logits
                ref.append(logits)
                feed.append(logits[:, -1:].argmax(-1))
        assert not launch_emulated
    cache, _ = _prefilled(model, table)
    with torch.no_grad():
        for i in range(steps // 2):
            logits = model(feed[i], **cache_kwargs(model, cache), position_ids=torch.full((2, 1), 37 + i)).logits
            assert same_bits(logits, ref[i]), f"eager step {i}"
    eager_launches = len(launch_emulated)
    assert eager_launches == 3 * (steps // 2 - 1)  # 3 layers, every step but the one that closes a block
    runner = DecodeGraphs(model, cache, horizon=steps // 2, capture=False)
    for i in range(steps // 2, steps):
        assert same_bits(runner.step(feed[i]), ref[i]), f"graph-mode step {i}"
    runner.close()
    assert len(launch_emulated) == eager_launches + 3 * (steps // 2)  # graph mode: close steps write the tail too
    assert cache.get_seq_length() == ref_cache.get_seq_length() == 37 + steps
    assert all(_same_bytes(a, b) for a, b in zip(_state(cache), _state(ref_cache)))


def test_real_smollm2_kv_through_the_launch_equal_copies(launch_emulated, monkeypatch, model_tok, wikitext_test):
    """Real weights and text (SmolLM2-135M, WikiText-2, the shipped table, block 64): after a 100-token prompt, 16
    eager then 16 graph-mode decode steps whose appends go through the launch (kernel modelled) give the logits of
    copying steps bit for bit (one block close at 128), with the same stored bytes and tails."""
    from test_cache import attention, same_bits
    from test_cuda_graphs import _same_bytes, _state

    from gaac_hf.cache import GAACCache, graphs, layer, pool_v3
    from gaac_hf.integrations.cuda_graphs import DecodeGraphs
    from gaac_hf.models import cache_kwargs

    monkeypatch.setattr(pool_v3, "CPU_SYNC_FREE", True)
    model, tok = model_tok
    ids = tok(wikitext_test[:4000], return_tensors="pt").input_ids[:, :100]
    steps = 32

    def run(kernel: bool):
        with monkeypatch.context() as m, torch.no_grad(), attention(model, "gaac"):
            for mod in (layer, graphs):
                m.setattr(mod, "_tail_kernel", lambda k, v, tails: kernel)
            cache = GAACCache(model.config, calibration="smollm2-135m", format_version=3, fused=True)
            feed, out = model(ids, **cache_kwargs(model, cache)).logits[:, -1:].argmax(-1), []
            for i in range(steps // 2):
                out.append(model(feed, **cache_kwargs(model, cache), position_ids=torch.full((1, 1), 100 + i)).logits)
                feed = out[-1][:, -1:].argmax(-1)
            runner = DecodeGraphs(model, cache, horizon=steps, capture=False)
            for _ in range(steps // 2):
                out.append(runner.step(feed))
                feed = out[-1][:, -1:].argmax(-1)
            runner.close()
            return cache, out

    ref_cache, ref = run(False)
    assert not launch_emulated
    cache, got = run(True)
    layers = model.config.num_hidden_layers
    assert len(launch_emulated) == layers * steps  # every step of every layer (the close at 128 is a graph-mode step)
    assert all(same_bits(a, b) for a, b in zip(got, ref))
    assert all(_same_bytes(x, y) for x, y in zip(_state(cache), _state(ref_cache)))


# -- GPU --------------------------------------------------------------------------------------------
ON_GPU = pytest.mark.skipif(not torch.cuda.is_available() or runtime.why_unavailable() is not None,
                            reason="needs the CUDA C++ kernels on a GPU")


@pytest.mark.gpu
@ON_GPU
@pytest.mark.parametrize("b,h,t,d", SHAPES)
def test_gpu_kernel_equals_index_copy(b, h, t, d):
    k, v = _sources(b, h, d, "cuda", seed=7 + d)
    assert tail.takes(k, v, *_poisoned(b, h, t, d, "cuda"))
    for p in (0, t // 2 + 1, t - 1):
        got, want = _poisoned(b, h, t, d, "cuda"), _poisoned(b, h, t, d, "cuda")
        pos = torch.tensor([p], device="cuda")
        tail.tail_append(k, v, got[0], got[1], pos)
        want[0].index_copy_(2, pos, k)
        want[1].index_copy_(2, pos, v)
        for g, w in zip(got, want):
            assert torch.equal(_bits(g), _bits(w)), (b, h, t, d, p)


@pytest.mark.gpu
@ON_GPU
def test_gpu_captured_graph_appends_at_the_device_position():
    b, h, t, d = 2, 8, 64, 128
    k, v = _sources(b, h, d, "cuda", seed=11)
    got, want = _poisoned(b, h, t, d, "cuda"), _poisoned(b, h, t, d, "cuda")
    pos = torch.zeros(1, dtype=torch.int64, device="cuda")
    tail.tail_append(k, v, got[0], got[1], pos)  # compiled and loaded outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tail.tail_append(k, v, got[0], got[1], pos)
    for p in range(5):
        pos.fill_(p)
        k.add_(1)  # new values each step, in place (the graph reads the same addresses)
        v.sub_(1)
        graph.replay()
        want[0].index_copy_(2, pos, k)
        want[1].index_copy_(2, pos, v)
    torch.cuda.synchronize()
    for g, w in zip(got, want):
        assert torch.equal(_bits(g), _bits(w))
