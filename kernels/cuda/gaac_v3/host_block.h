// GAAC format v3: whole blocks on the CPU, built from core.cuh (the one copy of the bit logic).
//
// Shared by the g++ test driver (host_driver.cpp, tests/test_v3_core.py) and the CPU library of
// gaac_hf.kernels.cpu (kernels/cpu/gaac_cpu.cpp): where each chunk's bytes sit in a block and in which
// order a warp would walk them (lane = chunk of a segment), plus the structural check every CPU decode
// runs. Nothing here changes a bit: the bits come from decode_chunk / fix_group / encode_chunk.
#pragma once
#include <cstring>
#include <vector>

#include "core.cuh"

namespace gaac_v3 {

inline uint32_t ld32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
inline void st32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// Pre-shifted pair constants of a head: b8p/dbp uint32 [D/2] from the uint8 bases [D] (the layout of
// PagedTensorV3.b8p / .dbp in kernels/paged.py: pair p of chunk column col at 4 * col + p).
inline void head_consts(const Geom& g, const uint8_t* b8, const uint8_t* b16, uint32_t* b8p, uint32_t* dbp) {
  for (int col = 0; col < g.cols; ++col) column_consts(b8 + 8 * col, b16 + 8 * col, b8p + 4 * col, dbp + 4 * col);
}

// Structural check of the compressed block at blk (avail readable bytes from blk on): the segment
// table starts at 0, grows by at most a segment's groups (raw counts by at most the wide counts),
// the block ends within avail, and each segment's entries name groups inside it in increasing order.
// Mirrors the validate=True checks of gaac_hf.codec.v3.decode_pool_v3. 0 = well formed.
inline int check_block(const Geom& g, const uint8_t* blk, long long avail) {
  if (avail < g.entry_off) return 1;
  uint32_t prev = ld32(blk + g.segtab_off);
  if (prev != 0) return 2;
  for (int s = 0; s < g.segs; ++s) {
    const uint32_t cur = ld32(blk + g.segtab_off + 4 * (s + 1));
    const int de = (int)(cur & 0xFFFF) - (int)(prev & 0xFFFF), dr = (int)(cur >> 16) - (int)(prev >> 16);
    if (de < 0 || de > CHUNK_ROWS * seg_chunks(g, s) || dr < 0 || dr > de) return 2;
    prev = cur;
  }
  const int n_ent = prev & 0xFFFF, n_raw = prev >> 16;
  if (block_bytes(g, n_ent, n_raw) > avail) return 3;
  for (int s = 0; s < g.segs; ++s) {
    const int e0 = ld32(blk + g.segtab_off + 4 * s) & 0xFFFF, e1 = ld32(blk + g.segtab_off + 4 * (s + 1)) & 0xFFFF;
    int last = -1;
    for (int i = e0; i < e1; ++i) {
      const int pos = entry_pos(blk[g.entry_off + 2 * i]);
      if (pos <= last || pos / CHUNK_ROWS >= seg_chunks(g, s)) return 4;
      last = pos;
    }
  }
  return 0;
}

// The fix-up walk of segment s: fix(c, r, entry, raw) for each listed group (chunk c, row r) in entry
// order, raw = its raw word (g.raw_word bytes, little-endian; 0 unless the entry is raw). Raw words
// in entry order from the segment's start, as a warp finds them (one lane per entry).
template <class Fix>
inline void for_each_entry(const Geom& g, const uint8_t* blk, int s, int n_ent_total, Fix fix) {
  const uint32_t s0 = ld32(blk + g.segtab_off + 4 * s), s1 = ld32(blk + g.segtab_off + 4 * (s + 1));
  const int e0 = s0 & 0xFFFF, n = (int)(s1 & 0xFFFF) - e0;
  int raw_idx = s0 >> 16;
  for (int i = 0; i < n; ++i) {
    const uint32_t entry = blk[g.entry_off + 2 * (e0 + i)] | (blk[g.entry_off + 2 * (e0 + i) + 1] << 8);
    const int pos = entry_pos(entry);
    uint32_t rw = 0;
    if (entry_raw(entry)) {
      const uint8_t* p = blk + raw_off(g, n_ent_total) + g.raw_word * raw_idx++;
      for (int b = 0; b < g.raw_word; ++b) rw |= (uint32_t)p[b] << (8 * b);
    }
    fix(SEG_CHUNKS * s + pos / CHUNK_ROWS, pos % CHUNK_ROWS, entry, rw);
  }
}

// Decode one compressed block into BF16 pair words out[row * out_row_words + pair] (row-major
// [T, D] when out_row_words = D/2). b8p / dbp: the head's pair constants (head_consts).
inline void decode_block(const Geom& g, const uint8_t* blk, const uint32_t* b8p, const uint32_t* dbp, uint32_t* out,
                         int out_row_words) {
  const uint32_t seg_total = ld32(blk + g.segtab_off + 4 * g.segs);
  const int n_ent_total = seg_total & 0xFFFF;
  for (int s = 0; s < g.segs; ++s) {
    const int m = seg_chunks(g, s);
    // The main path, one lane per chunk, all lanes of the segment at once (structure of arrays, so
    // that the compiler vectorizes across lanes as a warp does; padding lanes compute unused words).
    alignas(64) uint32_t smv[8][SEG_CHUNKS], wv[CODE_WORDS][SEG_CHUNKS], bv[4][SEG_CHUNKS], ov[16][SEG_CHUNKS];
    for (int k = 0; k < CODE_WORDS; ++k) {
      std::memcpy(wv[k], blk + code_word_off(g, s, 0, k), 4 * m);  // word k of every lane: contiguous
      std::memset(wv[k] + m, 0, 4 * (SEG_CHUNKS - m));
    }
    for (int lane = 0; lane < SEG_CHUNKS; ++lane) {
      const int c = lane < m ? SEG_CHUNKS * s + lane : SEG_CHUNKS * s, col = chunk_col(g, c);
      for (int i = 0; i < 8; ++i) smv[i][lane] = ld32(blk + 32 * c + 4 * i);
      for (int p = 0; p < 4; ++p) bv[p][lane] = b8p[4 * col + p];
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r)
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p)
        for (int lane = 0; lane < SEG_CHUNKS; ++lane)
          ov[4 * r + p][lane] = decode_pair(smv[2 * r + (p >> 1)][lane], wv[0][lane], wv[1][lane], wv[2][lane], bv[p][lane], r, p);
    for (int lane = 0; lane < m; ++lane) {
      const int c = SEG_CHUNKS * s + lane, col = chunk_col(g, c), row0 = chunk_row0(g, c);
      for (int r = 0; r < 4; ++r)
        for (int p = 0; p < 4; ++p) out[(row0 + r) * out_row_words + 4 * col + p] = ov[4 * r + p][lane];
    }
    for_each_entry(g, blk, s, n_ent_total, [&](int c, int r, uint32_t entry, uint32_t rw) {
      const int col = chunk_col(g, c), row = chunk_row0(g, c) + r;
      fix_group(out + row * out_row_words + 4 * col, dbp + 4 * col, entry, rw);
    });
  }
}

