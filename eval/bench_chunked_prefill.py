"""Chunks of q_len 2..512 queries over a compressed history: what decode-then-attend costs (one GPU).

    python eval/bench_chunked_prefill.py --out eval/results/chunked_prefill_h200.json [--quick]

A continued prompt or a prefill chunk of ``q_len`` new tokens attends to the whole history and,
causally, to itself. With format v3 on CUDA the cache serves such a call by decoding the compressed
history of the layer into BF16 (the standalone v3 decoder, ``codec_v3.decode_pool_cuda``, through the
block tables) and running SDPA on it. This bench measures that path against the best it could be:

* ``fa2`` / ``cudnn``: SDPA (FlashAttention-2 / cuDNN backends) over dense BF16 K/V already in memory,
  ``q_len`` queries, bottom-right causal (``causal_lower_right``): the BF16 cache's cost;
* ``decode``: decoding the layer's K and V history (``S`` tokens) into preallocated BF16 buffers;
* ``decode_then_fa2``: decode + the same FA2 call on the decoded buffers (what the cache does);
* ``fused_serial``: ``q_len`` fused v3 decode calls (q_len 1 each), the cost of treating a chunk
  as that many decode steps;
so ``decode_then_fa2 / fa2`` is the price of compression for chunks, per q_len.

Qwen3-8B attention shape (32 query / 8 kv heads, d=128), B=1, synthetic KV-like values
(``gaac_hf.calibration.synthetic``) encoded by the CUDA v3 encoder into shuffled pools; every time is
GPU time from CUDA-graph replay with the L2 flushed before every call (``harness.timeit_graph``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # eval/harness.py
import harness  # noqa: E402

T = 64
Q_LENS = (1, 2, 4, 8, 16, 64, 128, 512)


def _sdpa_chunk(backend: str, q, k, v):
    """SDPA pinned to ``backend`` for ``q`` ``[B, Hq, L, D]`` over ``k`` / ``v`` ``[B, Hkv, S, D]``
    (the last L positions are the chunk's own tokens: bottom-right causal)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    be = {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    L, S = q.shape[2], k.shape[2]
    mask = causal_lower_right(L, S) if L > 1 else None

    def f():
        with sdpa_kernel(be):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    return f


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="64K only")
    args = ap.parse_args(argv)
    from gaac_hf.calibration.synthetic import calibrate, synthetic_kv
    from gaac_hf.format.v3 import GeometryV3
    from gaac_hf.kernels import LaunchConfig
    from gaac_hf.kernels.cuda import codec_v3
    from gaac_hf.kernels.cuda.fused_attention import gaac_decode_attention_v3, pack_paged_v3

    dev = torch.device("cuda")
    hq, hkv, d = harness.ATTENTION_SHAPES["qwen3-8b"]
    g = GeometryV3(block_size=T, head_dim=d)
    t0 = time.time()
    result = dict(harness.provenance(shapes=dict(q_heads=hq, kv_heads=hkv, head_dim=d), argv=sys.argv), block_size=T,
                  timer="cuda-graph replay, L2 flushed, median of 15", data="synthetic KV-like (calibration.synthetic)",
                  shape="qwen3-8b", batch=1, rows=[])
    for S in ((65536,) if args.quick else (16384, 65536)):
        k = synthetic_kv((1, hkv, S, d), "k", 0, device=dev)
        v = synthetic_kv((1, hkv, S, d), "v", 1, device=dev)
        bk, bv = calibrate(k), calibrate(v)
        bases = torch.stack([torch.stack(bk), torch.stack(bv)])
        kv = pack_paged_v3(k, v, [S], T, bases)
        nb = S // T
        # what the cache decodes: every block of the history, in (row, head, block) table order
        ent = [p.table[:, :, :nb].reshape(-1).contiguous() for p in (kv.k, kv.v)]
        heads = torch.arange(hkv, device=dev).repeat_interleave(nb)
        tabs = [codec_v3.pair_tables(b[0][heads], b[1][heads], g) for b in bases]
        dk, dv = torch.empty_like(k), torch.empty_like(v)

        def decode():
            codec_v3.decode_pool_cuda(kv.k.pool, ent[0], None, None, g, out=dk.view(-1, T, d), tables=tabs[0])
            codec_v3.decode_pool_cuda(kv.v.pool, ent[1], None, None, g, out=dv.view(-1, T, d), tables=tabs[1])

        decode()
        exact = bool(torch.equal(dk.view(torch.int16), k.view(torch.int16)) and torch.equal(dv.view(torch.int16), v.view(torch.int16)))
        us_decode, _ = harness.time_and_error("decode", lambda: decode)
        for L in Q_LENS:
            q = torch.randn(1, hq, L, d, device=dev).to(torch.bfloat16)
            us = dict(decode=us_decode)
            ref = _sdpa_chunk("fa2", q, k, v)()
            us["fa2"], _ = harness.time_and_error("fa2", lambda: _sdpa_chunk("fa2", q, k, v))
            us["cudnn"], _ = harness.time_and_error("cudnn", lambda: _sdpa_chunk("cudnn", q, k, v), ref)
            att = _sdpa_chunk("fa2", q, dk, dv)

            def both():
                decode()
                return att()

            us["decode_then_fa2"], err = harness.time_and_error("decode_then_fa2", lambda: both, ref)
            if L <= 16:
                qs = [q[:, :, i].contiguous() for i in range(L)]
                out = torch.empty_like(qs[0])

                def serial():
                    for qi in qs:
                        gaac_decode_attention_v3(qi, kv, launch=LaunchConfig(), out=out)
                    return out

                us["fused_serial"], _ = harness.time_and_error("fused_serial", lambda: serial)
            row = dict(context=S, q_len=L, us=us, decode_exact=exact, rel_err_decode_then_fa2=err,
                       overhead_vs_fa2=(us["decode_then_fa2"] / us["fa2"]) if us["fa2"] and us["decode_then_fa2"] else None)
            result["rows"].append(row)
            fmt = lambda x: f"{x:8.1f}" if x else "    -   "  # noqa: E731
            print(f"S={S:6d} q={L:4d}: fa2 {fmt(us['fa2'])} cudnn {fmt(us['cudnn'])} decode {fmt(us_decode)} "
                  f"dec+fa2 {fmt(us['decode_then_fa2'])} serial {fmt(us.get('fused_serial'))} "
                  f"x{row['overhead_vs_fa2'] or 0:.2f} exact={exact}", flush=True)
        k = v = kv = dk = dv = None  # free before the next context
        torch.cuda.empty_cache()
    harness.write_result(args.out, result)
    print(f"wrote {args.out} ({len(result['rows'])} rows) in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
