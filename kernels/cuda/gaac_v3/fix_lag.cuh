// The fused v3 kernel's FIX_LAG experiment (decode_attention_v3.cu): decode_fix cut in two for the
// software-pipelined producer. Included by decode_attention_v3.cu only when FIX_LAG is 1, right after
// decode_fix, whose types and helpers it uses; the default build never sees it (its PTX is unchanged).
#pragma once

// decode_fix cut in two for the pipelined producer: fix_begin does its first 32-entry step up to the loads
// (segment words, entries, raw words, pair constants, the stored row), fix_finish the fix and the store
// and any further steps. Same entries, same fix_group on the same words: the same rows as decode_fix.
struct FixStep {
  uint4 o, db;
  u16* dst;
  u32 entry, rw;
  unsigned bal;
  bool act;
};
struct FixState {
  int e0, n, rbase;
  int bnd[PSEG > 1 ? PSEG - 1 : 1];
  EntryWindow ew;
  FixStep s;
};
__device__ __forceinline__ void fix_load(FixState& f, int j, const u16* dec, const u8* slot, const u8* blk, int q,
                                         const u32* dbp_s, int lane) {
  using namespace gaac_v3;
  const int idx = f.e0 + j + lane;
  f.s.act = j + lane < f.n;
  f.s.entry = 0u;
  if (f.s.act) {
    const int off = ENTRY_OFF + 2 * idx;
    f.s.entry = f.ew.over ? static_cast<u32>(__ldg(reinterpret_cast<const u16*>(blk + off)))
                          : static_cast<u32>(*reinterpret_cast<const u16*>(slot + SMB + CWB + SEGB + off - f.ew.a0));
  }
  const bool raw = f.s.act && entry_raw(f.s.entry);
  f.s.bal = __ballot_sync(0xFFFFFFFFu, raw);
  f.s.rw = 0u;
  if (f.s.bal) {  // rare: raw words sit after the whole block's entry list
    const u32 tot = ldg32(blk + SEGTAB_OFF + 4 * SEGS) & 0xFFFFu;
    const u8* raws = blk + ((ENTRY_OFF + 2 * static_cast<int>(tot) + 3) & ~3);
    if (raw) f.s.rw = ldg32(raws + 4 * (f.rbase + __popc(f.s.bal & ((1u << lane) - 1u))));
  }
  if (f.s.act) {
    int s = 0;
#pragma unroll
    for (int k = 0; k < PSEG - 1; ++k) s += idx >= f.bnd[k];
    const int pos = entry_pos(f.s.entry), rr = pos % CHUNK_ROWS, cl = 32 * (PSEG * q + s) + pos / CHUNK_ROWS;
    const int c = cl % COLS;
    f.s.db = lds128(dbp_s + 4 * c);
    f.s.dst = const_cast<u16*>(dec) + (4 * (cl / COLS) + rr) * ROW + 8 * c;
    f.s.o = lds128(f.s.dst);
  }
}
__device__ __forceinline__ void fix_store(FixState& f) {
  using namespace gaac_v3;
  if (f.s.act) {
    const u32 d4[4] = {f.s.db.x, f.s.db.y, f.s.db.z, f.s.db.w};
    u32 ow[4] = {f.s.o.x, f.s.o.y, f.s.o.z, f.s.o.w};
    fix_group(ow, d4, f.s.entry, f.s.rw);
    sts128(f.s.dst, ow[0], ow[1], ow[2], ow[3]);
  }
  f.rbase += __popc(f.s.bal);
}
// The segment words and the first step's loads (every lane; n = 0 when the list is empty).
__device__ __forceinline__ void fix_begin(FixState& f, const u16* dec, const u8* slot, const u8* blk, int s0, int q,
                                          const u32* dbp_s, int lane) {
  const u8* seg = slot + SMB + CWB + ((4 * s0) & 15);
  const u32 w0 = lds32(seg), wn = lds32(seg + 4 * PSEG);
  f.e0 = static_cast<int>(w0 & 0xFFFFu);
  f.n = static_cast<int>(wn & 0xFFFFu) - f.e0;
  if (f.n <= 0) return;  // warp-uniform
#pragma unroll
  for (int k = 1; k < PSEG; ++k) f.bnd[k - 1] = static_cast<int>(lds32(seg + 4 * k) & 0xFFFFu);
  f.ew = entry_window(w0, wn);
  f.rbase = static_cast<int>(w0 >> 16);
  fix_load(f, 0, dec, slot, blk, q, dbp_s, lane);
}
__device__ __forceinline__ void fix_finish(FixState& f, const u16* dec, const u8* slot, const u8* blk, int q,
                                           const u32* dbp_s, int lane) {
  if (f.n <= 0) return;  // warp-uniform
  fix_store(f);
  for (int j = 32; j < f.n; j += 32) {  // warp-uniform trip count; rare (lists longer than 32 entries)
    fix_load(f, j, dec, slot, blk, q, dbp_s, lane);
    fix_store(f);
  }
}
