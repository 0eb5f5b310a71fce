// gaac/stamps.cuh -- phase timestamps of one CTA (lab builds only: GAAC_STAMPS=1; every call compiles to nothing
// otherwise, so product cubins are unchanged). Thread 0 records %globaltimer (ns, comparable across SMs) and clock64
// (the SM's cycles, precise within a CTA) at numbered points and prints one line per CTA when it leaves:
//   GAAC_STAMP x y z last t0..t7 c0..c7
// lab/experiments/v4_stamps.py reads the lines of one launch and reports where a call's time goes.
#pragma once

#ifndef GAAC_STAMPS
#define GAAC_STAMPS 0
#endif

namespace gaac {
namespace stamps {

constexpr int N = 8;
#if GAAC_STAMPS
__shared__ unsigned long long t_ns[N], t_clk[N];
#endif

__device__ __forceinline__ void reset() {
#if GAAC_STAMPS
  if (threadIdx.x == 0)
    for (int i = 0; i < N; ++i) t_ns[i] = t_clk[i] = 0ull;
#endif
}

__device__ __forceinline__ void mark(int i) {
#if GAAC_STAMPS
  if (threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    t_ns[i] = t;
    t_clk[i] = clock64();
  }
#endif
}

__device__ __forceinline__ void print(int last) {
#if GAAC_STAMPS
  if (threadIdx.x == 0)
    printf("GAAC_STAMP %d %d %d %d %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu\n",
           blockIdx.x, blockIdx.y, blockIdx.z, last, t_ns[0], t_ns[1], t_ns[2], t_ns[3], t_ns[4], t_ns[5], t_ns[6],
           t_ns[7], t_clk[0], t_clk[1], t_clk[2], t_clk[3], t_clk[4], t_clk[5], t_clk[6], t_clk[7]);
#else
  (void)last;
#endif
}

}  // namespace stamps
}  // namespace gaac
