"""GAACCache under transformers tensor parallelism (tp_plan="auto"), 2 gloo ranks on the CPU.

Each rank holds half the kv-heads; its GAAC layers must pick the matching calibration rows and give
tokens and logits bit-identical to DynamicCache under the same sharding.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from gaac_hf.calibration import CalibrationTable, choose_windows, config_fingerprint, exponent_histogram, model_kv_shape
from gaac_hf.format import BlockGeometry
from gaac_hf.models import cache_kwargs

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_two_rank_tensor_parallel_generate_is_bit_identical(tmp_path):
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "model")
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(torch.randint(0, 256, (1, 256)), **cache_kwargs(model, cache))
    kv = torch.stack([torch.stack([layer.keys[0], layer.values[0]]) for layer in cache.layers])
    b8, b16 = choose_windows(exponent_histogram(kv))
    assert not torch.equal(b8[:, :, 0], b8[:, :, 1])  # heads differ, so a wrong shard would show
    meta = {"model_name": "tiny-llama", "kv_shape": model_kv_shape(model.config), "fingerprint": config_fingerprint(model.config)}
    CalibrationTable(b8, b16, BlockGeometry(16, 64), meta).save(tmp_path / "table.safetensors")
    out = tmp_path / "tp.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(REPO / "eval" / "tp_generate.py"),
           "check", "--model", str(tmp_path / "model"), "--calibration", str(tmp_path / "table.safetensors"), "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["world"] == 2
    for r in res["ranks"]:
        assert r["kv_heads_local"] == 1 and r["bases_are_rank_shard"], r
        assert r["same_tokens"] and r["same_logits"], r
        assert r["encoded_blocks"] > 0
    assert res["all_identical"]
