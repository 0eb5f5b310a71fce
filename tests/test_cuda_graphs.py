"""Graph-mode decode steps of a GAACCache (gaac_hf.cache.graphs, gaac_hf.integrations.cuda_graphs) on the
CPU: the same code a CUDA graph captures, run eagerly (``capture=False``), against ordinary decode steps.
Logits of every step bit-identical, and the pools, tables and tails the same bytes afterwards, across
block closes and several re-reservations of the horizon; generate() through :func:`cuda_graphs` gives
the tokens of an ordinary generate(); the errors say what to change. The captured replays are checked on
the H200 in tests/test_cuda_graphs_gpu.py.
"""
from __future__ import annotations

import pytest
import torch
from test_cache import kv_table, same_bits
from transformers import LlamaConfig, LlamaForCausalLM

import gaac_hf
import gaac_hf.cache.pool_v3 as pool_v3
from gaac_hf.cache import GAACCache
from gaac_hf.format import BlockGeometry
from gaac_hf.integrations.cuda_graphs import DecodeGraphs, cuda_graphs
from gaac_hf.kernels.cpu import native
from gaac_hf.models import cache_kwargs

pytestmark = pytest.mark.skipif(not native.available(), reason="graph mode on the CPU runs the CPU library's attention")

BLOCK = 16  # a close every 16 steps: several in a short run


def tiny_model(device="cpu"):
    """A random-weight 3-layer Llama with SmolLM2's head shapes (9 query / 3 kv heads, head_dim 64) and its
    own calibration table (block size 16)."""
    gaac_hf.register()
    cfg = LlamaConfig(vocab_size=512, hidden_size=576, intermediate_size=768, num_hidden_layers=3,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True,
                      max_position_embeddings=4096, attn_implementation="gaac")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(device, torch.bfloat16).eval()
    ids = torch.randint(0, 512, (1, 256), generator=torch.Generator().manual_seed(1)).to(device)
    model.set_attn_implementation("sdpa")
    table = kv_table(model, ids, BlockGeometry(BLOCK, 64), name="random-tiny-llama")
    model.set_attn_implementation("gaac")
    return model, table.to("cpu")


@pytest.fixture(scope="module")
def model_table():
    return tiny_model()


@pytest.fixture
def sync_free_cpu(monkeypatch):
    monkeypatch.setattr(pool_v3, "CPU_SYNC_FREE", True)


def _prefilled(model, table, rows=2, length=37, seed=3):
    ids = torch.randint(0, 512, (rows, length), generator=torch.Generator().manual_seed(seed))
    cache = GAACCache(model.config, calibration=table, format_version=3, fused=True)
    with torch.no_grad():
        out = model(ids, **cache_kwargs(model, cache))
    return cache, out.logits[:, -1:].argmax(-1)


def _state(cache):
    out = []
    for layer in cache.layers:
        nb, tl = layer.num_blocks, layer.tail_len
        for kind in (0, 1):
            pool = layer._pools[kind]
            out += [pool.pool[: pool.used].clone(), layer._tables[kind][:, :, :nb].clone(),
                    layer.tails[kind][:, :, :tl].clone()]
    return out


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("capturing", [False, True], ids=["eager", "as-in-capture"])
def test_graph_mode_steps_equal_ordinary_steps(model_table, sync_free_cpu, monkeypatch, capturing):
    """as-in-capture: transformers' mask code sees what it sees during CUDA stream capture (``is_tracing``
    True), which on 5.17 builds an explicit decode mask (found on the H200, call M3)."""
    model, table = model_table
    steps = 45  # 37 + 45 tokens: closes at 48, 64, 80
    eager, tok = _prefilled(model, table)
    feed, ref = [tok], []
    with torch.no_grad():
        for i in range(steps):
            pos = torch.full((2, 1), 37 + i)
            logits = model(feed[-1], **cache_kwargs(model, eager), position_ids=pos).logits
            ref.append(logits)
            feed.append(logits[:, -1:].argmax(-1))
    graphed, _ = _prefilled(model, table)
    if capturing:
        import transformers.masking_utils as mu

        monkeypatch.setattr(mu, "is_tracing", lambda *a, **k: True)
    runner = DecodeGraphs(model, graphed, horizon=12, capture=False)  # re-reserved every 12 steps
    assert graphed.layers[0]._pools[0].sync_free
    kinds = []
    for i in range(steps):
        kinds.append(runner.gaac.kind())
        logits = runner.step(feed[i])
        assert same_bits(logits, ref[i]), f"step {i} ({kinds[-1]})"
    assert kinds.count("close") == 3 and runner.eager_steps == steps
    assert graphed.get_seq_length() == eager.get_seq_length() == 37 + steps
    assert all(_same_bytes(a, b) for a, b in zip(_state(graphed), _state(eager)))
    runner.close()
    assert all(layer._graph is None for layer in graphed.layers)
    # after graph mode the cache takes ordinary steps again, with the same results
    with torch.no_grad():
        pos = torch.full((2, 1), 37 + steps)
        a = model(feed[steps], **cache_kwargs(model, eager), position_ids=pos).logits
        b = model(feed[steps], **cache_kwargs(model, graphed), position_ids=pos).logits
    assert same_bits(a, b)
    assert graphed.verify()["slot_rows"] > 0


