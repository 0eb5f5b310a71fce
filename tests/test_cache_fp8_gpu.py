"""FP8 GAACCache on CUDA (marker gpu; passed on the H200 in session 13, call N2): generation is
bit-identical (tokens and logits) to the FP8 cache without GAAC on the same device, and the stored codes decode (FP8 CUDA decoder) to the baseline's codes, for E4M3 and E5M2.
Random-weight tiny Llama and the synthetic tables of tests/test_cache_fp8.py.
"""
from __future__ import annotations

import pytest
import torch
from test_cache_fp8 import DTYPES, bits, synthetic_table, tiny_config
from transformers import LlamaForCausalLM

from gaac_hf import GAACCache
from gaac_hf.cache import FP8DynamicCache
from gaac_hf.models import cache_kwargs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_gaac_generation_on_cuda_is_the_fp8_baselines(dtype):
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config()).to("cuda", torch.bfloat16).eval()
    table = synthetic_table(dtype)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 32, (2, 70), generator=g).cuda()
    mask = torch.ones_like(ids)
    mask[1, :6] = 0
    kw = dict(do_sample=False, max_new_tokens=40, return_dict_in_generate=True, output_logits=True, pad_token_id=0)
    with torch.no_grad():
        base = FP8DynamicCache(model.config, table)
        want = model.generate(input_ids=ids, attention_mask=mask, **cache_kwargs(model.generate, base), **kw)
        cache = GAACCache(model.config, calibration=table, kv_dtype=dtype)
        got = model.generate(input_ids=ids, attention_mask=mask, **cache_kwargs(model.generate, cache), **kw)
    assert torch.equal(want.sequences, got.sequences)
    for a, b in zip(want.logits, got.logits):
        assert torch.equal(bits(a), bits(b))
    layer = cache.layers[0]
    assert layer.pools[0].pool.is_cuda and layer.num_blocks >= 6 and layer.pools[0].cuda is not None
    assert cache.get_seq_length() == base.get_seq_length()
    for kind, ref in ((0, base.layers[0].keys), (1, base.layers[0].values)):  # the codes the same steps stored
        assert torch.equal(layer.codes(kind), ref.contiguous().view(torch.uint8))
