"""GAAC pages in transformers' continuous batching (gaac_hf/cache/pages.py, gaac_hf/integrations/serving/).

The page store must return every BF16 bit it was given (real SmolLM2 K/V, all 65,536 patterns, special
values, incompressible pages that overflow), and the engine under GAAC must produce, request by
request, exactly the tokens of the engine's own BF16 paged cache making the same scheduling decisions
(same block count), preemptions included.
"""
import sys

import pytest
import torch
import transformers

from gaac_hf.cache.pages import TRASH_FRAMES, PageStore, slot_bytes_for

SERVING = pytest.mark.skipif(".".join(transformers.__version__.split(".")[:2]) not in ("5.17", "5.23", "5.24", "5.25"),
                             reason="GAAC serving adapts the 5.17 and 5.23-5.25 continuous-batching engines")


@pytest.fixture(scope="module")
def table():
    from gaac_hf.calibration import CalibrationTable
    from gaac_hf.calibration.shipped import find_table

    return CalibrationTable.load(find_table("smollm2-135m"))


def _bits(x):
    return x.contiguous().view(torch.int16)


_REAL = {}  # (layers deep, tokens) -> DynamicCache of that forward


def _real_pages(smollm2, wikitext_test, layers, pages, page):
    """Real K and V pages [pages, P, H, D] of the given model layers (prompt from WikiText-2 test). The
    forward runs only as deep and as long as asked (K/V of layer i depend only on layers < i and on
    earlier tokens): on a CPU without BF16 matrix instructions a full 2,048-token forward takes ~70 s."""
    from conftest import first_layers_cache

    model, tok = smollm2
    depth, n = max(layers) + 1, pages * page
    assert pages <= 32
    hit = next((kv for (d, m), kv in _REAL.items() if d >= depth and m >= n), None)
    if hit is None:
        ids = tok(wikitext_test[2000:2000 + 6 * 32 * page], return_tensors="pt").input_ids[:, :n]
        assert ids.shape[1] == n
        hit = _REAL[(depth, n)] = first_layers_cache(model, ids, depth)
    out = []
    for layer in layers:
        kv = [getattr(hit.layers[layer], name)[0][:, :n] for name in ("keys", "values")]  # [H, S, D]
        out.append([x.reshape(x.shape[0], pages, page, x.shape[2]).permute(1, 2, 0, 3).contiguous() for x in kv])
    return out  # [layer][kind] -> [pages, P, H, D]