def test_cuda_graphs_generate_gives_the_tokens_of_generate(model_table, sync_free_cpu):
    model, table = model_table
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 512, (2, 30), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding
    kw = dict(do_sample=False, max_new_tokens=40, return_dict_in_generate=True, output_logits=True, pad_token_id=0)
    with torch.no_grad():
        ref = model.generate(input_ids=ids, attention_mask=mask, **cache_kwargs(model.generate, GAACCache(model.config, calibration=table,
                             format_version=3, fused=True)), **kw)
        cache = GAACCache(model.config, calibration=table, format_version=3, fused=True)
        with cuda_graphs(model, cache, horizon=16, capture=False) as session:
            out = model.generate(input_ids=ids, attention_mask=mask, **cache_kwargs(model.generate, cache), **kw)
            assert session.runner is not None and session.runner.eager_steps > 0
    assert "forward" not in vars(model)  # the model's own forward is back
    assert torch.equal(ref.sequences, out.sequences)
    for a, b in zip(ref.logits, out.logits):
        assert same_bits(a, b)
    assert all(layer._graph is None for layer in cache.layers)


def test_graph_mode_errors(model_table, sync_free_cpu, monkeypatch):
    model, table = model_table
    with pytest.raises(ValueError, match="capture=False"):
        DecodeGraphs(model, _prefilled(model, table)[0], capture=True)
    v2 = GAACCache(model.config, calibration=table, format_version=2)
    with torch.no_grad():
        model(torch.zeros(1, 20, dtype=torch.long), **cache_kwargs(model, v2))
    with pytest.raises(ValueError, match="format_version 2"):
        DecodeGraphs(model, v2, capture=False)
    with pytest.raises(ValueError, match="after the prefill"):
        DecodeGraphs(model, GAACCache(model.config, calibration=table, format_version=3, fused=True), capture=False)
    with pytest.raises(ValueError, match="horizon"):
        DecodeGraphs(model, _prefilled(model, table)[0], horizon=0, capture=False)
    full = GAACCache(model.config, calibration=table, format_version=3, return_full_kv=True, fused=True)
    with torch.no_grad():
        model(torch.zeros(1, 20, dtype=torch.long), **cache_kwargs(model, full))
    with pytest.raises(ValueError, match="attention is not gaac_hf's"):
        DecodeGraphs(model, full, capture=False)
    monkeypatch.setattr(pool_v3, "CPU_SYNC_FREE", False)
    with pytest.raises(ValueError, match="device offsets"):
        DecodeGraphs(model, _prefilled(model, table)[0], capture=False)


def test_graph_mode_on_real_smollm2_kv_equals_ordinary_steps(model_tok, wikitext_test, sync_free_cpu):
    """Real weights and real text (SmolLM2-135M, WikiText-2, the shipped table, block 64): 30 graph-mode
    steps after a 100-token prompt (one block close at 128) give the ordinary steps' logits bit for bit,
    and the stored bytes are the same."""
    from test_cache import attention

    model, tok = model_tok
    ids = tok(wikitext_test[:4000], return_tensors="pt").input_ids[:, :100]
    caches, logits0 = [], None
    with torch.no_grad(), attention(model, "gaac"):
        for _ in range(2):
            cache = GAACCache(model.config, calibration="smollm2-135m", format_version=3, fused=True)
            logits0 = model(ids, **cache_kwargs(model, cache)).logits[:, -1:]
            caches.append(cache)
        eager, graphed = caches
        runner = DecodeGraphs(model, graphed, horizon=64, capture=False)
        feed = logits0.argmax(-1)
        kinds = []
        for i in range(30):
            a = model(feed, **cache_kwargs(model, eager), position_ids=torch.full((1, 1), 100 + i)).logits
            kinds.append(runner.gaac.kind())
            b = runner.step(feed)
            assert same_bits(a, b), f"step {i}"
            feed = a[:, -1:].argmax(-1)
        runner.close()
    assert kinds.count("close") == 1
    assert all(_same_bytes(x, y) for x, y in zip(_state(graphed), _state(eager)))
