// GAAC format v3: the one decoder (and encoder) core, header-only, __host__ __device__.
//
// Spec: docs/FORMAT_V3.md and gaac_hf/codec/v3.py (the PyTorch reference this must match bit for bit).
// The same source is compiled by g++ in the tests (tests/test_v3_core.py, through host_driver.cpp) and
// by nvcc/NVRTC in the CUDA kernels (kernels.cu): there is no second copy of the bit logic.
//
// Design followed (our own, see the doc): a BF16 pair is rebuilt in one 32-bit word with
//   x = PRMT(sm word)            duplicate each sign/mantissa byte into both bytes of its 16-bit lane
//   E = base8 pair + code field  code bits moved to bits 7-9 / 23-25, base pre-shifted to bits 7-14 / 23-30
//   out = (x & 0x807F807F) | (E & ~0x807F807F)   one LOP3 bit-select
// and the rare wide (4-bit / raw) groups are fixed afterwards from a per-segment entry list.
#pragma once
#if defined(__CUDACC_RTC__)  // NVRTC without the toolkit headers
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef int int32_t;
typedef unsigned long long uint64_t;
typedef long long int64_t;
#else
#include <stdint.h>
#endif

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define GAAC_HD __host__ __device__ __forceinline__
#else
#define GAAC_HD inline
#endif
// On the host the same loops are unrolled by GCC / clang: host_block.h's encode_segment runs
// encode_chunk across the lanes of a segment and needs its body free of loops to vectorize it.
// Unrolling changes no bit (integer code; no float operation is reordered by it).
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define GAAC_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define GAAC_UNROLL _Pragma("GCC unroll 16")
#else
#define GAAC_UNROLL
#endif

