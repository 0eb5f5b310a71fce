"""Summarise an `ncu --page source --csv --print-source sass` export (lab only): the columns, the
total stall samples, the not-issued samples by reason over all instructions, the top instructions by samples with their stall-reason split, and samples
per opcode.   python lab/ncu_src_summary.py src.csv [N]"""
import collections
import csv
import sys

rows = list(csv.reader(open(sys.argv[1], newline="")))
n_top = int(sys.argv[2]) if len(sys.argv) > 2 else 70
hdr_i = next(i for i, r in enumerate(rows) if any("Address" in c for c in r) and any("Source" in c for c in r))
hdr, data = rows[hdr_i], rows[hdr_i + 1:]
print("columns:", hdr)
col = {h: i for i, h in enumerate(hdr)}
samp = next(h for h in hdr if "Sampling (All" in h)
reasons = [h for h in hdr if h.startswith("stall_") or ("Stall" in h and h != samp and "Sampling" not in h)]


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


tot = sum(num(r[col[samp]]) for r in data if len(r) == len(hdr))
print(f"total samples {tot:.0f}")
by_op = collections.Counter()
good = [r for r in data if len(r) == len(hdr)]
for r in good:
    op = r[col["Source"]].split()[0] if r[col["Source"]].split() else "?"
    if op.startswith("@"):
        op = r[col["Source"]].split()[1]
    by_op[op.split(".")[0]] += num(r[col[samp]])
print("samples per opcode:", [(k, round(100 * v / tot, 1)) for k, v in by_op.most_common(20)])
not_issued = [h for h in reasons if "(Not Issued)" in h]
by_reason = {h: sum(num(r[col[h]]) for r in good) for h in not_issued}
nt = sum(by_reason.values()) or 1.0
print("not-issued samples by reason, all instructions:",
      [(h.replace("stall_", "").replace(" (Not Issued)", ""), round(100 * v / nt, 1))
       for h, v in sorted(by_reason.items(), key=lambda kv: -kv[1]) if v])
extra = [h for h in hdr if "Executed" in h and "Instructions" in h][:1]
for r in sorted(good, key=lambda r: -num(r[col[samp]]))[:n_top]:
    s = num(r[col[samp]])
    top = sorted(((num(r[col[h]]), h) for h in reasons), reverse=True)[:3]
    ex = " ".join(f"{r[col[h]]}" for h in extra)
    print(f"{r[col['Address']]:>8} {100 * s / tot:5.2f}% ex={ex:>10} {r[col['Source']][:60]:60s} "
          + " ".join(f"{h.replace('stall_', '')[:18]}={v:.0f}" for v, h in top if v))
