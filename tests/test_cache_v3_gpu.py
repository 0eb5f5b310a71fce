"""GAACCache(format_version=3) on CUDA (marker gpu): v3 storage on the device stays bit-identical to
DynamicCache + sdpa (decode + SDPA: the fused v3 kernel is not wired in yet), batch ops included, and
what the cache hands a kernel (``paged_kv()``) is a v3 PagedKV on the device whose blocks decode (v3
CUDA decoder when it loads) to DynamicCache's bits. Random-weight SmolLM2-shaped model, as
tests/test_cache_gpu.py.
"""
from __future__ import annotations

import pytest
import torch
from test_cache import attention, same_bits
from test_cache_gpu import _prompt, model_table  # noqa: F401 - the module fixture
from transformers import DynamicCache

from gaac_hf.cache import GAACCache
from gaac_hf.codec.v3 import decode_pool_v3
from gaac_hf.kernels.paged import PagedTensorV3

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_v3_on_cuda_generate_is_bit_identical(model_table):
    model, table = model_table
    inputs = {k: v.cuda() for k, v in _prompt(3, 150, seed=1).items()}
    kw = dict(do_sample=False, max_new_tokens=20, return_dict_in_generate=True, output_logits=True,
              cache_implementation=None, pad_token_id=0)
    with torch.no_grad():
        ref = model.generate(**inputs, past_key_values=DynamicCache(config=model.config), **kw)
        cache = GAACCache(model.config, calibration=table, format_version=3)
        with attention(model, "gaac"):
            out = model.generate(**inputs, past_key_values=cache, **kw)
    assert torch.equal(ref.sequences, out.sequences)
    for a, b in zip(ref.logits, out.logits):
        assert same_bits(a, b)
    assert cache.layers[0].format_version == 3 and cache.layers[0].pools[0].pool.is_cuda
    assert cache.stats()["format_version"] == 3 and cache.verify()["slot_rows"] > 0


def test_v3_on_cuda_paged_kv_and_batch_ops(model_table):
    model, table = model_table
    ids = _prompt(2, 200, seed=2)["input_ids"].cuda()
    dyn, gaac = DynamicCache(config=model.config), GAACCache(model.config, calibration=table, format_version=3)
    with torch.no_grad():
        model(ids, past_key_values=dyn)
        with attention(model, "gaac"):
            model(ids, past_key_values=gaac)
    for op, arg in (("reorder_cache", torch.tensor([1, 0], device="cuda")), ("batch_repeat_interleave", 2),
                    ("batch_select_indices", torch.tensor([0, 3], device="cuda"))):
        getattr(gaac, op)(arg)
        getattr(dyn, op)(arg)
    gaac.crop(-30)
    dyn.crop(-30)
    layer = gaac.layers[5]
    kv = layer.paged_kv()
    assert isinstance(kv.k, PagedTensorV3) and kv.k.pool.is_cuda and kv.k.table.dtype == torch.int64
    assert kv.k.pool.numel() - layer.pools[0].used >= PagedTensorV3.GUARD_BYTES
    nb, t = layer.num_blocks, layer.geometry.block_size
    for kind, (p, want) in enumerate(((kv.k, dyn.layers[5].keys), (kv.v, dyn.layers[5].values))):
        e = p.table[:, :, :nb].reshape(-1)
        heads = torch.arange(p.table.shape[1], device="cuda").view(1, -1, 1).expand(p.table.shape[0], -1, nb).reshape(-1)
        got = layer.pools[kind].gather(e, heads)  # the CUDA decoder when it loads
        ref = decode_pool_v3(p.pool.cpu(), e.cpu(), layer.pools[kind].base8[heads].cpu(), layer.pools[kind].base16[heads].cpu(), layer.geometry)
        blocks = want[:, :, : nb * t].reshape(-1, t, want.shape[-1])
        assert same_bits(got.cpu(), blocks.cpu()) and same_bits(ref, blocks.cpu())
        assert same_bits(layer.full(kind), want)
