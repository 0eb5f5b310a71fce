// Host decoder of F4 / F4i tiles on f4_pair.h (the kernel's bit logic), for the g++ check in
// lab/test_experiments.py: walks a tile the way regtile.cu's LaneTile does (per lane: sm words, code words,
// the raw records of its lane) and writes the values in natural [16, D] layout.
#include <cstdint>
#include <cstring>

#include "f4_pair.h"

namespace {
template <bool SM_WORDS>
void tile(const uint8_t* tb, const uint8_t* b16, int D, int is_v, uint16_t* out) {
  const int NP = D / 4, KS = D / 16, CODE_OFF = 16 * D, SIDE_OFF = CODE_OFF + 8 * D;
  const uint8_t* side = tb + SIDE_OFF;
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    uint32_t rs0 = 0xFF, nib0 = 0;
    for (int r = 0; r < 3; ++r) {  // as the kernel: every slot, one raw group per lane
      uint32_t rec[2];
      std::memcpy(rec, side + 8 + 8 * r, 8);
      if (static_cast<uint32_t>(r) < side[0] && (rec[1] & 0xFF) == static_cast<uint32_t>(lane)) {
        rs0 = (rec[1] >> 8) & 0xFF;
        nib0 = rec[0];
      }
    }
    for (int s = 0; s < KS; ++s) {
      uint32_t w;
      std::memcpy(&w, tb + CODE_OFF + (s >> 2) * 512 + lane * 16 + (s & 3) * 4, 4);
      const bool raw = static_cast<uint32_t>(s) == rs0;
      for (int j = 0; j < 4; ++j) {
        const int q = 4 * s + j;
        uint32_t smw;
        std::memcpy(&smw, tb + (q >> 3) * 512 + lane * 16 + ((q >> 1) & 3) * 4, 4);
        const uint32_t x = gaac_f4::sm_bits<SM_WORDS>(smw, q);
        int row, col, row1, col1;  // the pair's two values (format.lane_coords)
        if (!is_v) {
          row = row1 = g + 8 * (j & 1);
          col = 16 * s + 2 * t + 8 * (j >> 1);
          col1 = col + 1;
        } else {
          row = 2 * t + 8 * (j >> 1);
          row1 = row + 1;
          col = col1 = 16 * s + g + 8 * (j & 1);
        }
        const uint32_t base = gaac_v3::pair_const(b16[col], b16[col1]);
        const uint32_t a = raw ? gaac_f4::pair<true>(x, w, nib0, base, j) : gaac_f4::pair<false>(x, w, 0, base, j);
        out[row * D + col] = static_cast<uint16_t>(a & 0xFFFF);
        out[row1 * D + col1] = static_cast<uint16_t>(a >> 16);
      }
    }
  }
}
}  // namespace

extern "C" void f4_decode_tiles(const uint8_t* tiles, int64_t n_tiles, int64_t tile_bytes, const uint8_t* b16, int D,
                                int is_v, int sm_words, uint16_t* out) {
  for (int64_t i = 0; i < n_tiles; ++i) {
    if (sm_words) tile<true>(tiles + i * tile_bytes, b16, D, is_v, out + i * 16 * D);
    else tile<false>(tiles + i * tile_bytes, b16, D, is_v, out + i * 16 * D);
  }
}
