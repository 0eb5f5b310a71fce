"""SASS warp-instructions per value of the v3 decoder with another window / thread count (session 38, CPU).

    python lab/experiments/sass_window_count.py WINDOW_SEGS DECODE_THREADS

eval/sass_decoder.py's count (the loop-free gaac_v3_count_item, steps k = 1, 2) with -DWINDOW_SEGS / -DDECODE_THREADS
added to the build, and the per-value cost summed over windows of WINDOW_SEGS segments (the script's own rule assumes
the product's windows). Question it answers: does the 2-segment x 256-thread decoder (3 points faster on the H100,
call Y32) keep issue 14's <= 0.15 warp-instructions per value?
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "eval"))
import sass_decoder as s  # noqa: E402

W, T = int(sys.argv[1]), int(sys.argv[2])
orig = s.nvcc_cmd
s.nvcc_cmd = lambda *a, **k: orig(*a, **k)[:-3] + [f"-DWINDOW_SEGS={W}", f"-DDECODE_THREADS={T}"] + orig(*a, **k)[-3:]
p = s.wide_share()
with tempfile.TemporaryDirectory() as tmp:
    for d in (64, 128, 256):
        r = s.measure(d, tmp, p)
        rest, step = r["sass_window_without_fix_steps"], r["sass_fix_step"]
        chunks = 16 * (d // 8)  # 64-token block: 16 chunks of 4 rows x d / 8 lanes
        segs = -(-chunks // 32)
        cost = values = 0.0
        for w0 in range(0, segs, W):
            ch = min(chunks, 32 * (w0 + W)) - 32 * w0
            cost += rest + s.expected_steps(4 * ch, p) * step
            values += 32 * ch
        print(f"d={d} W{W} T{T}: window {rest} + fix step {step}: {cost / values:.4f} warp-instr/value")
