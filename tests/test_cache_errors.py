"""Errors a user can act on when building a GAACCache: each message says what to pass instead."""
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from gaac_hf import GAACCache
from gaac_hf.calibration import CalibrationTable, model_kv_shape
from gaac_hf.format import BlockGeometry


def _config(**kw):
    return LlamaConfig(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                       hidden_size=128, intermediate_size=64, vocab_size=32, **kw)


def _table():
    shape = (2, 2, 1, 64)
    return CalibrationTable(torch.full(shape, 120, dtype=torch.uint8), torch.full(shape, 116, dtype=torch.uint8),
                            BlockGeometry(16, 64), {"kv_shape": model_kv_shape(_config())})


def test_a_model_is_taken_for_its_config():
    model = AutoModelForCausalLM.from_config(_config(), dtype=torch.bfloat16)
    cache = GAACCache(model, calibration=_table())
    assert cache.layers[0]._config is model.config  # the live config: its attention choice is read at update()
    k = torch.randn(1, 1, 20, 64).to(torch.bfloat16)
    cache.layers[0].append(k, k)
    assert torch.equal(cache.layers[0].full_kv()[0].view(torch.int16), k.view(torch.int16))


def test_something_else_is_a_type_error_naming_model_config():
    model = AutoModelForCausalLM.from_config(_config(), dtype=torch.bfloat16)
    for wrong in (model.model.layers, {"num_hidden_layers": 2}, None):
        with pytest.raises(TypeError, match=r"pass model\.config"):
            GAACCache(wrong, calibration=_table())


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_a_float_model_is_refused_when_the_cache_is_built(dtype):
    model = AutoModelForCausalLM.from_config(_config(), dtype=dtype)
    for arg in (model, model.config):
        with pytest.raises(ValueError) as e:
            GAACCache(arg, calibration=_table())
        msg = str(e.value)
        assert str(dtype) in msg and "dtype=torch.bfloat16" in msg and "DynamicCache" in msg
    GAACCache(_config(), calibration=_table())  # a config that says nothing about its dtype is taken


def _feed(cache, tokens, seed=0):
    gen = torch.Generator().manual_seed(seed)
    for layer in cache.layers:
        kv = [torch.randn(1, 1, tokens, 64, generator=gen).to(torch.bfloat16) for _ in range(2)]
        layer.append(*kv)


def test_a_table_that_does_not_fit_warns_once_with_the_fix():
    shape = (2, 2, 1, 64)
    zero = CalibrationTable(torch.zeros(shape, dtype=torch.uint8), torch.zeros(shape, dtype=torch.uint8),
                            BlockGeometry(16, 64), {"kv_shape": model_kv_shape(_config()), "model_name": "other",
                                                    "context": 512, "escapes": {"ratio_estimate": 1.4}})
    cache = GAACCache(_config(), calibration=zero)
    with pytest.warns(UserWarning) as rec:
        _feed(cache, 16 * 64)  # 64 blocks per layer and kind: 256 in all
        _feed(cache, 16 * 64, seed=1)
    msgs = [str(w.message) for w in rec if "calibration table" in str(w.message)]
    assert len(msgs) == 1, msgs
    assert "compress" in msgs[0] and "fell back to raw" in msgs[0] and "gaac-calibrate --model" in msgs[0]
    assert "calibrated on other at context 512" in msgs[0]
    st = cache.stats()
    assert st["raw_fallback_blocks"] > 0.02 * st["encoded_blocks"]


def test_a_table_that_fits_is_silent():
    import warnings

    t = _table()
    t.meta["escapes"] = {"ratio_estimate": 1.0}  # what windows 120/116 give on random normals, at least
    cache = GAACCache(_config(), calibration=t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _feed(cache, 16 * 80)
    assert cache.stats()["encoded_blocks"] >= 256 and cache.layers[0]._fitness.done