namespace gaac_v3 {

// ------------------------------------------------------------------------------------------------
// intrinsics and their host stand-ins
// ------------------------------------------------------------------------------------------------
// PRMT / __byte_perm: result byte i = byte (sel >> 4i) & 7 of the 8-byte value {b:a} (a = bytes 0-3).
GAAC_HD uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, sel);
#else
  const uint64_t x = ((uint64_t)b << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= (uint32_t)((x >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
#endif
}

// bit select, one LOP3 (LUT 0xE2 = (a & m) | (b & ~m)): bits of a where mask is 1, bits of b elsewhere.
// On the device written as lop3 so ptxas does not split it into an AND and an AND-OR.
GAAC_HD uint32_t bitsel(uint32_t mask, uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xE2;" : "=r"(r) : "r"(a), "r"(mask), "r"(b));
  return r;
#else
  return (a & mask) | (b & ~mask);
#endif
}

GAAC_HD int popc(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __popc(x);
#else
  return __builtin_popcount(x);
#endif
}

// ------------------------------------------------------------------------------------------------
// constants (mirror gaac_hf/format/v3.py)
// ------------------------------------------------------------------------------------------------
constexpr int GROUP = 8, CHUNK_ROWS = 4, CODE_WORDS = 3, SEG_CHUNKS = 32, ALIGN = 16;
constexpr uint32_t SIGN_MANT = 0x807F807Fu;  // bits taken from the sm bytes
constexpr uint32_t EXP_BITS = 0x7F807F80u;   // bits taken from the exponent word
constexpr int SPLIT_PAIR = 15;
constexpr long long ENTRY_RAW_BIT = 1;  // block-table entry: byte offset (16-byte multiple) | 1 if stored as BF16

// Block geometry: T tokens x D channels; every offset in bytes from the block start. sm_bits: bits
// per value of the sign/mantissa plane (BF16 8; FP8 tiles 1 + M, core_fp8.cuh), raw_word: bytes per
// raw group (BF16 a u32; FP8 a u8, unaligned).
struct Geom {
  int T, D, cols, chunks, segs;
  int code_off, segtab_off, entry_off;
  int sm_bits, raw_word;
};
GAAC_HD constexpr Geom make_geom(int T, int D, int sm_bits = 8, int raw_word = 4) {
  Geom g{};
  g.T = T;
  g.D = D;
  g.cols = D / GROUP;
  g.chunks = (T / CHUNK_ROWS) * g.cols;
  g.segs = (g.chunks + SEG_CHUNKS - 1) / SEG_CHUNKS;
  g.sm_bits = sm_bits;
  g.raw_word = raw_word;
  g.code_off = 4 * sm_bits * g.chunks;  // a chunk's 32 values of sm_bits bits (BF16: T * D)
  g.segtab_off = g.code_off + 4 * CODE_WORDS * g.chunks;
  g.entry_off = g.segtab_off + 4 * (g.segs + 1);
  return g;
}
GAAC_HD constexpr int seg_chunks(const Geom& g, int s) {
  const int m = g.chunks - SEG_CHUNKS * s;
  return m < SEG_CHUNKS ? m : SEG_CHUNKS;
}
// byte offset of code word k of the chunk at lane `lane` of segment s (segment words are [k][lane])
GAAC_HD constexpr int code_word_off(const Geom& g, int s, int lane, int k) {
  return g.code_off + 4 * (CODE_WORDS * SEG_CHUNKS * s + k * seg_chunks(g, s) + lane);
}
GAAC_HD constexpr int raw_off(const Geom& g, int n_entries) {
  return (g.entry_off + 2 * n_entries + g.raw_word - 1) & ~(g.raw_word - 1);
}
GAAC_HD constexpr int block_bytes(const Geom& g, int n_entries, int n_raw) {
  return (raw_off(g, n_entries) + g.raw_word * n_raw + ALIGN - 1) & ~(ALIGN - 1);
}
// output position of chunk c: first row and first channel
GAAC_HD constexpr int chunk_row0(const Geom& g, int c) { return CHUNK_ROWS * (c / g.cols); }
GAAC_HD constexpr int chunk_col(const Geom& g, int c) { return c % g.cols; }

// ------------------------------------------------------------------------------------------------
// pre-shifted pair constants of one chunk column (channels 8col + 2p, 8col + 2p + 1)
// ------------------------------------------------------------------------------------------------
GAAC_HD uint32_t pair_const(uint32_t lo, uint32_t hi) { return ((lo & 0xFF) << 7) | ((hi & 0xFF) << 23); }
// b8p[p] = base8 pair, dbp[p] = (base16 - base8) mod 256 pair, for p = 0..3
GAAC_HD void column_consts(const uint8_t* b8, const uint8_t* b16, uint32_t b8p[4], uint32_t dbp[4]) {
  for (int p = 0; p < 4; ++p) {
    b8p[p] = pair_const(b8[2 * p], b8[2 * p + 1]);
    dbp[p] = pair_const((uint32_t)(b16[2 * p] - b8[2 * p]), (uint32_t)(b16[2 * p + 1] - b8[2 * p + 1]));
  }
}

// ------------------------------------------------------------------------------------------------
// decoder main path: every group as 3-bit with base8
// ------------------------------------------------------------------------------------------------
// Code field of pair q moved to bits 7-9 (even channel) and 23-25 (odd channel); other bits zero.
// Pairs 0..14: word q/5, bits 3(q%5).. and 16+3(q%5)..; pair 15: bit b at bits 15/31 of word b.
// AND with an opaque mask on the device: keeps the compiler from turning (w & M) << k into
// (w << k) & (M << k), which costs a separate shift; mask-then-shift lets the shift merge into the add.
GAAC_HD uint32_t and_mask(uint32_t w, uint32_t m) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("and.b32 %0, %1, %2;" : "=r"(r) : "r"(w), "r"(m));
  return r;
#else
  return w & m;
#endif
}

// Code field of pair q moved to bits 7-9 (even channel) and 23-25 (odd channel); other bits zero.
// Pairs 0..14: word q/5, bits 3(q%5).. and 16+3(q%5)..; pair 15: bit b at bits 15/31 of word b.
GAAC_HD uint32_t pair_field(uint32_t w0, uint32_t w1, uint32_t w2, int q) {
  if (q == SPLIT_PAIR)
    return ((w0 >> 8) & 0x00800080u) | ((w1 >> 7) & 0x01000100u) | ((w2 >> 6) & 0x02000200u);
  const uint32_t w = q < 5 ? w0 : (q < 10 ? w1 : w2);
  const int sh = 3 * (q % 5);
  const uint32_t f = and_mask(w, 0x00070007u << sh);
  return sh <= 7 ? f * (1u << (7 - sh)) : f >> (sh - 7);
}

// Pair p of row r of a chunk from x (its sign and mantissa bits at SIGN_MANT, anything elsewhere), the chunk's
// code words w0..w2 and the pair's base8 constant: (x & 0x807F807F) | base8 pair (one LOP3), then +
// the code field (LEA / IMAD): base8 + code stays inside bits 7-14 / 23-30 (BF16: base8 <= 248; FP8:
// base_n <= 2^E - 8), so the sum equals bitsel(SIGN_MANT, x, base8 + code).
// (Pair index q = 4r + p taken as r, p and formed after the LOP3: BF16's decode_pair then compiles to
// the same PTX as before this function was split out of it.)
GAAC_HD uint32_t assemble_pair(uint32_t x, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t b8p, int r, int p) {
  return bitsel(SIGN_MANT, x, b8p) + pair_field(w0, w1, w2, 4 * r + p);
}

// Pair p of row r of a chunk: smw = the sm word holding its two sign/mantissa bytes (word p / 2 of
// the row), w0..w2 = the chunk's code words, b8p = the pair's base8 constant.
GAAC_HD uint32_t decode_pair(uint32_t smw, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t b8p, int r, int p) {
  const uint32_t x = prmt(smw, 0, (p & 1) ? 0x3322u : 0x1100u);  // bytes b,b,b',b' -> 2 lanes
  return assemble_pair(x, w0, w1, w2, b8p, r, p);
}

// Bytes of two pair words a, b (4 values): byte i = bit 15 of lane i (the sign) | the low 7 bits of
// lane i shifted right by sh. BF16 sh = 0 (the encoder's sign/mantissa bytes); FP8 sh = 7 - M (the
// value's byte: its mantissa sits at bits 7-M..6 of the lane, its exponent at bits 7..).
GAAC_HD uint32_t lane_bytes(uint32_t a, uint32_t b, int sh) {
  return bitsel(0x80808080u, prmt(a, b, 0x7531u), prmt(a >> sh, b >> sh, 0x6420u));
}

// One row r of a chunk: sm2 = its 8 sign/mantissa bytes as 2 words, w = the chunk's 3 code words;
// o[p] = BF16 pair (channels 2p, 2p+1 of the row; even channel in the low half).
GAAC_HD void decode_row(const uint32_t sm2[2], const uint32_t w[3], const uint32_t b8p[4], int r, uint32_t o[4]) {
  GAAC_UNROLL
  for (int p = 0; p < 4; ++p) o[p] = decode_pair(sm2[p >> 1], w[0], w[1], w[2], b8p[p], r, p);
}

// The main path of a chunk: sm = its 32 sign/mantissa bytes as 8 words (row r = words 2r, 2r+1);
// out[4r + p] = pair p of row r.
GAAC_HD void decode_chunk(const uint32_t sm[8], const uint32_t w[3], const uint32_t b8p[4], uint32_t out[16]) {
  GAAC_UNROLL
  for (int r = 0; r < 4; ++r) decode_row(sm + 2 * r, w, b8p, r, out + 4 * r);
}

// ------------------------------------------------------------------------------------------------
// fix-up of one listed (wide) group: o = the 4 pair words the main path produced for its row
// ------------------------------------------------------------------------------------------------
// entry: u16 pos | raw << 7 | h << 8, h bit p = bit 3 of channel 2p's code, bit 4+p of channel 2p+1's;
// rw: the raw word (0 for a 4-bit group): nibble p = bits 4-7 of channel 2p, nibble 4+p of 2p+1.
GAAC_HD void fix_group(uint32_t o[4], const uint32_t dbp[4], uint32_t entry, uint32_t rw) {
  const uint32_t h = entry >> 8;
  const uint32_t hh = (h & 0xFu) | ((h & 0xF0u) << 12);
GAAC_UNROLL
  for (int p = 0; p < 4; ++p) {
    const uint32_t hi = (((hh >> p) & 0x00010001u) << 10) | (((rw >> (4 * p)) & 0x000F000Fu) << 11);
    const uint32_t t = (o[p] & EXP_BITS) + dbp[p] + hi;  // (e' - b8 + b16 + 8 hi) mod 256 per lane
    o[p] = bitsel(SIGN_MANT, o[p], t);
  }
}

GAAC_HD int entry_pos(uint32_t entry) { return entry & 0x7F; }
GAAC_HD bool entry_raw(uint32_t entry) { return (entry >> 7) & 1; }

// ------------------------------------------------------------------------------------------------
// encoder core: one chunk (4 rows x 8 channels)
// ------------------------------------------------------------------------------------------------
struct ExpCode {
  uint32_t w[3];       // code words
  uint32_t entry[4];   // per row: u16 entry without pos (raw << 7 | h << 8), valid if wide
  uint32_t rword[4];   // per row: raw word (valid if raw): nibble p = bits 4-7 of channel 2p's code, 4+p of 2p+1's
  uint32_t wide, raw;  // bit r set: row r is wide / raw
};
struct ChunkCode : ExpCode {
  uint32_t sm[8];  // sign/mantissa bytes, as decode_chunk reads them
};

// x[4r + p] = BF16 pair (channels 2p, 2p+1 of row r); b8w / b16w: the 8 channel bases as 2 words
// (byte j = channel j). Two values per 32-bit operation throughout: per pair, D8 = e + 504 - base8 and
// D16 = e + 496 - base16 in each 16-bit lane (no lane ever borrows: both stay in [256, 760)), so a value
// fits the 8-window iff D8 is in [504, 512), i.e. iff bits 3-8 of D8 are all ones (one LOP3 for the
// pair, ~D & 0x01F801F8), and the 16-window iff bits 4-8 of D16 are; the coded bits follow from the same
// words: lo3 = D & 7, bit 3 of the wide code = bit 3 of D16, bits 4-7 = bits 4-7 of D16 + 16.
// encode_exponents: the exponent half, shared by FP8 tiles (core_fp8.cuh). Per row r, in order:
// rows.sign_mant(r) stores the row's sign/mantissa bits, then rows.exponents(r, p) = pair p's exponents
// in bits 0-7 / 16-23 (other bits zero), read where the window tests use it (that order keeps the
// BF16 encoder's PTX what it was before this split).
template <class Rows>
GAAC_HD void encode_exponents(Rows& rows, const uint32_t b8w[2], const uint32_t b16w[2], ExpCode& cc) {
  uint32_t k8[4], k16[4];
  GAAC_UNROLL
  for (int p = 0; p < 4; ++p) {
    const uint32_t sel = (p & 1) ? 0x4342u : 0x4140u;  // bases of channels 2p, 2p+1 -> bytes 0 and 2
    k8[p] = 0x01F801F8u - prmt(b8w[p >> 1], 0, sel);
    k16[p] = 0x01F001F0u - prmt(b16w[p >> 1], 0, sel);
  }
  cc.w[0] = cc.w[1] = cc.w[2] = 0;
  cc.wide = cc.raw = 0;
  GAAC_UNROLL
  for (int r = 0; r < 4; ++r) {
    rows.sign_mant(r);
    uint32_t d8[4], d16[4], bad8 = 0, bad16 = 0;
    GAAC_UNROLL
    for (int p = 0; p < 4; ++p) {
      const uint32_t e = rows.exponents(r, p);
      d8[p] = e + k8[p];
      d16[p] = e + k16[p];
      bad8 |= ~d8[p] & 0x01F801F8u;
      bad16 |= ~d16[p] & 0x01F001F0u;
    }
    const bool fit3 = bad8 == 0, fit4 = bad16 == 0;
    uint32_t hh = 0, rw = 0;
    GAAC_UNROLL
    for (int p = 0; p < 4; ++p) {
      const int q = 4 * r + p;
      const uint32_t lo = (fit3 ? d8[p] : d16[p]) & 0x00070007u;  // low 3 code bits, both lanes
      if (q == SPLIT_PAIR) {
        GAAC_UNROLL
        for (int b = 0; b < 3; ++b) cc.w[b] |= ((lo >> b) & 0x00010001u) << 15;
      } else {
        cc.w[q / 5] |= lo << (3 * (q % 5));
      }
      hh |= ((d16[p] >> 3) & 0x00010001u) << p;                            // bits p / 16 + p
      rw |= (((d16[p] + 0x00100010u) >> 4) & 0x000F000Fu) << (4 * p);      // nibbles p / 4 + p
    }
    const uint32_t h = (hh & 0xFu) | ((hh >> 12) & 0xF0u);
    const bool raw = !fit3 && !fit4;
    cc.entry[r] = ((uint32_t)raw << 7) | (h << 8);
    cc.rword[r] = rw;
    cc.wide |= (uint32_t)(!fit3) << r;
    cc.raw |= (uint32_t)raw << r;
  }
}

// BF16 rows: sign/mantissa bytes (low and high bytes of 4 values gathered, then one bit select), exponents.
struct RowsBF16 {
  const uint32_t* x;
  uint32_t* sm;
  GAAC_HD void sign_mant(int r) {
    const uint32_t* xr = x + 4 * r;
    sm[2 * r] = lane_bytes(xr[0], xr[1], 0);
    sm[2 * r + 1] = lane_bytes(xr[2], xr[3], 0);
  }
  GAAC_HD uint32_t exponents(int r, int p) const { return (x[4 * r + p] >> 7) & 0x00FF00FFu; }
};
GAAC_HD void encode_chunk(const uint32_t x[16], const uint32_t b8w[2], const uint32_t b16w[2], ChunkCode& cc) {
  RowsBF16 rows{x, cc.sm};
  encode_exponents(rows, b8w, b16w, cc);
}

}  // namespace gaac_v3
