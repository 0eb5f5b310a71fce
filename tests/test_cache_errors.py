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
