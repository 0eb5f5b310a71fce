"""Plot eval/results/attention_bf16_h200.json: our CUDA BF16 kernel's speed relative to cuDNN and FA2.

    python eval/plot_attention_bf16.py eval/results/attention_bf16_h200.json
writes <json stem>_speedup.png beside it (one panel per shape, one line per batch and baseline).
"""
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path: str) -> None:
    res = json.loads(pathlib.Path(path).read_text())
    shapes = list(res["shapes"])
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 4), sharey=True)
    for ax, shape in zip(axes, shapes):
        for b, color in zip((1, 4, 16), ("C0", "C1", "C2")):
            rows = sorted((r for r in res["rows"] if r["shape"] == shape and r["batch"] == b), key=lambda r: r["context"])
            if not rows:
                continue
            ctx = [r["context"] // 1024 for r in rows]
            ax.plot(ctx, [r["cuda_vs_cudnn"] for r in rows], "-o", color=color, label=f"B={b} vs cuDNN")
            ax.plot(ctx, [r["cuda_vs_fa2"] for r in rows], "--s", color=color, label=f"B={b} vs FA2")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (K tokens)")
        ax.set_title(f"{shape} ({res['shapes'][shape]['q_heads']}/{res['shapes'][shape]['kv_heads']}, "
                     f"d={res['shapes'][shape]['head_dim']})")
    axes[0].set_ylabel("speed of our CUDA BF16 kernel (x baseline)")
    axes[-1].legend(fontsize=7)
    fig.suptitle(f"H200 BF16 decode attention, CUDA-graph GPU time, L2 flushed (commit {res['commit'][:7]})")
    fig.tight_layout()
    out = pathlib.Path(path).with_name(pathlib.Path(path).stem + "_speedup.png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1])
