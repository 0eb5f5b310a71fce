// Format v4 pair decode: the one copy of its bit logic, for the host (g++, tests/test_v4_kernels_host.py) and
// the device (decode_attention_v4.cu). Spec: gaac_hf/format/v4.py and the reference codec gaac_hf/codec/v4.py.
//
// A pair = the two BF16 values of one lane register of an m16n8k16 A fragment (low value in bits 0-15).
//   smw   the tile's sign/mantissa word holding the pair: pair 2k's sign and mantissa bits at their BF16 places,
//         pair 2k+1's rotated left by 8 (into the exponent holes), so pair 2k is the word itself and pair 2k+1
//         one rotate (no byte permute)
//   w     the group's code word: low code nibbles, pair j's low value at rotl(7 + 4j), its high value at
//         rotl(23 + 4j), so rotr(w, 4j) & CODE_MASK puts both at the low bits of the two exponent fields
//   hw    the group's high-nibble word (raw groups only; 0 otherwise), pair j's at rotl(11 + 4j) / rotl(27 + 4j)
//   base  the pair's base16 constant (window << 7 | window' << 23, gaac_v3::pair_const)
// Exponent = (base16 + code) mod 256 per value; 4-bit groups have base16 + code < 256 (the encoder's test),
// raw groups may carry out of a field into a sign bit, which the bit select drops.
#pragma once
#include "gaac_v3/core.cuh"

namespace gaac_v4 {

constexpr uint32_t CODE_MASK = 0x07800780u;  // rotr(w, 4j): pair j's two code nibbles at bits 7-10 / 23-26
constexpr uint32_t HIGH_MASK = 0x78007800u;  // rotr(hw, 4j): its high nibbles at bits 11-14 / 27-30

GAAC_HD uint32_t rotr(uint32_t x, int n) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(x, x, n);
#else
  n &= 31;
  return n == 0 ? x : (x >> n) | (x << (32 - n));
#endif
}

// pair q's sign and mantissa bits at their BF16 places (anything in the exponent bits)
GAAC_HD uint32_t sm_bits(uint32_t smw, int q) { return (q & 1) ? rotr(smw, 8) : smw; }

// pair j of a group (sign/mantissa bits x from sm_bits)
template <bool RAW>
GAAC_HD uint32_t pair(uint32_t x, uint32_t w, uint32_t hw, uint32_t base, int j) {
  const uint32_t f = rotr(w, 4 * j) & CODE_MASK;
  if (RAW) {
    const uint32_t fh = rotr(hw, 4 * j) & HIGH_MASK;
    return gaac_v3::bitsel(gaac_v3::SIGN_MANT, x, base + f + fh);
  }
  return gaac_v3::bitsel(gaac_v3::SIGN_MANT, x, base) + f;
}

// Tile geometry (format v4): 16 tokens x D channels of one kind, D a multiple of 64.
struct TileGeom {
  int D, NP, KS, CODE_OFF, SIDE_OFF, TB;
};
GAAC_HD constexpr TileGeom tile_geom(int D) { return {D, D / 4, D / 16, 16 * D, 24 * D, 24 * D + 32}; }
constexpr int SIDE = 32, RAW_AT = 8, MAX_RAW_TILE = 3;

// (row, col) in the 16 x D tile of value 0 of pair j of group s held by `lane` (value 1: col + 1 for K,
// row + 1 for V). K: A = K (rows tokens); V: A = V^T (rows channels, so a pair spans two tokens).
GAAC_HD void pair_rc(bool is_v, int lane, int s, int j, int& r, int& c) {
  const int g = lane >> 2, t = lane & 3;
  if (!is_v) {
    r = g + 8 * (j & 1);
    c = 16 * s + 2 * t + 8 * (j >> 1);
  } else {
    r = 2 * t + 8 * (j >> 1);
    c = 16 * s + g + 8 * (j & 1);
  }
}

}  // namespace gaac_v4
