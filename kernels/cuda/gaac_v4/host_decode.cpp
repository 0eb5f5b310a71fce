// Host decoder of format v4 tiles on pair.cuh (the kernel's bit logic), for the g++ check in
// tests/test_v4_kernels_host.py: it walks a tile the way decode_attention_v4.cu's LaneTile does (per lane: the
// sign/mantissa words, the code words, the raw record of its lane) and writes the values in natural [16, D]
// layout. Not used by the product at run time.
#include <cstdint>
#include <cstring>

#include "gaac_v4/pair.cuh"

namespace {
void tile(const uint8_t* tb, const uint8_t* b16, int D, int is_v, uint16_t* out) {
  const gaac_v4::TileGeom g = gaac_v4::tile_geom(D);
  const uint8_t* side = tb + g.SIDE_OFF;
  for (int lane = 0; lane < 32; ++lane) {
    uint32_t rs0 = 0xFF, nib0 = 0;
    for (int r = 0; r < gaac_v4::MAX_RAW_TILE; ++r) {  // as the kernel: every slot, one raw group per lane
      uint32_t rec[2];
      std::memcpy(rec, side + gaac_v4::RAW_AT + 8 * r, 8);
      if (static_cast<uint32_t>(r) < side[0] && (rec[1] & 0xFF) == static_cast<uint32_t>(lane)) {
        rs0 = (rec[1] >> 8) & 0xFF;
        nib0 = rec[0];
      }
    }
    for (int s = 0; s < g.KS; ++s) {
      uint32_t w;
      std::memcpy(&w, tb + g.CODE_OFF + (s >> 2) * 512 + lane * 16 + (s & 3) * 4, 4);
      const bool raw = static_cast<uint32_t>(s) == rs0;
      for (int j = 0; j < 4; ++j) {
        const int q = 4 * s + j;
        uint32_t smw;
        std::memcpy(&smw, tb + (q >> 3) * 512 + lane * 16 + ((q >> 1) & 3) * 4, 4);
        const uint32_t x = gaac_v4::sm_bits(smw, q);
        int row, col;
        gaac_v4::pair_rc(is_v != 0, lane, s, j, row, col);
        const int row1 = is_v ? row + 1 : row, col1 = is_v ? col : col + 1;
        const uint32_t base = gaac_v3::pair_const(b16[col], b16[col1]);
        const uint32_t a = raw ? gaac_v4::pair<true>(x, w, nib0, base, j) : gaac_v4::pair<false>(x, w, 0, base, j);
        out[row * D + col] = static_cast<uint16_t>(a & 0xFFFF);
        out[row1 * D + col1] = static_cast<uint16_t>(a >> 16);
      }
    }
  }
}
}  // namespace

// tiles uint8 [n_tiles, tile_bytes] of one kind with one set of windows b16 [D] -> out uint16 [n_tiles, 16, D]
extern "C" void gaac_v4_host_decode_tiles(const uint8_t* tiles, int64_t n_tiles, const uint8_t* b16, int D, int is_v,
                                          uint16_t* out) {
  const int tb = gaac_v4::tile_geom(D).TB;
  for (int64_t i = 0; i < n_tiles; ++i) tile(tiles + i * tb, b16, D, is_v, out + i * 16 * D);
}