// Buffers of encode_block_rows, kept by the caller across blocks (no allocation per block).
struct EncodeScratch {
  std::vector<uint8_t> buf;
  std::vector<uint32_t> raws;
};

// The exponent half of encode_chunk's outputs (ExpCode) for the SEG_CHUNKS lanes of a segment, field by
// field (structure of arrays); SegmentCode adds the BF16 sign/mantissa words.
struct SegmentExpCode {
  uint32_t w[CODE_WORDS][SEG_CHUNKS], entry[4][SEG_CHUNKS], rword[4][SEG_CHUNKS];
  uint32_t wide[SEG_CHUNKS], raw[SEG_CHUNKS];
};
struct SegmentCode : SegmentExpCode {
  uint32_t sm[8][SEG_CHUNKS];
};

// Lane `lane` of out = the chunk code cc.
inline void put_lane(SegmentExpCode& out, int lane, const ExpCode& cc) {
  for (int k = 0; k < CODE_WORDS; ++k) out.w[k][lane] = cc.w[k];
  for (int r = 0; r < 4; ++r) {
    out.entry[r][lane] = cc.entry[r];
    out.rword[r][lane] = cc.rword[r];
  }
  out.wide[lane] = cc.wide;
  out.raw[lane] = cc.raw;
}

// encode_chunk on every lane of a segment: xv[4r + p][lane] = pair p of row r of the lane's chunk,
// bw[0..1][lane] / bw[2..3][lane] = its base8 / base16 words. flatten inlines encode_chunk here (and
// core.cuh's GAAC_UNROLL unrolls its loops), so the compiler vectorizes the lane loop (16 lanes per
// 512-bit operation with AVX-512) as a warp runs it: ~4x faster than one chunk at a time, same bytes.
#if defined(__GNUC__)
#define GAAC_FLATTEN __attribute__((flatten))
#else
#define GAAC_FLATTEN
#endif
GAAC_FLATTEN inline void encode_segment(const uint32_t (&xv)[16][SEG_CHUNKS], const uint32_t (&bw)[4][SEG_CHUNKS],
                                    SegmentCode& out) {
#pragma GCC ivdep
  for (int lane = 0; lane < SEG_CHUNKS; ++lane) {
    uint32_t x[16];
    for (int j = 0; j < 16; ++j) x[j] = xv[j][lane];
    const uint32_t b8w[2] = {bw[0][lane], bw[1][lane]}, b16w[2] = {bw[2][lane], bw[3][lane]};
    ChunkCode cc;
    encode_chunk(x, b8w, b16w, cc);
    for (int i = 0; i < 8; ++i) out.sm[i][lane] = cc.sm[i];
    put_lane(out, lane, cc);
  }
}

