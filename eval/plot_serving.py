"""One file and one plot for the serving benchmark's H200 runs (runs on the CPU, after the GPU calls).

    python eval/plot_serving.py eval/results/serving_h200.json --merge A.json B.json

``bench_serving.py`` runs one engine pair per budget; budgets measured in different device calls (each call
has a time limit) are merged here: the rows of every run, each tagged with ``part`` (the index of its run),
and per run its command, commit, prompt lengths and output length under ``parts`` (runs may differ in
prompts: each row's BF16 and GAAC engines served the same requests, so the gains stay per row). Writes the
merged JSON and ``<out stem>.png``: max concurrent requests, output tokens/s and KV bytes per token, BF16
engine vs GAAC pages, per budget.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # eval/harness.py, also when loaded by path
import harness  # noqa: E402

_RUN_KEYS = ("commit", "dirty", "command", "date", "requests", "prompt_tokens", "new_tokens", "limits", "fused_decode")


def merge(out, paths):
    runs = [json.loads(Path(x).read_text()) for x in paths]
    for x, r in zip(paths, runs):
        if r.get("partial"):
            raise SystemExit(f"{x} is a partial run (an engine is missing): measure it whole, or pair it with "
                             f"bench_serving.py --bf16-from")
    models = {r["model"] for r in runs}
    if len(models) != 1:
        raise SystemExit(f"runs of different models cannot share one file: {sorted(models)}")
    merged = {k: v for k, v in runs[0].items() if k not in ("rows",) + _RUN_KEYS}
    merged["command"] = "python eval/plot_serving.py " + str(out) + " --merge " + " ".join(map(str, paths))
    merged["parts"] = [dict(file=str(x), **{k: r.get(k) for k in _RUN_KEYS}) for x, r in zip(paths, runs)]
    merged["rows"] = sorted((dict(row, part=i) for i, r in enumerate(runs) for row in r["rows"]),
                            key=lambda row: row["budget_bytes"])
    harness.write_result(Path(out), merged)
    return merged


def plot(data, png):
    plt = harness.pyplot()
    rows = data["rows"]
    parts = data.get("parts") or [data]

    def label(row):
        run = parts[row.get("part", 0)]
        lens = run["prompt_tokens"]
        return (f"{row['budget_bytes'] / (1 << 30):g} GiB\n{len(lens)} req\n{min(lens) / 1000:.1f}-{max(lens) / 1000:.1f}K in\n"
                f"{run['new_tokens']} out")

    labels = [label(row) for row in rows]
    panels = (("max_concurrent", "most concurrent requests"), ("tokens_per_s", "output tokens / s"),
              ("kv_bytes_per_token", "KV bytes per token"))
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.2))
    for ax, (key, title) in zip(axes, panels):
        for j, kind in enumerate(("bf16", "gaac")):
            xs = [i + (j - 0.5) * 0.38 for i in range(len(rows))]
            vals = [row[kind][key] for row in rows]
            ax.bar(xs, vals, width=0.38, label={"bf16": "BF16 paged (transformers)", "gaac": "GAAC pages"}[kind])
            for x, v in zip(xs, vals):
                ax.annotate(f"{v:,.0f}" if v >= 100 or isinstance(v, int) else f"{v:.1f}", (x, v), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(rows)), labels)
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"{data['model']} on {data.get('gpu', data['device'])}, equal KV budget (transformers "
                 f"{data['versions']['transformers']}; {Path(png).with_suffix('.json').name})", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--merge", nargs="+", help="bench_serving.py results to merge into OUT")
    args = ap.parse_args(argv)
    data = merge(args.out, args.merge) if args.merge else json.loads(Path(args.out).read_text())
    plot(data, Path(args.out).with_suffix(".png"))
    print(f"wrote {args.out} and {Path(args.out).with_suffix('.png')}")


if __name__ == "__main__":
    main()
