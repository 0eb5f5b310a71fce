// Host test driver for the v3 core (core.cuh) compiled by g++: encodes / decodes whole blocks with the
// same functions the CUDA kernels call, in the order a warp would (lane = chunk of a segment), and
// exchanges raw bytes with Python through files (tests/test_v3_core.py).
//
//   host_driver decode T D N ROW_BYTES blocks.bin b8.bin b16.bin out.bin
//       blocks.bin: N rows of ROW_BYTES (block i at row i); b8/b16: uint8 [N, D]; out: uint16 [N, T, D]
//   host_driver encode T D N x.bin b8.bin b16.bin rows.bin nbytes.bin
//       x: uint16 [N, T, D]; rows: uint8 [N, 2*T*D] (zeros past each block); nbytes: int32 [N]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core.cuh"

using namespace gaac_v3;

static std::vector<uint8_t> read_file(const char* path) {
  FILE* f = std::fopen(path, "rb");
  if (!f) { std::perror(path); std::exit(2); }
  std::fseek(f, 0, SEEK_END);
  long n = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  std::vector<uint8_t> v(n);
  if (n && std::fread(v.data(), 1, n, f) != (size_t)n) { std::perror(path); std::exit(2); }
  std::fclose(f);
  return v;
}
static void write_file(const char* path, const void* p, size_t n) {
  FILE* f = std::fopen(path, "wb");
  if (!f || std::fwrite(p, 1, n, f) != n) { std::perror(path); std::exit(2); }
  std::fclose(f);
}
static uint32_t ld32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
static void st32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

static void decode_block(const Geom& g, const uint8_t* blk, const uint8_t* b8, const uint8_t* b16, uint32_t* out) {
  const int words_per_row = g.D / 2;
  const uint32_t seg_total = ld32(blk + g.segtab_off + 4 * g.segs);
  const int n_ent_total = seg_total & 0xFFFF;
  for (int s = 0; s < g.segs; ++s) {
    const int m = seg_chunks(g, s);
    for (int lane = 0; lane < m; ++lane) {  // the main path, one lane per chunk
      const int c = SEG_CHUNKS * s + lane, col = chunk_col(g, c), row0 = chunk_row0(g, c);
      uint32_t sm[8], w[3], b8p[4], dbp[4], o[16];
      for (int i = 0; i < 8; ++i) sm[i] = ld32(blk + 32 * c + 4 * i);
      for (int k = 0; k < 3; ++k) w[k] = ld32(blk + code_word_off(g, s, lane, k));
      column_consts(b8 + 8 * col, b16 + 8 * col, b8p, dbp);
      decode_chunk(sm, w, b8p, o);
      for (int r = 0; r < 4; ++r)
        for (int p = 0; p < 4; ++p) out[(row0 + r) * words_per_row + 4 * col + p] = o[4 * r + p];
    }
    // the fix-up: one lane per entry of the segment; raw words in entry order from the segment's start
    const uint32_t s0 = ld32(blk + g.segtab_off + 4 * s), s1 = ld32(blk + g.segtab_off + 4 * (s + 1));
    const int e0 = s0 & 0xFFFF, n = (int)(s1 & 0xFFFF) - e0;
    int raw_idx = s0 >> 16;
    for (int i = 0; i < n; ++i) {
      const uint32_t entry = blk[g.entry_off + 2 * (e0 + i)] | (blk[g.entry_off + 2 * (e0 + i) + 1] << 8);
      const int pos = entry_pos(entry), c = SEG_CHUNKS * s + pos / 4, r = pos % 4;
      const uint32_t rw = entry_raw(entry) ? ld32(blk + raw_off(g, n_ent_total) + 4 * raw_idx++) : 0;
      const int col = chunk_col(g, c), row = chunk_row0(g, c) + r;
      uint32_t b8p[4], dbp[4];
      column_consts(b8 + 8 * col, b16 + 8 * col, b8p, dbp);
      uint32_t* o = out + row * words_per_row + 4 * col;
      fix_group(o, dbp, entry, rw);
    }
  }
}

