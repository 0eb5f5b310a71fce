"""Does pool layout matter to the v4 kernel? (lab, one GPU) Block size (tokens per page) and shuffled vs in-order
pools, the fused kernel and its BF16 twin each on its own layout, cuDNN on the dense tensors, same process.

    python lab/experiments/v4_layout_ab.py --out $OUT/v4_layout_ab.json
"""
import torch
import v4_lab  # noqa: F401 - the frame; puts eval/ on the path

import harness  # noqa: E402

CASES = [("qwen3-8b", 1, 65536), ("qwen3-8b", 1, 131072), ("qwen3-8b", 4, 65536), ("smollm2-135m", 1, 32768)]
LAYOUTS = [(64, True), (64, False), (256, True), (256, False)]


def measure(dev):
    from gaac_hf.calibration.synthetic import calibrate, synthetic_kv
    from gaac_hf.kernels import LaunchConfig
    from gaac_hf.kernels.cuda.attention import bf16_decode_attention_tensors, pack_paged_bf16
    from gaac_hf.kernels.cuda.fused_attention_v4 import gaac_decode_attention_v4, pack_paged_v4, twin_config

    for shape, B, S in CASES:
        hq, hkv, d = harness.ATTENTION_SHAPES[shape]
        k = synthetic_kv((B, hkv, S, d), "k", 0, device=dev)
        v = synthetic_kv((B, hkv, S, d), "v", 1, device=dev)
        q = torch.randn(B, hq, d, generator=torch.Generator(device=dev).manual_seed(0), device=dev).to(torch.bfloat16)
        b16 = torch.stack([calibrate(k)[1], calibrate(v)[1]])
        out = torch.empty_like(q)
        row = dict(shape=shape, batch=B, context=S, us={}, same={})
        def one(tag, T, shuffle):
            kv = pack_paged_v4(k, v, [S] * B, T, b16, shuffle=shuffle)
            pk, pv = pack_paged_bf16(k, [S] * B, T, shuffle=shuffle), pack_paged_bf16(v, [S] * B, T, shuffle=shuffle)
            tw = twin_config(q, kv, LaunchConfig())
            g = lambda: gaac_decode_attention_v4(q, kv, out=out)  # noqa: E731
            t = lambda: bf16_decode_attention_tensors(q, pk["raw"], pv["raw"], pk["table"], pv["table"], pk["tail"],  # noqa: E731
                                                      pv["tail"], pk["num_blocks"], pk["tail_len"], config=tw, out=out)
            row["us"][f"gaac_{tag}"], _ = harness.time_and_error(tag, lambda: g)
            x = g().clone()
            row["us"][f"twin_{tag}"], _ = harness.time_and_error(tag, lambda: t)
            row["same"][tag] = bool(torch.equal(x.view(torch.int16), t().view(torch.int16)))
            del kv, pk, pv
            torch.cuda.empty_cache()
        for T, shuffle in LAYOUTS:
            tag = f"T{T}_{'shuffled' if shuffle else 'ordered'}"
            try:
                one(tag, T, shuffle)
            except Exception as e:  # recorded, the other layouts go on
                row["us"][f"error_{tag}"] = None
                row["same"][tag] = repr(e)[:200]
            torch.cuda.empty_cache()

        row["us"]["cudnn"], _ = harness.time_and_error("cudnn", lambda: harness.sdpa_decode("cudnn", q, k, v))
        yield row
        print(shape, B, S, {kk: round(vv, 1) for kk, vv in row["us"].items() if vv}, row["same"], flush=True)
        del k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    v4_lab.run(measure)
