"""Check the FIX_LAG producer's ring bookkeeping (compressed slots, look-up rings, cp.async groups) by
replaying its program order: every read must find its tile's data landed (its group complete at the last
cp_async_wait) and not yet overwritten."""
import sys

def run(S, n_tiles):
    LA = 3 * (S - 1); R = LA + 2
    groups = []            # list of lists of (ring, slot, tile)
    cur = []
    landed = {}            # (ring, slot) -> tile whose data is complete
    pending = {}           # (ring, slot) -> tile in flight
    content = {}
    def issue(ring, slot, tile, sync=False):
        if sync:
            content[(ring, slot)] = tile; landed[(ring, slot)] = tile; return
        content[(ring, slot)] = tile
        landed.pop((ring, slot), None)
        cur.append((ring, slot, tile))
    def commit():
        nonlocal cur
        groups.append(cur); cur = []
    def wait(n):
        keep = len(groups) - n
        for g in groups[:keep]:
            for ring, slot, tile in g:
                if content[(ring, slot)] == tile: landed[(ring, slot)] = tile
        del groups[:keep]
    def read(ring, slot, tile, what):
        assert content.get((ring, slot)) == tile, f"S={S} {what}: slot {ring}{slot} holds {content.get((ring, slot))}, want {tile}"
        assert landed.get((ring, slot)) == tile, f"S={S} {what}: tile {tile} in {ring}{slot} not landed"
    def ent_issue(m, sync):
        if m < n_tiles: issue("ent", m % R, m, sync)
    def seg_issue(m, sync):
        if m < n_tiles:
            read("ent", m % R, m, f"seg_issue {m}")
            issue("seg", m % R, m, sync)
    def main_issue(m):
        if m < n_tiles:
            read("ent", m % R, m, f"main_issue {m}"); read("seg", m % R, m, f"main_issue {m}")
            issue("cs", m % S, m)
    for m in range(LA): ent_issue(m, True)
    for m in range(2 * (S - 1)): seg_issue(m, True)
    for m in range(S - 1): main_issue(m); commit()
    for it in range(-1, n_tiles):
        nx = it + 1
        if nx < n_tiles: wait(S - 2)
        if it >= 0:  # fix_begin
            read("ent", it % R, it, f"fix ent {it}"); read("cs", it % S, it, f"fix slot {it}")
        if nx < n_tiles:
            read("ent", nx % R, nx, f"main ent {nx}"); read("cs", nx % S, nx, f"main slot {nx}")
        if it >= 0:  # fix_finish (reads the slot's entry chunks again for further steps)
            read("cs", it % S, it, f"fix_finish slot {it}")
        main_issue(nx + S - 1); seg_issue(nx + 2 * (S - 1), False); ent_issue(nx + LA, False); commit()
    wait(0)

for S in range(2, 9):
    for n in (0, 1, 2, 3, 5, 17, 40):
        run(S, n)
print("FIX_LAG ring bookkeeping: every read finds its tile landed and not overwritten (S = 2..8)")
