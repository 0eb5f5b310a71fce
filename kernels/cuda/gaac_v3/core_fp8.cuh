// GAAC format v3, FP8 tiles (E4M3, E5M2): the chunk decoder and encoder, header-only, __host__ __device__.
//
// Spec: docs/FORMAT_V3.md "FP8 tiles" and gaac_hf/codec/fp8.py (the PyTorch reference this must match bit
// for bit). Compiled by g++ in the tests (tests/test_fp8_core.py, through host_driver.cpp) and by
// nvcc/NVRTC in the CUDA kernels (kernels.cu built with -DGAAC_FP8=1 | 2).
//
// Design followed: our own BF16 v3 core (core.cuh), unchanged. An FP8 value is rebuilt in the lane
// layout of a BF16 pair word: sign at bit 15, exponent field at bits 7-14 (its low E bits), mantissa
// just below at bits 7-M..6. So the code words (pair_field), the pre-shifted base constants
// (column_consts with base_n / base_w), the main path (assemble_pair: one LOP3 + the code field) and
// the fix-up of listed groups (fix_group: exponent + (base_w - base_n) + 8 hi, mod 256 in the lane)
// are BF16's own functions; a raw group's byte is spread to BF16's raw-word nibbles first. A lane
// becomes the FP8 byte by lane_bytes: shifted right by 7-M, its low 7 bits (mantissa, the exponent's
// low E bits) with the sign of bit 15 (a carry of the fix-up past bit E lands on the sign and is
// replaced). The encoder feeds the FP8 exponents to BF16's encode_exponents (the same window tests
// and code bits) and packs the (1+M)-bit sign/mantissa record beside it.
#pragma once
#include "core.cuh"

