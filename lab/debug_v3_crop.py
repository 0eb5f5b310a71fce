"""Where GAACCache(format_version=3) on CUDA departs from DynamicCache after batch ops and crop (lab)."""
import sys

import torch

sys.path.insert(0, "tests")
from test_cache import attention, kv_table, same_bits  # noqa: E402
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: E402

import gaac_hf  # noqa: E402
from gaac_hf.cache import GAACCache  # noqa: E402
from gaac_hf.format import BlockGeometry  # noqa: E402

gaac_hf.register()
cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=8,
                  num_attention_heads=9, num_key_value_heads=3, head_dim=64, rope_theta=100000.0,
                  tie_word_embeddings=True, max_position_embeddings=8192, attn_implementation="sdpa")
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
table = kv_table(model, torch.randint(100, 49000, (1, 512), device="cuda"), BlockGeometry(16, 64), name="x").to("cpu")


def where(a, b):
    d = (a.view(torch.int16) != b.view(torch.int16)).any(-1)  # [B, H, S]
    if not d.any():
        return "ok"
    idx = d.nonzero()
    return f"{int(d.sum())} rows differ: b {sorted(set(idx[:, 0].tolist()))} s {idx[:, 2].min().item()}..{idx[:, 2].max().item()} of {a.shape[2]}"


def run(ops, crop):
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(100, 49000, (2, 200), generator=g).cuda()
    dyn, gaac = DynamicCache(config=model.config), GAACCache(model.config, calibration=table, format_version=3, fused=False)
    with torch.no_grad():
        model(ids, past_key_values=dyn)
        with attention(model, "gaac"):
            model(ids, past_key_values=gaac)
    for op, arg in ops:
        getattr(gaac, op)(arg)
        getattr(dyn, op)(arg)
        L = gaac.layers[5]
        print(f"  after {op}: K {where(L.full(0), dyn.layers[5].keys)} V {where(L.full(1), dyn.layers[5].values)} "
              f"nb {L.num_blocks} tail {L.tail_len}")
    if crop:
        gaac.crop(crop)
        dyn.crop(crop)
        L = gaac.layers[5]
        print(f"  after crop({crop}): K {where(L.full(0), dyn.layers[5].keys)} V {where(L.full(1), dyn.layers[5].values)} "
              f"nb {L.num_blocks} tail {L.tail_len}")
        L.paged_kv()
        print(f"  after paged_kv: K {where(L.full(0), dyn.layers[5].keys)} V {where(L.full(1), dyn.layers[5].values)}")


ALL = [("reorder_cache", torch.tensor([1, 0], device="cuda")), ("batch_repeat_interleave", 2),
       ("batch_select_indices", torch.tensor([0, 3], device="cuda"))]
for name, ops, crop in (("crop only", [], -30), ("crop -8 (tail only)", [], -8), ("batch ops + crop", ALL, -30),
                        ("select only + crop", ALL[2:] if False else [("batch_select_indices", torch.tensor([1], device="cuda"))], -30)):
    print(name)
    run(ops, crop)
