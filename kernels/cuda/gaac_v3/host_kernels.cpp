// Runs the CUDA kernels of kernels.cu on the CPU through host_cuda_shim.h (tests/test_v3_kernels_host.py).
// Build: g++ -std=c++20 -O1 -pthread -DBLOCK_T=64 -DHEAD_DIM=128 [-DGAAC_FP8=1|2] host_kernels.cpp -o host_kernels
//   host_kernels encode N x.bin b8.bin b16.bin rows.bin nbytes.bin          (bases uint8 [N, D])
//   host_kernels decode N GRID pool.bin entries.bin b8p.bin dbp.bin out.bin   (pair tables int32 [N, D/2])
//   host_kernels reduce N GRID pool.bin entries.bin b8p.bin dbp.bin fold.bin  (BF16 tiles only)
//   host_kernels pack N rows.bin nbytes.bin x.bin offs.bin POOL_BYTES pool.bin  (offs int64 [N]; pool poisoned)
// x / out: BF16 (GAAC_FP8: uint8 codes) [N, T, D]; rows uint8 [N, CAP]. Outputs start poisoned.
#include "host_cuda_shim.h"
#include "kernels.cu"

#include <cstdio>
#include <cstdlib>
#include <string>

static std::vector<uint8_t> rd(const char* path) {
  FILE* f = std::fopen(path, "rb");
  if (!f) { std::perror(path); std::exit(2); }
  std::fseek(f, 0, SEEK_END);
  const long n = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  std::vector<uint8_t> v(n + 16);
  if (n && std::fread(v.data(), 1, n, f) != (size_t)n) { std::perror(path); std::exit(2); }
  std::fclose(f);
  v.resize(n);
  return v;
}
static void wr(const char* path, const void* p, size_t n) {
  FILE* f = std::fopen(path, "wb");
  if (!f || std::fwrite(p, 1, n, f) != n) { std::perror(path); std::exit(2); }
  std::fclose(f);
}
// 16-byte aligned copies (the kernels use 16-byte vector loads)
template <class T>
static T* aligned_copy(const std::vector<uint8_t>& v, size_t extra = 0) {
  void* p = std::aligned_alloc(64, (v.size() + extra + 63) / 64 * 64);
  std::memcpy(p, v.data(), v.size());
  return reinterpret_cast<T*>(p);
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const int n = argc > 2 ? std::atoi(argv[2]) : 0;
  if (mode == "encode" && argc == 8) {
    auto x = rd(argv[3]), b8 = rd(argv[4]), b16 = rd(argv[5]);
    std::vector<uint8_t> rows((size_t)n * CAP, 0xA5);  // poison: the kernel must write every byte of a block
    std::vector<int> nbytes(n, -1);
    uint8_t* rp = aligned_copy<uint8_t>(rows);
    shim::launch(gaac_v3_encode, n, 32 * GEO.segs, (const value_t*)aligned_copy<value_t>(x), (const uint8_t*)aligned_copy<uint8_t>(b8),
                 (const uint8_t*)aligned_copy<uint8_t>(b16), D, rp, nbytes.data());
    wr(argv[6], rp, rows.size());
    wr(argv[7], nbytes.data(), nbytes.size() * 4);
    return 0;
  }
  if ((mode == "decode" || mode == "reduce") && argc == 9) {
    const int grid = std::atoi(argv[3]);
    auto pool = rd(argv[4]), ent = rd(argv[5]), b8p = rd(argv[6]), dbp = rd(argv[7]);
    const uint8_t* pp = aligned_copy<uint8_t>(pool, 64);
    const long long* ep = aligned_copy<long long>(ent);
    const uint32_t* b8 = aligned_copy<uint32_t>(b8p);
    const uint32_t* db = aligned_copy<uint32_t>(dbp);
    if (mode == "decode") {
      std::vector<uint8_t> out((size_t)n * NUMEL * sizeof(value_t));
      value_t* op = aligned_copy<value_t>(out);
      for (size_t i = 0; i < (size_t)n * NUMEL; ++i) op[i] = (value_t)0x7FA5;  // poison (FP8: 0xA5)
      shim::launch(gaac_v3_decode, grid, DECODE_THREADS, pp, ep, b8, db, D / 2, op, n);
      wr(argv[8], op, out.size());
    } else {
#ifdef GAAC_FP8
      std::fprintf(stderr, "FP8 tiles have no decode-and-reduce kernel\n");
      return 2;
#else
      std::vector<uint32_t> fold(grid, 0xDEADBEEFu);
      shim::launch(gaac_v3_decode_reduce, grid, DECODE_THREADS, pp, ep, b8, db, D / 2, fold.data(), n);
      wr(argv[8], fold.data(), fold.size() * 4);
#endif
    }
    return 0;
  }
  if (mode == "pack" && argc == 9) {
    auto rows = rd(argv[3]), nb = rd(argv[4]), x = rd(argv[5]), offs = rd(argv[6]);
    const size_t pool_bytes = std::strtoull(argv[7], nullptr, 10);
    std::vector<uint8_t> pool(pool_bytes, 0xA5);  // poison: only the blocks' bytes may be written
    uint8_t* pp = aligned_copy<uint8_t>(pool);
    shim::launch(gaac_v3_pack, n, 256, (const uint8_t*)aligned_copy<uint8_t>(rows), (const int*)aligned_copy<int>(nb),
                 (const uint8_t*)aligned_copy<uint8_t>(x), (const long long*)aligned_copy<long long>(offs), pp);
    wr(argv[8], pp, pool.size());
    return 0;
  }
  std::fprintf(stderr, "bad arguments (see the header of host_kernels.cpp)\n");
  return 2;
}
