"""Which lab defines of a v4_define_ab.py file won (lab only): a variant NAME=V wins when it is bit-identical in
every row, its median time ratio to the default over the cases is <= 1 - margin and no case is slower by more than
1%. Prints one NAME=V per winner (nothing when none won) for a device script that flips those defaults before timing
the grid (the flip is recorded there and committed afterwards with the same source).
With --best, prints one winner only: the lowest median ratio, except that a winner with fewer defines within 0.01 of
it is preferred (a define rides along only when it pays by itself); a combined variant prints as A=1,B=1.

    python lab/experiments/ab_verdict.py ab.json [--only SPEC_TABLE=1 MERGE_BATCH=1] [--margin 0.02] [--best]
"""
import argparse
import json
import statistics

ap = argparse.ArgumentParser()
ap.add_argument("path")
ap.add_argument("--only", nargs="*", default=None, help="consider these variants only")
ap.add_argument("--margin", type=float, default=0.02)
ap.add_argument("--best", action="store_true", help="print the one winner to flip (see the module doc)")
args = ap.parse_args()

rows = json.load(open(args.path))["rows"]
base = {(r["shape"], r["batch"], r["context"]): r["us"] for r in rows if r["variant"] == "default"}
winners = []
for v in sorted({r["variant"] for r in rows} - {"default"}):
    if args.only is not None and v not in args.only:
        continue
    mine = [r for r in rows if r["variant"] == v]
    if not mine or any(not r["bit_identical"] or not r["us"] for r in mine):
        continue
    ratios = [r["us"] / base[(r["shape"], r["batch"], r["context"])] for r in mine
              if base.get((r["shape"], r["batch"], r["context"]))]
    if len(ratios) == len(mine) and statistics.median(ratios) <= 1 - args.margin and max(ratios) <= 1.01:
        winners.append((statistics.median(ratios), len(v.split(",")), v))
if args.best and winners:
    top = min(winners)[0]
    winners = [min((w for w in winners if w[0] <= top + 0.01), key=lambda w: (w[1], w[0]))]
for _, _, v in winners:
    print(v)