static int encode_block(const Geom& g, const uint32_t* x, const uint8_t* b8, const uint8_t* b16, uint8_t* row, int cap) {
  std::vector<uint8_t> buf(2 * cap + 64 * g.chunks, 0);  // room for any block before truncation to cap
  std::vector<uint32_t> ents, raws;
  std::vector<int> seg_ent(g.segs + 1), seg_raw(g.segs + 1);
  const int words_per_row = g.D / 2;
  for (int c = 0; c < g.chunks; ++c) {
    const int s = c / SEG_CHUNKS, lane = c % SEG_CHUNKS, col = chunk_col(g, c), row0 = chunk_row0(g, c);
    if (lane == 0) { seg_ent[s] = (int)ents.size(); seg_raw[s] = (int)raws.size(); }
    uint32_t xv[16];
    for (int r = 0; r < 4; ++r)
      for (int p = 0; p < 4; ++p) xv[4 * r + p] = x[(row0 + r) * words_per_row + 4 * col + p];
    ChunkCode cc;
    uint32_t b8w[2], b16w[2];
    std::memcpy(b8w, b8 + 8 * col, 8);
    std::memcpy(b16w, b16 + 8 * col, 8);
    encode_chunk(xv, b8w, b16w, cc);
    for (int i = 0; i < 8; ++i) st32(&buf[32 * c + 4 * i], cc.sm[i]);
    for (int k = 0; k < 3; ++k) st32(&buf[code_word_off(g, s, lane, k)], cc.w[k]);
    for (int r = 0; r < 4; ++r) {
      if ((cc.wide >> r) & 1) ents.push_back(cc.entry[r] | (uint32_t)(4 * lane + r));
      if ((cc.raw >> r) & 1) raws.push_back(cc.rword[r]);
    }
  }
  seg_ent[g.segs] = (int)ents.size();
  seg_raw[g.segs] = (int)raws.size();
  for (int s = 0; s <= g.segs; ++s) st32(&buf[g.segtab_off + 4 * s], (uint32_t)seg_ent[s] | ((uint32_t)seg_raw[s] << 16));
  for (size_t i = 0; i < ents.size(); ++i) {
    buf[g.entry_off + 2 * i] = ents[i] & 0xFF;
    buf[g.entry_off + 2 * i + 1] = (ents[i] >> 8) & 0xFF;
  }
  const int ro = raw_off(g, (int)ents.size());
  for (size_t i = 0; i < raws.size(); ++i) st32(&buf[ro + 4 * i], raws[i]);
  std::memcpy(row, buf.data(), cap);
  return block_bytes(g, (int)ents.size(), (int)raws.size());
}

int main(int argc, char** argv) {
  if (argc < 2) { std::fprintf(stderr, "usage: see the header of host_driver.cpp\n"); return 2; }
  const bool dec = !std::strcmp(argv[1], "decode");
  if ((dec && argc != 10) || (!dec && (std::strcmp(argv[1], "encode") || argc != 10))) {
    std::fprintf(stderr, "bad arguments\n");
    return 2;
  }
  const int T = std::atoi(argv[2]), D = std::atoi(argv[3]), N = std::atoi(argv[4]);
  const Geom g = make_geom(T, D);
  if (dec) {
    const int row_bytes = std::atoi(argv[5]);
    auto blocks = read_file(argv[6]), b8 = read_file(argv[7]), b16 = read_file(argv[8]);
    std::vector<uint32_t> out((size_t)N * T * D / 2);
    for (int i = 0; i < N; ++i)
      decode_block(g, &blocks[(size_t)i * row_bytes], &b8[(size_t)i * D], &b16[(size_t)i * D], &out[(size_t)i * T * D / 2]);
    write_file(argv[9], out.data(), out.size() * 4);
  } else {
    auto x = read_file(argv[5]), b8 = read_file(argv[6]), b16 = read_file(argv[7]);
    const int cap = 2 * T * D;
    std::vector<uint8_t> rows((size_t)N * cap);
    std::vector<int32_t> nbytes(N);
    for (int i = 0; i < N; ++i)
      nbytes[i] = encode_block(g, reinterpret_cast<const uint32_t*>(&x[(size_t)i * T * D * 2]), &b8[(size_t)i * D],
                               &b16[(size_t)i * D], &rows[(size_t)i * cap], cap);
    write_file(argv[8], rows.data(), rows.size());
    write_file(argv[9], nbytes.data(), nbytes.size() * 4);
  }
  return 0;
}
