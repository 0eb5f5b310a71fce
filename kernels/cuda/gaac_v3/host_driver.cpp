// Host test driver for the v3 core (core.cuh) compiled by g++: encodes / decodes whole blocks with the
// same functions the CUDA kernels call, in the order a warp would (lane = chunk of a segment; the block
// walk is host_block.h, shared with the CPU library kernels/cpu/gaac_cpu.cpp), and exchanges raw bytes
// with Python through files (tests/test_v3_core.py).
//
//   host_driver decode T D N ROW_BYTES blocks.bin b8.bin b16.bin out.bin
//       blocks.bin: N rows of ROW_BYTES (block i at row i); b8/b16: uint8 [N, D]; out: uint16 [N, T, D]
//   host_driver encode T D N x.bin b8.bin b16.bin rows.bin nbytes.bin
//       x: uint16 [N, T, D]; rows: uint8 [N, 2*T*D] (zeros past each block); nbytes: int32 [N]
//   host_driver decode_fp8 M T D N ROW_BYTES blocks.bin bn.bin bw.bin out.bin     (FP8 tiles, core_fp8.cuh)
//   host_driver encode_fp8 M T D N x.bin bn.bin bw.bin rows.bin nbytes.bin
//       M: mantissa bits (3: E4M3, 2: E5M2); x / out: uint8 codes [N, T, D]; rows: uint8 [N, T*D]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "host_block_fp8.h"

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
static void decode_block(const Geom& g, const uint8_t* blk, const uint8_t* b8, const uint8_t* b16, uint32_t* out) {
  std::vector<uint32_t> b8p(g.D / 2), dbp(g.D / 2);
  head_consts(g, b8, b16, b8p.data(), dbp.data());
  gaac_v3::decode_block(g, blk, b8p.data(), dbp.data(), out, g.D / 2);
}

template <int M>
static int run_fp8(bool dec, char** argv) {
  const int T = std::atoi(argv[0]), D = std::atoi(argv[1]), N = std::atoi(argv[2]);
  const Geom g = make_geom_fp8(T, D, M);
  if (dec) {
    const int row_bytes = std::atoi(argv[3]);
    auto blocks = read_file(argv[4]), bn = read_file(argv[5]), bw = read_file(argv[6]);
    std::vector<uint8_t> out((size_t)N * T * D);
    std::vector<uint32_t> b8p(D / 2), dbp(D / 2);
    for (int i = 0; i < N; ++i) {
      head_consts(g, &bn[(size_t)i * D], &bw[(size_t)i * D], b8p.data(), dbp.data());
      decode_block_fp8<M>(g, &blocks[(size_t)i * row_bytes], b8p.data(), dbp.data(), &out[(size_t)i * T * D]);
    }
    write_file(argv[7], out.data(), out.size());
  } else {
    auto x = read_file(argv[3]), bn = read_file(argv[4]), bw = read_file(argv[5]);
    const int cap = T * D;
    std::vector<uint8_t> rows((size_t)N * cap);
    std::vector<int32_t> nbytes(N);
    for (int i = 0; i < N; ++i)
      nbytes[i] = encode_block_fp8<M>(g, &x[(size_t)i * cap], &bn[(size_t)i * D], &bw[(size_t)i * D], &rows[(size_t)i * cap], cap);
    write_file(argv[6], rows.data(), rows.size());
    write_file(argv[7], nbytes.data(), nbytes.size() * 4);
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) { std::fprintf(stderr, "usage: see the header of host_driver.cpp\n"); return 2; }
  const bool fp8 = !std::strcmp(argv[1], "decode_fp8") || !std::strcmp(argv[1], "encode_fp8");
  if (fp8 && argc == 11) {
    const int m = std::atoi(argv[2]);
    const bool dec = !std::strcmp(argv[1], "decode_fp8");
    if (m == 3) return run_fp8<3>(dec, argv + 3);
    if (m == 2) return run_fp8<2>(dec, argv + 3);
  }
  const bool dec = !std::strcmp(argv[1], "decode");
  if (fp8 || (dec && argc != 10) || (!dec && (std::strcmp(argv[1], "encode") || argc != 10))) {
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
      nbytes[i] = gaac_v3::encode_block(g, reinterpret_cast<const uint32_t*>(&x[(size_t)i * T * D * 2]), &b8[(size_t)i * D],
                               &b16[(size_t)i * D], &rows[(size_t)i * cap], cap);
    write_file(argv[8], rows.data(), rows.size());
    write_file(argv[9], nbytes.data(), nbytes.size() * 4);
  }
  return 0;
}