namespace gaac_v3 {

// ------------------------------------------------------------------------------------------------
// the format: M mantissa bits (E4M3: 3, E5M2: 2), E = 7 - M exponent bits
// ------------------------------------------------------------------------------------------------
// Geometry of an FP8 tile: a (1+M)-bit sign/mantissa plane, one raw byte per raw group.
GAAC_HD constexpr Geom make_geom_fp8(int T, int D, int M) { return make_geom(T, D, 1 + M, 1); }

// The record of chunk c is 1 + M words (E4M3 16 bytes, E5M2 12) at byte 4 (1 + M) c; row r is the
// 8 (1 + M) bits at bit 8 (1 + M) r of it (E4M3: word r; E5M2: 24 bits, may straddle two words):
// sm_row_bits takes the word holding its first bit (index sm_row_word) and the next one. Bits above
// the row's are not cleared (a next word past the record may be anything).
template <int M>
GAAC_HD constexpr int sm_row_word(int r) { return 8 * (1 + M) * r / 32; }
template <int M>
GAAC_HD uint32_t sm_row_bits(uint32_t lo, uint32_t hi, int r) {
  if constexpr (M == 3) return lo;
  return (uint32_t)(((((uint64_t)hi) << 32) | lo) >> (8 * (1 + M) * r % 32));
}
template <int M>
GAAC_HD uint32_t sm_row(const uint32_t* rec, int r) {  // rec: the chunk's 1 + M words
  const int k = sm_row_word<M>(r);
  return sm_row_bits<M>(rec[k], k + 1 < 1 + M ? rec[k + 1] : 0u, r);
}

// x of pair p (channels 2p, 2p+1) from the row's record bits R: per lane the (1+M)-bit field s|m with
// m at bits 7-M..6 and s at bit 15 (assemble_pair's SIGN_MANT bits; other bits are don't-care).
template <int M>
GAAC_HD uint32_t sm_pair(uint32_t R, int p) {
  if constexpr (M == 3) {
    // nibble 2p at bits 4-7 of byte p of R << 4 (both bytes of lane 0), nibble 2p+1 at bits 4-7 of byte p of R
    const uint32_t sel = (uint32_t)((4 + p) | (4 + p) << 4 | p << 8 | p << 12);
    return prmt(R, R << 4, sel);
  } else {
    // 3-bit fields at bits 6p / 6p+3 -> bits 0 / 16, then copied to bits 5 and 13 of each lane
    const uint32_t y = R >> (6 * p);
    return ((y & 7u) | ((y << 13) & 0x70000u)) * 0x2020u;
  }
}

// Row r of a chunk as 4 BF16-layout pair words (core.cuh decode_row with FP8's sign/mantissa).
template <int M>
GAAC_HD void decode_row_fp8(uint32_t R, const uint32_t w[3], const uint32_t b8p[4], int r, uint32_t o[4]) {
  GAAC_UNROLL
  for (int p = 0; p < 4; ++p) o[p] = assemble_pair(sm_pair<M>(R, p), w[0], w[1], w[2], b8p[p], r, p);
}

// 4 pair words of a row -> its 8 FP8 codes as 2 words (byte j = channel j).
template <int M>
GAAC_HD void row_codes(const uint32_t o[4], uint32_t out[2]) {
  out[0] = lane_bytes(o[0], o[1], 7 - M);
  out[1] = lane_bytes(o[2], o[3], 7 - M);
}

// The main path of a chunk (every group narrow): rec = its record words; out[2r], out[2r+1] = row r.
template <int M>
GAAC_HD void decode_chunk_fp8(const uint32_t rec[1 + M], const uint32_t w[3], const uint32_t b8p[4], uint32_t out[8]) {
  GAAC_UNROLL
  for (int r = 0; r < 4; ++r) {
    uint32_t o[4];
    decode_row_fp8<M>(sm_row<M>(rec, r), w, b8p, r, o);
    row_codes<M>(o, out + 2 * r);
  }
}

// A raw group's byte (bit p: bit 4 of channel 2p's code, bit 4+p: of 2p+1's) as BF16's raw word
// (nibble p / 4+p: bits 4-7 of those codes), and back (bit 0 of each nibble).
GAAC_HD uint32_t spread_raw_byte(uint32_t b) {
  uint32_t x = (b | (b << 12)) & 0x000F000Fu;
  x = (x | (x << 6)) & 0x03030303u;
  return (x | (x << 3)) & 0x11111111u;
}
GAAC_HD uint32_t gather_raw_byte(uint32_t rw) {
  uint32_t x = rw & 0x11111111u;
  x = (x | (x >> 3)) & 0x03030303u;
  x = (x | (x >> 6)) & 0x000F000Fu;
  return (x | (x >> 12)) & 0xFFu;
}

// A listed group, rebuilt: row r of the chunk decoded as narrow, fixed with its entry and raw byte
// (0 unless the entry is raw), out = its 8 codes as 2 words.
template <int M>
GAAC_HD void fix_row_fp8(uint32_t R, const uint32_t w[3], const uint32_t b8p[4], const uint32_t dbp[4], int r,
                         uint32_t entry, uint32_t raw_byte, uint32_t out[2]) {
  uint32_t o[4];
  decode_row_fp8<M>(R, w, b8p, r, o);
  fix_group(o, dbp, entry, spread_raw_byte(raw_byte));
  row_codes<M>(o, out);
}

// ------------------------------------------------------------------------------------------------
// encoder: one chunk, x[2r], x[2r+1] = the 8 codes of row r (byte j = channel j)
// ------------------------------------------------------------------------------------------------
struct ChunkCodeFP8 : ExpCode {  // rword[r]: the raw byte (valid if raw)
  uint32_t rec[4];               // the sign/mantissa record, 1 + M words
};

// 4 codes (bytes) -> their 4 (1+M)-bit fields s|m packed at bits (1+M)j.
template <int M>
GAAC_HD uint32_t sm_fields4(uint32_t x) {
  constexpr uint32_t mant = 0x01010101u * ((1u << M) - 1), sign = 0x01010101u << M;
  constexpr int b = 1 + M;
  const uint32_t t = (x & mant) | ((x >> (7 - M)) & sign);  // byte j: s << M | m
  const uint32_t u = t | (t >> (8 - b));                   // bytes 0 and 2: two fields each
  constexpr uint32_t two = (1u << (2 * b)) - 1;
  return (u & two) | ((u >> (16 - 2 * b)) & (two << (2 * b)));
}

// encode_exponents' rows of an FP8 chunk: row r's exponent fields (channels 2p, 2p+1 -> bits 0 / 16),
// its (1+M)-bit sign/mantissa fields packed into the record at bit 8 (1+M) r.
template <int M>
struct RowsFP8 {
  const uint32_t* x;
  uint32_t* rec;
  GAAC_HD void sign_mant(int r) {
    constexpr int row_bits = 8 * (1 + M);
    const uint32_t R = sm_fields4<M>(x[2 * r]) | (sm_fields4<M>(x[2 * r + 1]) << (4 * (1 + M)));
    const int off = row_bits * r, k = off / 32, sh = off % 32;
    rec[k] |= R << sh;
    if (sh + row_bits > 32) rec[k + 1] |= R >> (32 - sh);
  }
  GAAC_HD uint32_t exponents(int r, int p) const {  // bytes 2p, 2p+1 of the row -> bytes 0 and 2, field to bits 0 / 16
    constexpr uint32_t emask = ((1u << (7 - M)) - 1) * 0x00010001u;
    return (prmt(x[2 * r + (p >> 1)], 0, (p & 1) ? 0x4342u : 0x4140u) >> M) & emask;
  }
};

template <int M>
GAAC_HD void encode_chunk_fp8(const uint32_t x[8], const uint32_t b8w[2], const uint32_t b16w[2], ChunkCodeFP8& cc) {
  GAAC_UNROLL
  for (int k = 0; k < 4; ++k) cc.rec[k] = 0;
  RowsFP8<M> rows{x, cc.rec};
  encode_exponents(rows, b8w, b16w, cc);
  GAAC_UNROLL
  for (int r = 0; r < 4; ++r) cc.rword[r] = gather_raw_byte(cc.rword[r]);
}

}  // namespace gaac_v3
