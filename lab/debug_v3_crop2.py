"""Focused: does the CUDA v3 gather of one block per (row, head) return the stored rows? (lab)"""
import sys

import torch

sys.path.insert(0, "lab")
sys.argv = [sys.argv[0]]
exec(open("lab/debug_v3_crop.py").read().split("ALL = [")[0])  # model, table, where(), run()

g = torch.Generator().manual_seed(2)
ids = torch.randint(100, 49000, (2, 200), generator=g).cuda()
dyn, gaac = DynamicCache(config=model.config), GAACCache(model.config, calibration=table, format_version=3, fused=False)
with torch.no_grad():
    model(ids, past_key_values=dyn)
    with attention(model, "gaac"):
        model(ids, past_key_values=gaac)
L = gaac.layers[5]
L._deferred.flush()
b, h = 2, 3
heads = L._heads.view(1, h).expand(b, h).reshape(-1)
want = dyn.layers[5].keys[:, :, 160:176]
for label, e in (("slice col 10", L._tables[0][:, :, 10].reshape(-1)), ("contiguous col 10", L._tables[0][:, :, 10].contiguous().reshape(-1))):
    blk = L._pools[0].gather(e, heads)
    print(label, e.dtype, e.shape, e.is_contiguous(), "->", where(blk.view(b, h, 16, -1), want))
e_all = L._tables[0][:, :, :11].reshape(-1)
heads_all = L._heads.view(1, h, 1).expand(b, h, 11).reshape(-1)
blk = L._pools[0].gather(e_all, heads_all).view(b, h, 11 * 16, -1)
print("all 11 blocks:", where(blk, dyn.layers[5].keys[:, :, :176]))
from gaac_hf.codec.v3 import decode_pool_v3  # noqa: E402
p = L._pools[0]
e = L._tables[0][:, :, 10].reshape(-1)
ref = decode_pool_v3(p.pool.cpu(), e.cpu(), p.base8[heads].cpu(), p.base16[heads].cpu(), L.geometry)
print("reference decoder col 10:", where(ref.view(b, h, 16, -1), want.cpu()))
cu = p.cuda.decode_pool_cuda(p.pool, e.contiguous(), p.base8[heads], p.base16[heads], L.geometry)
print("cuda decoder col 10 (direct):", where(cu.view(b, h, 16, -1), want))
print("entries col 10:", e.tolist(), "used", p.used, "pool", p.pool.numel())