def _pattern_pages(n, page, h, d, seed):
    """n pages [P, H, D] per kind: all 65,536 patterns rotated by channel, special values, random bits."""
    per = page * h * d
    r = torch.arange(65536)
    rot = torch.cat([(r + c) % 65536 for c in range(3)])
    special = torch.tensor([0x7FC0, 0x7FFF, 0xFFFF, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001, 0x807F, 0x0080, 0x7F7F])
    gen = torch.Generator().manual_seed(seed)
    pool = torch.cat([rot, special[torch.randint(0, special.numel(), (per,), generator=gen)],
                      torch.randint(0, 65536, (per,), generator=gen)])
    pool = torch.cat([pool, pool[: (-pool.numel()) % per]]) if pool.numel() % per else pool
    x = pool.to(torch.int32).to(torch.int16).view(torch.bfloat16).view(-1, page, h, d)
    return x[:n] if x.shape[0] >= n else torch.cat([x] * (n // x.shape[0] + 1))[:n]


def _store(table, layers, page, slot_fraction, blocks, frames):
    h, d = table.num_kv_heads, table.geometry.head_dim
    store = PageStore(table, layers, page, "cpu", slot_bytes_for(h, d, page, slot_fraction))
    slots = torch.full((blocks * len(layers) * store.layout.slot_bytes,), 0xA5, dtype=torch.uint8)  # poisoned
    store.bind(slots, blocks, frames)
    return store


def _fill(store, block, pages):
    """Open ``block`` and write ``pages[layer_pos][kind]`` [P, H, D] into its frame."""
    f = store.open_block(block)
    for pos, kinds in enumerate(pages):
        for kind, x in enumerate(kinds):
            store.frame_page(f, pos, kind).copy_(x)
    return f


def test_page_store_bit_exact(smollm2, wikitext_test, table):
    layers, page = [0, 7, 29], 64
    real = _real_pages(smollm2, wikitext_test, layers, 4, page)
    h, d = table.num_kv_heads, table.geometry.head_dim
    pat = _pattern_pages(8, page, h, d, seed=1)
    store = _store(table, layers, page, 0.72, blocks=12, frames=12)
    given = {}
    for i in range(4):  # real K/V
        given[3 + i] = [[real[p][k][i] for k in (0, 1)] for p in range(len(layers))]
    for i in range(2):  # every pattern, special values, random bits (incompressible: an overflow)
        given[8 + i] = [[pat[(2 * p + k + 4 * i) % pat.shape[0]] for k in (0, 1)] for p in range(len(layers))]
    for b, pages in given.items():
        _fill(store, b, pages)
    blocks = list(given)
    for pos in range(len(layers)):
        store.close(pos, blocks)
    released = store.finish_close(blocks)
    overflowed = [b for b in blocks if store.frame_of(b) is not None]
    compressed = [b for b in blocks if store.frame_of(b) is None]
    assert len(released) == len(compressed) >= 4, store.stats()
    assert store.free_frames == 12 - TRASH_FRAMES - len(overflowed)
    for pos in range(len(layers)):
        k, v = store.read(pos, compressed)
        for i, b in enumerate(compressed):
            assert torch.equal(_bits(k[i]), _bits(given[b][pos][0])), (b, pos)
            assert torch.equal(_bits(v[i]), _bits(given[b][pos][1])), (b, pos)
    for b in overflowed:  # BF16 in its frame, as written
        f = store.frame_of(b)
        for pos in range(len(layers)):
            assert torch.equal(_bits(store.frame_page(f, pos, 0)), _bits(given[b][pos][0]))
    real_ratio = store.stats()
    assert real_ratio["closed_blocks"] == len(blocks)
    assert all(b in compressed for b in range(3, 7)), "real K/V pages must fit a 0.72 slot"


def test_page_store_overflow_keeps_the_frame(smollm2, wikitext_test, table):
    layers, page = [0, 1], 64
    real = _real_pages(smollm2, wikitext_test, layers, 2, page)
    store = _store(table, layers, page, 0.3, blocks=4, frames=6)  # 0.3 of BF16: nothing real fits
    for i in range(2):
        _fill(store, 2 + i, [[real[p][k][i] for k in (0, 1)] for p in range(len(layers))])
    for pos in range(len(layers)):
        store.close(pos, [2, 3])
    assert store.finish_close([2, 3]) == []
    assert store.stats()["overflow_blocks"] == 2 and store.free_frames == 6 - TRASH_FRAMES - 2
    store.free(2)
    store.free(3)
    assert store.free_frames == 6 - TRASH_FRAMES


def test_page_store_refuses_bad_use(table):
    with pytest.raises(ValueError, match="multiple of the GAAC block size"):
        PageStore(table, [0], 96, "cpu", 4096)
    store = _store(table, [0], 64, 0.72, blocks=2, frames=3)
    store.open_block(1)
    with pytest.raises(RuntimeError, match="no free BF16 frame"):
        store.open_block(0)
    with pytest.raises(RuntimeError, match="already open"):
        store.open_block(1)


def _prompts(tok, wikitext_test):
    starts = (1000, 4000, 7000, 10000)
    lens = (150, 260, 90, 200)
    return [tok(wikitext_test[s: s + 2000]).input_ids[:n] for s, n in zip(starts, lens)]


def _paged_kv_checker(checked: list):
    """A ``batch.CHECK_PAGED`` hook: the PagedKV a decode step would hand the fused kernel (slot pool,
    gathered tables, last pages as tails) must hold exactly the K/V the step reads, request by request
    (layer positions 0, 1 and the last: the table gather is the same code at every layer)."""
    def check(store, pos, plan, k, v):
        if pos not in (0, 1, store.layout.layers - 1):
            return
        paged = store.paged_kv(pos, plan)
        T, H, D = store.geometry.block_size, store.layout.kv_heads, store.layout.head_dim
        nb, tl = paged.num_blocks.tolist(), paged.tail_len.tolist()
        assert paged.k.pool.data_ptr() == store.slots.data_ptr() and paged.k.table.dtype == torch.int64
        off = 0
        for b in range(len(nb)):
            n = nb[b] * T + tl[b]
            for kind, (pt, ref) in enumerate(((paged.k, k), (paged.v, v))):
                got = pt.tail[b, :, : tl[b]]  # [H, tail, D]
                if nb[b]:  # the store's own decoder (tests/test_cpu_kernels.py checks it against the reference)
                    heads = torch.arange(H).repeat_interleave(nb[b])
                    dec = store.decode_entries(pos, kind, pt.table[b, :, : nb[b]].reshape(-1), heads)
                    got = torch.cat([dec.view(H, nb[b] * T, D), got], dim=1)
                assert torch.equal(_bits(got), _bits(ref[off: off + n].transpose(0, 1))), (pos, b, kind)
            off += n
        assert off == k.shape[0]
        checked.append((pos, len(nb), sum(nb)))

    return check


@SERVING
def test_generate_batch_matches_the_bf16_engine(smollm2, wikitext_test, monkeypatch):
    """Same engine decisions (the same block count), GAAC vs BF16 storage: identical tokens for every
    request, with a block count so small that the engine preempts (soft resets) requests. And every decode
    step's PagedKV for the fused kernel (``fused_decode=True`` on Hopper) holds exactly the K/V it reads."""
    from transformers import GenerationConfig

    from gaac_hf.integrations.serving import batch as serving_batch
    from gaac_hf.integrations.serving import bf16_serving_config, gaac_serving

    model, tok = smollm2
    ids = _prompts(tok, wikitext_test)
    # 12 new tokens: each decode step is a model forward in both engines (24 took twice as long); the
    # prompts alone fill 10 blocks, so the preemptions below happen all the same
    gen = GenerationConfig(max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    kw = dict(page_size=64, max_batch_tokens=256, max_requests_per_batch=4)
    blocks = 7  # < the 14 the four requests need together: the engine preempts (2 soft resets)
    c = model.config
    bf16_block = c.num_hidden_layers * 2 * 64 * c.num_key_value_heads * c.head_dim * 2
    bf16 = bf16_serving_config(model, blocks * bf16_block, **kw)
    assert bf16.num_blocks == blocks
    ref = model.generate_batch(inputs=ids, generation_config=gen, progress_bar=False, continuous_batching_config=bf16)
    checked = []
    monkeypatch.setattr(serving_batch, "CHECK_PAGED", _paged_kv_checker(checked))
    with gaac_serving(model, "smollm2-135m", num_blocks=blocks, open_pages=16, **kw) as serving:
        out = model.generate_batch(inputs=ids, generation_config=gen, progress_bar=False,
                                   continuous_batching_config=serving.config)
    # decode steps of up to 4 requests, most over compressed blocks (the prompts span 2-4 blocks each)
    assert len(checked) >= 3 * 8 and max(n for _, n, _ in checked) >= 2 and max(b for *_, b in checked) >= 4, checked
    stats = serving.stats()
    assert stats["gaac_blocks"] == blocks and stats["preemptions"] > 0, stats
    assert stats["closed_blocks"] >= 8 and stats["overflow_blocks"] == 0, stats
    assert stats["open_frames"] == 0 and stats["free_frames"] == 16 - TRASH_FRAMES, stats  # every frame came back
    assert sorted(out) == sorted(ref)
    for rid in ref:
        assert len(out[rid].generated_tokens) == 12
        assert out[rid].generated_tokens == ref[rid].generated_tokens, rid


@SERVING
def test_gaac_serving_is_undone(smollm2):
    from transformers.generation.continuous_batching import continuous_api

    from gaac_hf.integrations.serving import gaac_serving

    model, _ = smollm2
    before = continuous_api.PagedAttentionCache
    with gaac_serving(model, "smollm2-135m", num_blocks=4, page_size=64) as serving:
        assert continuous_api.PagedAttentionCache is not before
        assert serving.config.num_blocks == 4 and not serving.config.allow_block_sharing
    assert continuous_api.PagedAttentionCache is before
    with pytest.raises(KeyError):
        with gaac_serving(model, "smollm2-135m", num_blocks=4, page_size=64):
            raise KeyError("inside")
    assert continuous_api.PagedAttentionCache is before


def _reference_decode_attention(calls: list):
    """A CPU stand-in for the fused kernel behind ``fused_decode`` (q ``[N, Hq, D]`` -> ``[N, Hq, D]``): the
    PagedKV decoded (the page store's decoder, attached as ``paged.decode``), then SDPA per request (what the
    kernel computes, within its arithmetic)."""
    def decode_attention(q, paged, scaling):
        query = q.transpose(0, 1)[None]  # [1, Hq, N, D]
        g = paged.geometry
        T, H, D = g.block_size, paged.k.table.shape[1], g.head_dim
        outs = []
        for b, (nb, tl) in enumerate(zip(paged.num_blocks.tolist(), paged.tail_len.tolist())):
            kv = []
            for kind, pt in enumerate((paged.k, paged.v)):
                x = pt.tail[b, :, :tl]
                if nb:
                    heads = torch.arange(H).repeat_interleave(nb)
                    dec = paged.decode(kind, pt.table[b, :, :nb].reshape(-1), heads)
                    x = torch.cat([dec.view(H, nb * T, D), x], dim=1)
                kv.append(x[None])
            outs.append(torch.nn.functional.scaled_dot_product_attention(query[:, :, b: b + 1], *kv, scale=scaling,
                                                                         enable_gqa=True))
        calls.append(len(outs))
        return torch.cat(outs, 2)[0].transpose(0, 1)  # [N, Hq, D]

    return decode_attention


@SERVING
def test_fused_decode_through_the_engine_gives_the_bf16_engines_tokens(smollm2, wikitext_test, monkeypatch):
    """fused_decode=True end to end on the CPU, with the kernel replaced by the reference codec + SDPA per
    request: decode steps read nothing from the page store, their PagedKV reaches the attention call, and
    every request gets the BF16 engine's tokens."""
    from transformers import GenerationConfig

    import gaac_hf.integrations.serving as serving_mod
    from gaac_hf.cache import pages
    from gaac_hf.integrations.serving import attention, bf16_serving_config, gaac_serving

    model, tok = smollm2
    ids = _prompts(tok, wikitext_test)[:2]  # 150 and 260 tokens: decode steps over 2 and 4 compressed blocks
    new = 4
    gen = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    kw = dict(page_size=64, max_batch_tokens=256, max_requests_per_batch=4)
    c = model.config
    blocks = 16
    bf16 = bf16_serving_config(model, blocks * c.num_hidden_layers * 2 * 64 * c.num_key_value_heads * c.head_dim * 2, **kw)
    ref = model.generate_batch(inputs=ids, generation_config=gen, progress_bar=False, continuous_batching_config=bf16)
    calls = []
    monkeypatch.setattr(serving_mod, "_fused_group", lambda *a, **k: 3)
    monkeypatch.setattr(attention, "decode_attention", _reference_decode_attention(calls))
    real_paged_kv = pages.PageStore.paged_kv

    def paged_kv(self, pos, plan):  # the stand-in decodes with the layer's windows
        kv = real_paged_kv(self, pos, plan)
        object.__setattr__(kv, "decode", lambda kind, entries, heads: self.decode_entries(pos, kind, entries, heads))
        return kv

    monkeypatch.setattr(pages.PageStore, "paged_kv", paged_kv)
    with gaac_serving(model, "smollm2-135m", num_blocks=blocks, open_pages=16, fused_decode=True, **kw) as serving:
        out = model.generate_batch(inputs=ids, generation_config=gen, progress_bar=False,
                                   continuous_batching_config=serving.config)
    assert len(calls) >= (new - 1) * c.num_hidden_layers and max(calls) == len(ids), calls[:8]
    cache = serving.caches[-1]
    batch = cache.batch if hasattr(cache, "batch") else cache.cache_allocators["full_attention"].batch  # 5.17 / 5.24
    assert batch.fused_steps == len(calls)
    for rid in ref:
        assert out[rid].generated_tokens == ref[rid].generated_tokens, rid


@SERVING
def test_fused_decode_wraps_one_attention_entry_and_undoes_it(smollm2, monkeypatch):
    """fused_decode=True: on the CPU it says why decode steps read decoded pages and changes nothing else;
    the default (None) says nothing on the CPU; where the kernel can run, the default and True wrap the
    engine's attention entry inside the block only, and False never does."""
    import warnings
    from transformers.modeling_utils import AttentionInterface

    import gaac_hf.integrations.serving as serving_mod
    from gaac_hf.integrations.serving import gaac_serving

    model, _ = smollm2
    name = "paged|sdpa" if serving_mod._is_517() else "sdpa"
    original = AttentionInterface._global_mapping[name]
    with pytest.warns(RuntimeWarning, match="decode steps read decoded pages .*cpu device"):
        with gaac_serving(model, "smollm2-135m", num_blocks=4, page_size=64, fused_decode=True):
            assert AttentionInterface._global_mapping[name] is original
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the default on the CPU: decoded pages, no message
        with gaac_serving(model, "smollm2-135m", num_blocks=4, page_size=64):
            assert AttentionInterface._global_mapping[name] is original
    monkeypatch.setattr(serving_mod, "_fused_group", lambda *a, **k: 3)  # as on Hopper with the cuda extra
    for fused in (True, None):
        with pytest.raises(KeyError):
            with gaac_serving(model, "smollm2-135m", num_blocks=4, page_size=64, fused_decode=fused):
                wrapped = AttentionInterface._global_mapping[name]
                assert wrapped is not original and wrapped.gaac_wraps is original
                raise KeyError("inside")
        assert AttentionInterface._global_mapping[name] is original
    with gaac_serving(model, "smollm2-135m", num_blocks=4, page_size=64, fused_decode=False):
        assert AttentionInterface._global_mapping[name] is original


@SERVING
def test_gaac_serving_errors(smollm2):
    from gaac_hf.integrations.serving import bf16_serving_config, check_version, gaac_serving

    model, _ = smollm2
    with pytest.raises(RuntimeError, match="supports transformers 5.17, 5.23, 5.24, 5.25.*this is 5.19.0"):
        check_version("5.19.0")
    check_version("5.17.0")
    with pytest.raises(ValueError, match="pass one of kv_budget_bytes"):
        with gaac_serving(model, "smollm2-135m"):
            pass
    with pytest.raises(ValueError, match="pass one of kv_budget_bytes"):
        with gaac_serving(model, "smollm2-135m", kv_budget_bytes=1 << 30, num_blocks=4):
            pass
    with pytest.raises(ValueError, match="needs a model on a CUDA device"):
        with gaac_serving(model, "smollm2-135m", free_memory_fraction=0.5):
            pass
    with pytest.raises(ValueError, match=r"does not cover \d+ open BF16 pages"):
        with gaac_serving(model, "smollm2-135m", kv_budget_bytes=1 << 20, page_size=64):
            pass
    with pytest.raises(ValueError, match="sets use_cuda_graph itself"):
        with gaac_serving(model, "smollm2-135m", num_blocks=4, use_cuda_graph=True):
            pass
    with pytest.raises(ValueError, match="holds no block"):
        bf16_serving_config(model, 1000)


@SERVING
def test_equal_budget_holds_more_blocks(smollm2):
    """At one KV budget the GAAC pool has more blocks than the BF16 engine, open frames paid for."""
    from gaac_hf.integrations.serving import bf16_serving_config, gaac_serving

    model, _ = smollm2
    budget = 1 << 30
    bf16 = bf16_serving_config(model, budget, page_size=64).num_blocks
    with gaac_serving(model, "smollm2-135m", kv_budget_bytes=budget, page_size=64) as serving:
        gaac = serving.config.num_blocks
        frames = serving.open_pages
    assert gaac > 1.22 * bf16, (gaac, bf16, frames)


@SERVING
def test_a_request_larger_than_the_pool_fails_as_in_the_bf16_engine(smollm2):
    """A prompt needing more blocks than the pool holds fails with the engine's own error, exactly where
    the BF16 engine fails it (5.24 fails that request, 5.17 the whole run); what finishes has the BF16
    engine's tokens, and every frame is back afterwards."""
    from transformers import GenerationConfig

    from gaac_hf.integrations.serving import bf16_serving_config, gaac_serving

    model, _ = smollm2
    ids = [list(range(100, 700)), list(range(200, 300))]  # 600 tokens: 10 blocks of 64 > 6
    gen = GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    kw = dict(page_size=64, max_batch_tokens=256, max_requests_per_batch=4)
    with gaac_serving(model, "smollm2-135m", num_blocks=6, open_pages=16, **kw) as serving:
        out = model.generate_batch(inputs=ids, generation_config=gen, progress_bar=False,
                                   continuous_batching_config=serving.config)
    c = model.config
    bf16 = bf16_serving_config(model, 6 * c.num_hidden_layers * 2 * 64 * c.num_key_value_heads * c.head_dim * 2, **kw)
    ref = model.generate_batch(inputs=ids, generation_config=gen, progress_bar=False, continuous_batching_config=bf16)
    assert out["req_0"].error and not out["req_0"].generated_tokens
    for rid in ref:
        assert (out[rid].error is None) == (ref[rid].error is None), rid
        assert out[rid].generated_tokens == ref[rid].generated_tokens, rid
    stats = serving.stats()
    assert stats["open_frames"] == 0 and stats["free_frames"] == 16 - TRASH_FRAMES, stats


@SERVING
def test_gaac_serve_builds_gaac_managers_and_forwards_its_arguments(smollm2, monkeypatch):
    """gaac-serve's patch: any init_continuous_batching (the server's entry, and generate_batch's) builds a
    GAAC-paged manager with the server's batch-token flag; main() forwards the rest to `transformers serve`
    with --continuous-batching while the patch is on, and undoes it."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.continuous_api import ContinuousMixin

    from gaac_hf.integrations.serving import serve

    model, _ = smollm2
    ids = [list(range(300, 420)), list(range(500, 590))]
    gen = GenerationConfig(max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    before = ContinuousMixin.init_continuous_batching
    with serve.gaac_server("smollm2-135m", kv_budget_bytes=96 << 20, open_pages=16, max_requests_per_batch=4) as sessions:
        out = model.generate_batch(inputs=ids, generation_config=gen, progress_bar=False,
                                   continuous_batching_config=ContinuousBatchingConfig(max_batch_tokens=256))
    assert ContinuousMixin.init_continuous_batching is before
    assert len(sessions) == 1 and sessions[0].config.max_batch_tokens == 256
    assert sessions[0].stats()["closed_blocks"] >= 2  # (tokens vs the BF16 engine: test_generate_batch_matches...)
    assert all(len(o.generated_tokens) == 12 and o.error is None for o in out.values())

    seen = {}

    def fake_serve(argv):
        seen["argv"] = argv
        seen["patched"] = ContinuousMixin.init_continuous_batching is not before

    monkeypatch.setattr(serve, "_run_transformers_serve", fake_serve)
    serve.main(["--calibration", "smollm2-135m", "--kv-budget-gb", "2", "--", "some/model", "--port", "8001"])
    assert seen == {"argv": ["--continuous-batching", "some/model", "--port", "8001"], "patched": True}
    assert ContinuousMixin.init_continuous_batching is before
    with pytest.raises(SystemExit):
        serve.main(["--kv-budget-gb", "2"])  # no --calibration


class _FakeEngine:
    """Stands in for transformers 5.25's EngineClient in test_gaac_serve_reaches_the_model_process."""
    seen: list = []

    @staticmethod
    def run_engine(*args):
        from transformers.generation.continuous_batching.continuous_api import ContinuousMixin
        _FakeEngine.seen.append((args, ContinuousMixin.init_continuous_batching.__qualname__))


@SERVING
def test_gaac_serve_reaches_the_model_process(monkeypatch):
    """From 5.25 the server spawns a process per model: gaac_server swaps that process's entry for a
    picklable one that opens the GAAC wrap there, then runs transformers' entry; undone on exit."""
    import pickle

    from transformers.generation.continuous_batching.continuous_api import ContinuousMixin

    from gaac_hf.integrations.serving import serve

    if serve._model_process_entry() is None:
        pytest.skip("this transformers serves its models in its own process (before 5.25, or no serving extras)")
    engine_cls = serve._model_process_entry()
    before = engine_cls.__dict__["run_engine"]
    with serve.gaac_server("smollm2-135m", kv_budget_bytes=96 << 20, open_pages=16):
        entry = engine_cls.run_engine
        assert entry.func is serve._engine_under_gaac and entry.args[0]["kv_budget_bytes"] == 96 << 20
        shipped = pickle.loads(pickle.dumps(entry))  # what the spawned process receives
    assert engine_cls.__dict__["run_engine"] is before
    assert shipped.args == entry.args
    # in "the model's process": transformers' entry runs inside the wrap, which is undone after it
    monkeypatch.setattr(serve, "_ENGINE_ENTRY", (__name__, "_FakeEngine", "run_engine"))
    _FakeEngine.seen.clear()
    shipped("load", "state")
    assert _FakeEngine.seen == [(("load", "state"), "gaac_server.<locals>.init_continuous_batching")]
    assert ContinuousMixin.init_continuous_batching.__qualname__ != "gaac_server.<locals>.init_continuous_batching"
    # an entry that moved (a later release) is an error, not a server quietly running BF16 pages
    monkeypatch.setattr(serve, "_ENGINE_ENTRY", ("transformers.cli.serving.model_manager", "EngineClient", "gone"))
    with pytest.raises(RuntimeError, match="serves each model in a process of its own"):
        with serve.gaac_server("smollm2-135m", kv_budget_bytes=96 << 20):
            pass
    assert ContinuousMixin.init_continuous_batching.__qualname__ != "gaac_server.<locals>.init_continuous_batching"


@SERVING
def test_gaac_serve_pages_the_spawned_model_process(capfd, monkeypatch):
    """End to end where 5.25's server really spawns its model process: the manager built there has GAAC pages
    (its log line on the process's stderr), which is what the server silently lost before the entry swap."""
    import os

    # the child gets this process's sys.path: without the checkout's root (``python -m pytest`` puts the working
    # directory first), whose kernels/ would shadow the PyPI ``kernels`` that transformers 5.25 imports
    root = os.path.realpath(os.path.join(os.path.dirname(__file__), ".."))
    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.realpath(p or os.getcwd()) != root])
    from gaac_hf.integrations.serving import serve
    from gaac_hf.models import smollm2_dir

    if serve._model_process_entry() is None:
        pytest.skip("this transformers serves its models in its own process (before 5.25, or no serving extras)")
    from transformers.cli.serving.model_manager import EngineClient, ModelLoader
    from transformers.cli.serving.utils import GenerationState

    loader = ModelLoader(device="cpu", dtype="bfloat16", continuous_batching=True)
    with serve.gaac_server("smollm2-135m", kv_budget_bytes=96 << 20, open_pages=16, max_requests_per_batch=4):
        process, _, _ = EngineClient.start_process(str(smollm2_dir()), loader, GenerationState(continuous_batching=True))
    try:
        assert process.is_alive()  # loaded, manager built, waiting for requests
    finally:
        process.terminate()
        process.join(30)
    err = capfd.readouterr().err
    assert "[gaac-serve] GAAC pages for LlamaForCausalLM" in err, err[-2000:]


def test_page_store_warns_once_when_blocks_overflow(smollm2, wikitext_test, table):
    import warnings

    layers, page, n = [0, 1], 64, 32
    real = _real_pages(smollm2, wikitext_test, layers, n, page)
    for fraction, expect in ((0.3, True), (0.72, False)):
        store = _store(table, layers, page, fraction, blocks=n, frames=n + TRASH_FRAMES)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for half in (range(0, n // 2), range(n // 2, n)):  # two batches; the check runs once past 32 blocks
                blocks = list(half)
                for i in blocks:
                    _fill(store, i, [[real[p][k][i] for k in (0, 1)] for p in range(len(layers))])
                for pos in range(len(layers)):
                    store.close(pos, blocks)
                store.finish_close(blocks)
        hits = [w for w in caught if "did not fit their slots" in str(w.message)]
        assert len(hits) == (1 if expect else 0), (fraction, [str(w.message) for w in caught])


@SERVING
def test_an_engine_config_gaac_cannot_run_is_refused(smollm2):
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from gaac_hf.integrations.serving import gaac_serving
    from gaac_hf.integrations.serving.batch import check_engine_config

    check_engine_config(ContinuousBatchingConfig(allow_block_sharing=False, use_async_batching=False, cpu_offload_space=0))
    check_engine_config(ContinuousBatchingConfig(use_cuda_graph=(False, False), allow_block_sharing=False))
    with pytest.raises(ValueError, match="use_async_batching.*pass continuous_batching_config=serving.config"):
        check_engine_config(ContinuousBatchingConfig(use_async_batching=True, allow_block_sharing=False))
    model, _ = smollm2
    gen = GenerationConfig(max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)
    with gaac_serving(model, "smollm2-135m", num_blocks=8, open_pages=8, page_size=64):
        try:  # the engine's own config (block sharing on): refused when the engine builds its cache
            out = model.generate_batch(inputs=[list(range(100, 140))], generation_config=gen, progress_bar=False)
        except ValueError as err:
            assert "serving.config" in str(err)
        else:
            assert all(o.error and "serving.config" in o.error for o in out.values()), out
