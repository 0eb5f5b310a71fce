"""CUDA-graph decode steps of a GAACCache on the H200 (marker gpu): replayed graphs (append and close
kinds) give logits bit-identical to the same graph-mode steps run eagerly, leave the same pool bytes,
tables and tails, and replay without a host sync; against ordinary eager steps (whose split-KV grid
follows the live block count) the logits agree within bf16 rounding; generate() through cuda_graphs
gives the tokens and logits of the eager graph-mode run, left padding included. Random-weight tiny
Llama with SmolLM2's head shapes (tests/test_cuda_graphs.py has the CPU half).
"""
from __future__ import annotations

import pytest
import torch
from test_cache import same_bits
from test_cuda_graphs import _same_bytes, _state, tiny_model

from gaac_hf.cache import GAACCache
from gaac_hf.integrations.cuda_graphs import DecodeGraphs, cuda_graphs
from gaac_hf.models import cache_kwargs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def model_table():
    return tiny_model("cuda")


#: both byte-pool formats run graph-mode steps (format v4: its encoder and packer are host-sync free too)
VERSIONS = pytest.mark.parametrize("version", [3, 4])


def _prefilled(model, table, rows=2, length=37, seed=3, version=3):
    ids = torch.randint(0, 512, (rows, length), generator=torch.Generator().manual_seed(seed)).cuda()
    cache = GAACCache(model.config, calibration=table, format_version=version)
    with torch.no_grad():
        out = model(ids, **cache_kwargs(model, cache))
    assert cache.layers[0].fused_v3, f"the fused v{version} kernel does not serve this cache (not Hopper?)"
    return cache, out.logits[:, -1:].argmax(-1)


@VERSIONS
def test_replays_equal_eager_graph_mode_steps_and_do_not_sync(model_table, version):
    model, table = model_table
    steps = 45  # closes at 48, 64, 80 (block 16)
    ref_cache, tok = _prefilled(model, table, version=version)
    cache, _ = _prefilled(model, table, version=version)
    ref = DecodeGraphs(model, ref_cache, horizon=60, capture=False)
    run = DecodeGraphs(model, cache, horizon=100)  # no re-reservation (a capture synchronizes)
    feed = tok
    for i in range(steps):
        for buf in run.logits.values():
            buf.fill_(float("nan"))  # a replay must write every logit
        a = ref.step(feed).clone()
        b = run.step(feed)
        assert same_bits(a, b), f"step {i}"
        feed = a[:, -1:].argmax(-1)
    assert sorted(run.graphs) == ["append", "close"] and run.replays >= steps - 4
    assert all(_same_bytes(x, y) for x, y in zip(_state(cache), _state(ref_cache)))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(20):  # one close among them
            b = run.step(feed)
            feed = b[:, -1:].argmax(-1)  # stays on the device
    finally:
        torch.cuda.set_sync_debug_mode(0)
    run.close()
    ref.close()
    assert cache.verify()["slot_rows"] > 0


@VERSIONS
def test_replays_agree_with_ordinary_steps(model_table, version):
    model, table = model_table
    eager, tok = _prefilled(model, table, version=version)
    cache, _ = _prefilled(model, table, version=version)
    run = DecodeGraphs(model, cache, horizon=60)
    feed = tok
    with torch.no_grad():
        for i in range(40):
            pos = torch.full((2, 1), 37 + i, device="cuda")
            a = model(feed, **cache_kwargs(model, eager), position_ids=pos).logits
            b = run.step(feed)
            torch.testing.assert_close(b.float(), a.float(), atol=3e-2, rtol=3e-2)
            feed = a[:, -1:].argmax(-1)
    run.close()


@VERSIONS
def test_generate_through_cuda_graphs(model_table, version):
    model, table = model_table
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 512, (2, 30), generator=g).cuda()
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding
    kw = dict(do_sample=False, max_new_tokens=40, return_dict_in_generate=True, output_logits=True, pad_token_id=0)
    outs = []
    with torch.no_grad():
        for capture in (False, True):
            cache = GAACCache(model.config, calibration=table, format_version=version)
            with cuda_graphs(model, cache, horizon=48, capture=capture) as session:
                outs.append(model.generate(input_ids=ids, attention_mask=mask, **cache_kwargs(model.generate, cache), **kw))
                if capture:
                    assert session.runner.replays > 0
    assert "forward" not in vars(model)
    assert torch.equal(outs[0].sequences, outs[1].sequences)
    for a, b in zip(outs[0].logits, outs[1].logits):
        assert same_bits(a, b)
