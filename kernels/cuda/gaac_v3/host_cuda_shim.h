// Host stand-in for the CUDA execution model, for tests only: runs kernels.cu's kernels on the CPU,
// one CTA at a time, one std::thread per CUDA thread, warp primitives (ballot, shuffles, syncwarp) and
// __syncthreads as barriers. Slow, but it executes the real kernel source (lane roles, addressing,
// the fix-up walk, the encoder's ranks) so the tests can compare it with the PyTorch reference
// without a GPU. Device-only branches of core.cuh (inline PTX) are not exercised here.
#pragma once
#include <barrier>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define GAAC_HOST_SHIM 1  // kernels.cu: the copy engine's bulk store becomes a memcpy (see bulk_store_s2g)

struct uint4 { uint32_t x, y, z, w; };
struct uint2 { uint32_t x, y; };
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return uint4{a, b, c, d}; }
inline uint2 make_uint2(uint32_t a, uint32_t b) { return uint2{a, b}; }
struct shim_dim3 { unsigned x = 0, y = 0, z = 0; };
inline thread_local shim_dim3 threadIdx, blockIdx;
inline shim_dim3 blockDim, gridDim;

namespace shim {
struct Warp {
  std::barrier<> bar{32};
  uint32_t vals[32];
};
inline std::vector<std::unique_ptr<Warp>> warps;
inline std::unique_ptr<std::barrier<>> cta;
inline Warp& my_warp() { return *warps[threadIdx.x / 32]; }
inline uint32_t exchange(uint32_t v, int src) {  // every lane publishes v, reads lane src's
  Warp& w = my_warp();
  const int lane = threadIdx.x & 31;
  w.vals[lane] = v;
  w.bar.arrive_and_wait();
  const uint32_t r = w.vals[src & 31];
  w.bar.arrive_and_wait();
  return r;
}
template <class K, class... A>
void launch(K kernel, unsigned grid, unsigned block, A... args) {
  gridDim = shim_dim3{grid, 1, 1};
  blockDim = shim_dim3{block, 1, 1};
  for (unsigned b = 0; b < grid; ++b) {
    warps.clear();
    for (unsigned i = 0; i < block / 32; ++i) warps.push_back(std::make_unique<Warp>());
    cta = std::make_unique<std::barrier<>>(block);
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < block; ++t)
      ts.emplace_back([=] {
        threadIdx = shim_dim3{t, 0, 0};
        blockIdx = shim_dim3{b, 0, 0};
        kernel(args...);
      });
    for (auto& t : ts) t.join();
  }
}
}  // namespace shim

inline unsigned __ballot_sync(unsigned, int pred) {
  shim::Warp& w = shim::my_warp();
  const int lane = threadIdx.x & 31;
  w.vals[lane] = pred != 0;
  w.bar.arrive_and_wait();
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= w.vals[i] << i;
  w.bar.arrive_and_wait();
  return r;
}
inline int __shfl_up_sync(unsigned, int v, int d) {
  const int lane = threadIdx.x & 31;
  const int r = (int)shim::exchange((uint32_t)v, lane >= d ? lane - d : lane);
  return r;
}
inline int __shfl_sync(unsigned, int v, int src) { return (int)shim::exchange((uint32_t)v, src); }
inline uint32_t __shfl_xor_sync(unsigned, uint32_t v, int m) { return shim::exchange(v, (threadIdx.x & 31) ^ m); }
inline void __syncwarp() { shim::my_warp().bar.arrive_and_wait(); }
inline void __syncthreads() { shim::cta->arrive_and_wait(); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
