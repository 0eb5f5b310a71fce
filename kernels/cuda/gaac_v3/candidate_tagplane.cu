// Rejected candidate B (docs/FORMAT_V3.md, "Rejected alternatives"), kept only to count its SASS:
// the same sm bytes and pair-packed code words as v3, plus a 2-bit tag per group (lane i's 4 tags in
// byte i of its segment's 32-byte tag plane) and v2-style escape bytes per segment (1 per 4-bit group:
// the bit-3 plane h; 5 per raw group: h + 4 bytes of bits 4-7), found from a stored per-segment start
// and the lane's rank (ballots + popcounts over the lanes' escape sizes), with the branch-free merge
// out = (x & 0x807F807F | Bsel) + field + hi, Bsel = base8 / base16 / 0 by the group's tag.
// Not a product kernel: eval/sass_decoder.py --candidates compiles it and counts one segment.
#include "core.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif

namespace {
using namespace gaac_v3;
constexpr int D = HEAD_DIM;

__device__ __forceinline__ uint32_t ld32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ uint4 ld128(const void* p) { return *reinterpret_cast<const uint4*>(p); }

// rank of this lane's escape bytes inside its segment: sum over lower lanes of (wide + 4 raw)
__device__ __forceinline__ int escape_rank(int k, int lane) {
  const unsigned lt = (1u << lane) - 1u;
  int rank = 0;
  GAAC_UNROLL
  for (int b = 0; b < 5; ++b) rank += __popc(__ballot_sync(0xFFFFFFFFu, (k >> b) & 1) & lt) << b;
  return rank;
}
}  // namespace

// one segment per warp (1,024 values), one chunk per lane; layout offsets passed in (counting only)
extern "C" __global__ void candidate_tagplane_segment(const uint8_t* __restrict__ blk, const uint32_t* __restrict__ b8p,
                                                      const uint32_t* __restrict__ b16p, int tag_off, int segtab_off,
                                                      int esc_off, uint16_t* __restrict__ out) {
  const int lane = threadIdx.x & 31, s = blockIdx.x;
  const int c = SEG_CHUNKS * s + lane, col = lane % (D / GROUP), row0 = CHUNK_ROWS * (c / (D / GROUP));
  const uint4 a = ld128(blk + 32 * c), b = ld128(blk + 32 * c + 16);
  const uint32_t sm[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  const uint8_t* cw = blk + D * 64 + 4 * (CODE_WORDS * SEG_CHUNKS * s + lane);
  const uint32_t w[3] = {ld32(cw), ld32(cw + 128), ld32(cw + 256)};
  const uint4 p8 = ld128(b8p + 4 * col), p16 = ld128(b16p + 4 * col);
  const uint32_t B8[4] = {p8.x, p8.y, p8.z, p8.w}, B16[4] = {p16.x, p16.y, p16.z, p16.w};
  const uint32_t tags = blk[tag_off + 32 * s + lane];
  const uint32_t widebits = (tags | (tags >> 1)) & 0x55u, rawbits = (tags >> 1) & ~tags & 0x55u;
  const int k = __popc(widebits) + 4 * __popc(rawbits);
  const uint8_t* esc = blk + esc_off + (ld32(blk + segtab_off + 4 * s) & 0xFFFF) + escape_rank(k, lane);
  uint16_t* dst = out + row0 * D + GROUP * col;
  GAAC_UNROLL
  for (int r = 0; r < 4; ++r) {
    const uint32_t t = (tags >> (2 * r)) & 3;
    const bool wide = t != 0, raw = t == 2;
    const uint32_t h = wide ? esc[0] : 0u;
    const uint32_t rw = raw ? (esc[1] | (esc[2] << 8) | (esc[3] << 16) | ((uint32_t)esc[4] << 24)) : 0u;
    esc += (int)wide + 4 * (int)raw;
    const uint32_t hh = (h & 0xFu) | ((h & 0xF0u) << 12);
    uint32_t o[4];
    GAAC_UNROLL
    for (int p = 0; p < 4; ++p) {
      const uint32_t x = prmt(sm[2 * r + (p >> 1)], 0, (p & 1) ? 0x3322u : 0x1100u);
      const uint32_t base = raw ? 0u : (wide ? B16[p] : B8[p]);
      const uint32_t hi = (((hh >> p) & 0x00010001u) << 10) | (((rw >> (4 * p)) & 0x000F000Fu) << 11);
      o[p] = bitsel(SIGN_MANT, x, base) + pair_field(w[0], w[1], w[2], 4 * r + p) + hi;
    }
    *reinterpret_cast<uint4*>(dst + r * D) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}
