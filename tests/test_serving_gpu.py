"""GPU test of serving's fused decode path (``gaac_serving(..., fused_decode=True)``): the PagedKV a page
store hands the fused v3 kernel (``PageStore.paged_kv``: the slot tensor as the pool, gathered block
tables, each request's last page as the tail) gives the BF16 twin's output bit for bit on the same K/V,
and the fp64 reference's within bf16 tolerance. (The engine-level check that the PagedKV holds exactly
the K/V a decode step reads runs on the CPU: ``tests/test_serving.py``.)
"""
from __future__ import annotations

import pytest
import torch

from tests.cuda_skip import skip_unless_cuda_kernels

pytestmark = pytest.mark.gpu

skip_unless_cuda_kernels()

from gaac_hf.cache.pages import TRASH_FRAMES, DecodePlan, PageStore, slot_bytes_for  # noqa: E402
from gaac_hf.calibration import CalibrationTable  # noqa: E402
from gaac_hf.calibration.shipped import find_table  # noqa: E402
from gaac_hf.calibration.synthetic import calibrate, synthetic_kv  # noqa: E402
from gaac_hf.kernels import LaunchConfig  # noqa: E402
from gaac_hf.kernels.cuda.attention import bf16_decode_attention_tensors, pack_paged_bf16  # noqa: E402
from gaac_hf.kernels.cuda.fused_attention import gaac_decode_attention_v3, plan  # noqa: E402
from gaac_hf.kernels.reference import attention_reference  # noqa: E402

DEV = torch.device("cuda")


def test_paged_kv_of_a_page_store_through_the_fused_kernel():
    table = CalibrationTable.load(find_table("smollm2-135m"))
    H, D, P = table.num_kv_heads, table.geometry.head_dim, 64
    HQ = 3 * H  # SmolLM2: 9 query heads over 3 kv heads
    layers, lens = [0, 5], [64 * 5 + 17, 64, 1, 64 * 3]  # requests: blocks + a partial page, a full last page, ...
    nblk = [-(-n // P) for n in lens]
    kv = {pos: [synthetic_kv((len(lens), H, max(nblk) * P, D), kind, 10 * pos + i).to(DEV)  # [B, H, pages * P, D]
                for i, kind in enumerate(("k", "v"))] for pos in range(len(layers))}
    for pos, layer in enumerate(layers):  # windows of this K/V (the shipped table's are SmolLM2's)
        for kind in (0, 1):
            b8, b16 = calibrate(kv[pos][kind].cpu())
            table.base8[layer, kind], table.base16[layer, kind] = b8, b16
    store = PageStore(table, layers, P, DEV, slot_bytes_for(H, D, P, 0.72))
    total = sum(nblk) + 2
    store.bind(torch.full((total * len(layers) * store.layout.slot_bytes,), 0xA5, dtype=torch.uint8, device=DEV),
               total, sum(nblk) + TRASH_FRAMES)
    S = max(lens)
    blocks, nxt, closing = [], 1, []
    for r, n in enumerate(nblk):
        ids = list(range(nxt, nxt + n))
        nxt += n
        blocks.append(ids)
        for i, b in enumerate(ids):
            f = store.open_block(b)
            for pos in range(len(layers)):
                for kind in (0, 1):
                    store.frame_page(f, pos, kind).copy_(kv[pos][kind][r, :, i * P:(i + 1) * P].transpose(0, 1))
        closing += ids[:-1]
    for pos in range(len(layers)):
        store.close(pos, closing)
    store.finish_close(closing)
    assert all(store.frame_of(b) is None for b in closing), "synthetic K/V pages must fit a 0.72 slot"
    counts = [n - 1 for n in nblk]
    width = max(1, max(counts))
    ids = torch.tensor([(b[:-1] + [b[0]] * width)[:width] for b in blocks], device=DEV)
    frames = torch.tensor([store.frame_of(b[-1]) for b in blocks], device=DEV)
    dp = DecodePlan(ids=ids, frames=frames, num_blocks=torch.tensor(counts, dtype=torch.int32, device=DEV),
                    tail_len=torch.tensor([n - c * P for n, c in zip(lens, counts)], dtype=torch.int32, device=DEV),
                    max_blocks=max(counts))
    q = torch.randn(len(lens), HQ, D, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16).to(DEV)
    for pos in range(len(layers)):
        paged = store.paged_kv(pos, dp)
        out = torch.full_like(q, float("nan"))  # poison: every element must be written
        gaac_decode_attention_v3(q, paged, out=out)
        torch.cuda.synchronize()
        k, v = (x[:, :, :S] for x in kv[pos])
        p = plan(len(lens), H, HQ // H, P, D, paged.k.table.shape[2] * P + P, DEV, LaunchConfig())
        pk, pv = pack_paged_bf16(k, lens, P), pack_paged_bf16(v, lens, P)
        twin = torch.full_like(q, float("nan"))
        bf16_decode_attention_tensors(q, pk["raw"], pv["raw"], pk["table"], pv["table"], pk["tail"], pv["tail"],
                                      pk["num_blocks"], pk["tail_len"],
                                      config=LaunchConfig(num_splits=p["splits"], num_warps=p["warps"]), out=twin)
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), twin.view(torch.int16)), pos
        ref = attention_reference(q, k, v, lens)
        err = float((out.double().cpu() - ref).norm() / ref.norm())
        assert err < 1e-2, (pos, err)
