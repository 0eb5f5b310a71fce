// F4 register-tile pair decode, the one copy of its bit logic (lab): host and device. regtile.cu (FMT4 = 1, 2)
// calls it; lab/test_experiments.py compiles it with g++ and checks it against format4.py's reference decoder.
//
// A pair = two BF16 values of one lane register (low value in bits 0-15). Inputs:
//   smw   the sign/mantissa word holding the pair: F4 (PRMT bytes) = two sign<<7|mantissa bytes per pair, the
//         pair's bytes at byte 2 (q % 2) and 2 (q % 2) + 1; F4i (words) = pair 2k at its BF16 bit places, pair
//         2k+1 rotated left by 8
//   w     the group's code word (low code nibbles, pair j at rotl(7 + 4j) / rotl(23 + 4j))
//   hw    the group's high-nibble word (raw groups; 0 otherwise), at rotl(11 + 4j) / rotl(27 + 4j)
//   base  the pair's base16 constant (window << 7 | window' << 23)
#pragma once
#include "gaac_v3/core.cuh"

namespace gaac_f4 {

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

// the pair's sign and mantissa bits at their BF16 places (anything in the exponent bits); q = pair index
template <bool SM_WORDS>
GAAC_HD uint32_t sm_bits(uint32_t smw, int q) {
  if (SM_WORDS) return (q & 1) ? rotr(smw, 8) : smw;
  return gaac_v3::prmt(smw, 0, (q & 1) ? 0x3322u : 0x1100u);
}

// pair j of a group: code = low nibble (+ 16 x high nibble for raw groups), exponent = (base + code) mod 256
template <bool RAW>
GAAC_HD uint32_t pair(uint32_t x, uint32_t w, uint32_t hw, uint32_t base, int j) {
  const uint32_t f = rotr(w, 4 * j) & CODE_MASK;
  if (RAW) {  // the add may carry into bit 15 (a sign bit), which bitsel drops: mod 256 per value
    const uint32_t fh = rotr(hw, 4 * j) & HIGH_MASK;
    return gaac_v3::bitsel(gaac_v3::SIGN_MANT, x, base + f + fh);
  }
  // 4-bit groups: base16 + code < 256 (the encoder's test), so nothing carries out of the exponent field
  return gaac_v3::bitsel(gaac_v3::SIGN_MANT, x, base) + f;
}

}  // namespace gaac_f4
