// GAAC format v3, FP8 tiles: whole blocks on the CPU, built from core_fp8.cuh (the bit logic) and
// host_block.h (the segment walk, the listing writer). Used by the g++ test driver (host_driver.cpp,
// tests/test_fp8_core.py). The walk is the CUDA decoder's: every chunk's main path first (lane =
// chunk), then one fix-up per entry that rebuilds its row from the record and the code words (the
// kernel's fix-up lanes do the same, so they never read back what the main path stored).
#pragma once
#include "core_fp8.cuh"
#include "host_block.h"

namespace gaac_v3 {

template <int M>
inline void load_chunk_fp8(const Geom& g, const uint8_t* blk, int c, uint32_t rec[1 + M], uint32_t w[3]) {
  for (int k = 0; k < 1 + M; ++k) rec[k] = ld32(blk + 4 * (1 + M) * c + 4 * k);
  const int s = c / SEG_CHUNKS, lane = c % SEG_CHUNKS;
  for (int k = 0; k < CODE_WORDS; ++k) w[k] = ld32(blk + code_word_off(g, s, lane, k));
}

// Decode one compressed FP8 block into codes out[row * D + channel]; b8p / dbp: the head's pair
// constants of base_n and (base_w - base_n) mod 256 (head_consts).
template <int M>
inline void decode_block_fp8(const Geom& g, const uint8_t* blk, const uint32_t* b8p, const uint32_t* dbp, uint8_t* out) {
  const int n_ent_total = ld32(blk + g.segtab_off + 4 * g.segs) & 0xFFFF;
  for (int c = 0; c < g.chunks; ++c) {
    uint32_t rec[1 + M], w[3], v[8];
    load_chunk_fp8<M>(g, blk, c, rec, w);
    const int col = chunk_col(g, c), row0 = chunk_row0(g, c);
    decode_chunk_fp8<M>(rec, w, b8p + 4 * col, v);
    for (int r = 0; r < 4; ++r)
      for (int k = 0; k < 2; ++k) st32(out + (row0 + r) * g.D + GROUP * col + 4 * k, v[2 * r + k]);
  }
  for (int s = 0; s < g.segs; ++s)
    for_each_entry(g, blk, s, n_ent_total, [&](int c, int r, uint32_t entry, uint32_t raw_byte) {
      uint32_t rec[1 + M], w[3], v[2];
      load_chunk_fp8<M>(g, blk, c, rec, w);
      const int col = chunk_col(g, c);
      fix_row_fp8<M>(sm_row<M>(rec, r), w, b8p + 4 * col, dbp + 4 * col, r, entry, raw_byte, v);
      for (int k = 0; k < 2; ++k) st32(out + (chunk_row0(g, c) + r) * g.D + GROUP * col + 4 * k, v[k]);
    });
}

// Encode one FP8 block x (codes, row-major [T, D]) with the head's uint8 bases base_n / base_w into
// row (cap bytes kept; zeros after the block). Returns the stored length (> cap: stored as codes).
template <int M>
inline int encode_block_fp8(const Geom& g, const uint8_t* x, const uint8_t* bn, const uint8_t* bw, uint8_t* row, int cap) {
  EncodeScratch sc;
  int n_ent, n_raw;
  SegmentExpCode sec;
  auto segment = [&](int s, int m, uint8_t* buf) -> const SegmentExpCode& {  // one chunk at a time
    for (int lane = 0; lane < m; ++lane) {
      const int c = SEG_CHUNKS * s + lane, col = chunk_col(g, c), row0 = chunk_row0(g, c);
      uint32_t xv[8], b8w[2], b16w[2];
      for (int r = 0; r < 4; ++r)
        for (int k = 0; k < 2; ++k) xv[2 * r + k] = ld32(x + (size_t)(row0 + r) * g.D + GROUP * col + 4 * k);
      std::memcpy(b8w, bn + 8 * col, 8);
      std::memcpy(b16w, bw + 8 * col, 8);
      ChunkCodeFP8 cc;
      encode_chunk_fp8<M>(xv, b8w, b16w, cc);
      for (int k = 0; k < 1 + M; ++k) st32(&buf[4 * (1 + M) * c + 4 * k], cc.rec[k]);
      put_lane(sec, lane, cc);
    }
    return sec;
  };
  const int len = encode_listing(g, segment, sc, row, cap, &n_ent, &n_raw);
  if (len < cap) std::memset(row + len, 0, cap - len);
  return len;
}

}  // namespace gaac_v3
