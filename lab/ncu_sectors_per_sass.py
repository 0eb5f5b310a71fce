"""Per-SASS memory counters of one kernel from `ncu --page source --csv --print-source sass` (lab only; issue 13):
the header's sector / request / L2 columns, then every global-memory instruction (LDG, LDGSTS, STG, RED, ATOM) with
its address, opcode and those columns, and their sums. Finds which copy asks L2 for more sectors than it needs
(call Y17: the twin's L1 asked 1.5x FA2's sectors at the same DRAM bytes).

    python lab/ncu_sectors_per_sass.py src.csv
"""
import csv
import sys

rows = list(csv.reader(open(sys.argv[1], newline="")))
hdr_i = next(i for i, r in enumerate(rows) if any("Address" in c for c in r) and any("Source" in c for c in r))
hdr, data = rows[hdr_i], [r for r in rows[hdr_i + 1:] if len(r) == len(rows[hdr_i])]
col = {h: i for i, h in enumerate(hdr)}
keep = [h for h in hdr if any(w in h for w in ("ector", "equest", "L2", "xcessive", "Executed"))]
print("columns:", keep)
src = next(h for h in hdr if h == "Source" or h.startswith("Source"))
addr = next(h for h in hdr if "Address" in h)


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


sums = {h: 0.0 for h in keep}
for r in data:
    s = r[col[src]].strip()
    op = s.split()[0] if s else ""
    if op.startswith("@"):
        op = s.split()[1]
    if not any(op.startswith(p) for p in ("LDG", "STG", "RED", "ATOM", "LD.", "ST.")):
        continue
    vals = {h: num(r[col[h]]) for h in keep}
    for h in keep:
        sums[h] += vals[h]
    print(r[col[addr]], s[:60].ljust(60), " ".join(f"{h.split('(')[0][:18]}={v:.0f}" for h, v in vals.items() if v))
print("sums:", {h: round(v) for h, v in sums.items() if v})
