"""Plots and alias rows for eval/results/attention_h200.json (runs on the CPU, after the GPU bench).

    python eval/plot_attention.py eval/results/attention_h200.json
    python eval/plot_attention.py OUT.json --merge A.json B.json   # runs of one grid split over GPUs

``--merge`` writes OUT.json from several runs of ``bench_attention.py`` (e.g. one process per GPU of a
two-GPU host, each on a subset of the cases): their rows, each tagged with ``part`` (the index of the
run it came from), and per run its command, GPU, launch-config sweep and cut cases under ``parts``.
Speedups stay per row: every row's baselines were measured in the same process as its GAAC time.

Adds rows for shapes whose attention is identical to a measured one (Llama-3.1-8B = Qwen3-8B:
32 q / 8 kv heads, d=128), flagged ``alias_of`` (not re-measured), and writes
eval/results/attention_h200_us.png (time per method) and attention_h200_speedup.png (GAAC vs each).
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # eval/harness.py, also when loaded by path
import harness  # noqa: E402

plt = harness.pyplot()

ALIASES = {"llama-3.1-8b": "qwen3-8b"}


def merge(out, paths):
    runs = [json.loads(Path(x).read_text()) for x in paths]
    first = runs[0]
    merged = {k: v for k, v in first.items() if k not in ("rows", "cut", "sweep", "config", "command")}
    merged["command"] = "python eval/plot_attention.py " + out + " --merge " + " ".join(paths)
    merged["parts"] = [dict(file=x, commit=r.get("commit"), command=r.get("command"), gpu=r.get("gpu"), config=r.get("config"),
                            sweep=r.get("sweep"), cut=r.get("cut", [])) for x, r in zip(paths, runs)]
    merged["rows"] = [dict(r, part=i) for i, run in enumerate(runs) for r in run["rows"] if "alias_of" not in r]
    merged["cut"] = [c for run in runs for c in run.get("cut", [])]
    harness.write_result(Path(out), merged)


def main(path):
    p = Path(path)
    d = json.loads(p.read_text())
    rows = [r for r in d["rows"] if "alias_of" not in r]
    for alias, src in ALIASES.items():
        rows += [dict(r, shape=alias, alias_of=src) for r in rows if r["shape"] == src]
    d["rows"] = rows
    p.write_text(json.dumps(d, indent=1))  # the same measurements plus aliases: keep their provenance
    meas = [r for r in rows if "alias_of" not in r]
    shapes = sorted({r["shape"] for r in meas})
    batches = sorted({r["batch"] for r in meas})
    for kind in ("us", "speedup"):
        fig, axes = plt.subplots(len(shapes), len(batches), figsize=(4 * len(batches), 3.2 * len(shapes)), squeeze=False)
        for i, s in enumerate(shapes):
            for j, b in enumerate(batches):
                ax = axes[i][j]
                rs = sorted((r for r in meas if r["shape"] == s and r["batch"] == b), key=lambda r: r["context"])
                if not rs:
                    ax.set_visible(False)
                    continue
                x = [r["context"] // 1024 for r in rs]
                twin = "cuda_bf16" if "cuda_bf16" in rs[0]["us"] else "bf16_ours"  # v3 grid / v2 grid
                if kind == "us":
                    for m in ("fa2", "cudnn", twin, "gaac", "gaac_decompress_cudnn"):
                        if all(m in r["us"] for r in rs):
                            ax.plot(x, [r["us"][m] for r in rs], marker="o", label=m)
                    ax.set_yscale("log")
                    ax.set_ylabel("us (median)")
                else:
                    for m in ("fa2", "cudnn", twin):
                        ax.plot(x, [r["speedup"][m] if "speedup" in r else r["us"][m] / r["us"]["gaac"] for r in rs],
                                marker="o", label=f"vs {m}")
                    ax.axhline(1.0, color="k", lw=0.5)
                    ax.set_ylabel("speedup of GAAC (>1 = faster)")
                ax.set_xscale("log", base=2)
                ax.set_xlabel("context (K tokens)")
                ax.set_title(f"{s} B={b}")
                ax.legend(fontsize=7)
        fig.suptitle(f"decode attention, {d['gpu']}, {d.get('command', '').split()[1] if d.get('command') else ''}")
        fig.tight_layout()
        fig.savefig(p.with_name(p.stem + f"_{kind}.png"), dpi=80)


if __name__ == "__main__" and "--merge" in sys.argv:
    i = sys.argv.index("--merge")
    merge(sys.argv[1], sys.argv[i + 1:])
    main(sys.argv[1])
elif __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "eval/results/attention_h200.json")