// Encode one block segment by segment into out: its first min(length, cap) bytes (nothing after them
// is written). segment(s, m, buf) encodes the m chunks of segment s (lane = chunk of the segment),
// writes their sign/mantissa bytes into the block buf and returns their codes (a SegmentExpCode, raw
// words of g.raw_word bytes); the code words, entries, raw words, segment table and padding are
// written here, in chunk order (entries and raw words in (chunk, row) order, as a warp's prefix sums
// place them). Returns the block's stored length (may exceed cap: then the caller stores the block
// uncompressed); n_ent / n_raw: its wide and raw group counts (the totals of its segment table).
template <class Segment>
inline int encode_listing(const Geom& g, Segment segment, EncodeScratch& sc, uint8_t* out, int cap, int* n_ent_out,
                          int* n_raw_out) {
  // room for any block before truncation to cap; every byte of a block is written below (the code
  // words and sm bytes whole, the padding after the entries and after the raw words explicitly)
  const size_t room = 2 * (size_t)cap + 64 * g.chunks;
  if (sc.buf.size() < room) sc.buf.resize(room);
  uint8_t* buf = sc.buf.data();
  sc.raws.clear();
  int n_ent = 0;
  for (int s = 0; s < g.segs; ++s) {
    const int m = seg_chunks(g, s);
    st32(&buf[g.segtab_off + 4 * s], (uint32_t)n_ent | ((uint32_t)sc.raws.size() << 16));
    const SegmentExpCode& cc = segment(s, m, buf);
    for (int k = 0; k < CODE_WORDS; ++k) std::memcpy(&buf[code_word_off(g, s, 0, k)], cc.w[k], 4 * m);  // [k][lane]
    for (int lane = 0; lane < m; ++lane) {
      if (!cc.wide[lane]) continue;
      for (int r = 0; r < 4; ++r) {
        if ((cc.wide[lane] >> r) & 1) {  // entries go straight to their place: segments are walked in order
          const uint32_t e = cc.entry[r][lane] | (uint32_t)(4 * lane + r);
          buf[g.entry_off + 2 * n_ent] = e & 0xFF;
          buf[g.entry_off + 2 * n_ent + 1] = (e >> 8) & 0xFF;
          ++n_ent;
        }
        if ((cc.raw[lane] >> r) & 1) sc.raws.push_back(cc.rword[r][lane]);
      }
    }
  }
  const int n_raw = (int)sc.raws.size();
  st32(&buf[g.segtab_off + 4 * g.segs], (uint32_t)n_ent | ((uint32_t)n_raw << 16));
  const int ro = raw_off(g, n_ent), len = block_bytes(g, n_ent, n_raw);
  std::memset(&buf[g.entry_off + 2 * n_ent], 0, ro - (g.entry_off + 2 * n_ent));
  for (int i = 0; i < n_raw; ++i)
    for (int b = 0; b < g.raw_word; ++b) buf[ro + g.raw_word * i + b] = (sc.raws[i] >> (8 * b)) & 0xFF;
  std::memset(&buf[ro + g.raw_word * n_raw], 0, len - (ro + g.raw_word * n_raw));
  std::memcpy(out, buf, len < cap ? len : cap);
  *n_ent_out = n_ent;
  *n_raw_out = n_raw;
  return len;
}

// Encode one block whose row r (D/2 BF16 pair words) is at row_words(r), with the head's uint8 bases
// (encode_listing). The rows come through a callable so that a strided [B, H, S, D] tensor needs no copy.
// Per segment, the lanes' inputs are gathered into structure-of-arrays form and encode_segment runs
// encode_chunk on all of them.
template <class RowWords>
inline int encode_block_rows(const Geom& g, RowWords row_words, const uint8_t* b8, const uint8_t* b16, EncodeScratch& sc,
                             uint8_t* out, int cap, int* n_ent_out, int* n_raw_out) {
  alignas(64) SegmentCode cc;
  auto segment = [&](int s, int m, uint8_t* buf) -> const SegmentExpCode& {
    // the lanes' inputs, lane = chunk of the segment (as decode_block reads them)
    alignas(64) uint32_t xv[16][SEG_CHUNKS], bw[4][SEG_CHUNKS];
    for (int lane = 0; lane < m;) {  // runs of lanes in one row group: consecutive columns of 4 rows
      const int c = SEG_CHUNKS * s + lane, col0 = chunk_col(g, c), row0 = chunk_row0(g, c);
      const int run = g.cols - col0 < m - lane ? g.cols - col0 : m - lane;
      for (int r = 0; r < 4; ++r) {
        const uint32_t* xr = row_words(row0 + r) + 4 * col0;
        for (int i = 0; i < run; ++i)
          for (int p = 0; p < 4; ++p) xv[4 * r + p][lane + i] = xr[4 * i + p];
      }
      for (int i = 0; i < run; ++i) {
        bw[0][lane + i] = ld32(b8 + 8 * (col0 + i));
        bw[1][lane + i] = ld32(b8 + 8 * (col0 + i) + 4);
        bw[2][lane + i] = ld32(b16 + 8 * (col0 + i));
        bw[3][lane + i] = ld32(b16 + 8 * (col0 + i) + 4);
      }
      lane += run;
    }
    for (int lane = m; lane < SEG_CHUNKS; ++lane) {  // padding lanes (a last, short segment): encoded, dropped
      for (int j = 0; j < 16; ++j) xv[j][lane] = 0;
      for (int j = 0; j < 4; ++j) bw[j][lane] = 0;
    }
    encode_segment(xv, bw, cc);
    for (int lane = 0; lane < m; ++lane)
      for (int i = 0; i < 8; ++i) st32(&buf[32 * (SEG_CHUNKS * s + lane) + 4 * i], cc.sm[i][lane]);
    return cc;
  };
  return encode_listing(g, segment, sc, out, cap, n_ent_out, n_raw_out);
}

// Encode one block x (BF16 pair words, row-major [T, D]) with the head's uint8 bases into row (cap
// bytes kept; zeros after the block). Returns the block's stored length (may exceed cap: then the
// block is stored as BF16 by the caller).
inline int encode_block(const Geom& g, const uint32_t* x, const uint8_t* b8, const uint8_t* b16, uint8_t* row, int cap) {
  EncodeScratch sc;
  int n_ent, n_raw;
  const int words_per_row = g.D / 2;
  const int len = encode_block_rows(g, [&](int r) { return x + (size_t)r * words_per_row; }, b8, b16, sc, row, cap,
                                    &n_ent, &n_raw);
  if (len < cap) std::memset(row + len, 0, cap - len);
  return len;
}

}  // namespace gaac_v3
