// gaac/stamps.cuh -- phase timestamps of one CTA (lab builds only: GAAC_STAMPS=1; every call compiles to nothing
// otherwise, so product cubins are unchanged). Thread 0 records %globaltimer (ns, comparable across SMs) and clock64
// (the SM's cycles, precise within a CTA) at numbered points and saves them to a global buffer before the CTA's
// merge arrival (save); the final merging CTA of a (sequence, kv head) prints every split's line when it is done
// (print_stream), so printf runs only after the measured work (a printf per CTA as it left inflated the merge
// phases of the others, call Y12):
//   GAAC_STAMP x y z code t0..t7 c0..c7      (code: 0 left after its partial, 1 merged a chunk, 2 final merge)
// lab/experiments/v4_stamps.py reads the lines of one launch and reports where a call's time goes.
#pragma once

#ifndef GAAC_STAMPS
#define GAAC_STAMPS 0
#endif

namespace gaac {
namespace stamps {

constexpr int N = 8, CTAS = 8192, ROW = 2 * N + 1;
#if GAAC_STAMPS
__shared__ unsigned long long t_ns[N], t_clk[N];
__device__ unsigned long long buf[CTAS][ROW];
__device__ __forceinline__ int cta_of(int x) { return (x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)) % CTAS; }
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

__device__ __forceinline__ void save(int code) {
#if GAAC_STAMPS
  if (threadIdx.x == 0) {
    unsigned long long* row = buf[cta_of(blockIdx.x)];
    for (int i = 0; i < N; ++i) {
      row[i] = t_ns[i];
      row[N + i] = t_clk[i];
    }
    row[2 * N] = static_cast<unsigned long long>(code);
  }
#else
  (void)code;
#endif
}

// every split of this CTA's (sequence, kv head): their saves were published by the merge's fences
__device__ __forceinline__ void print_stream() {
#if GAAC_STAMPS
  if (threadIdx.x != 0) return;
  for (int x = 0; x < static_cast<int>(gridDim.x); ++x) {
    const volatile unsigned long long* r = buf[cta_of(x)];
    printf("GAAC_STAMP %d %d %d %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu\n",
           x, blockIdx.y, blockIdx.z, r[16], r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11],
           r[12], r[13], r[14], r[15]);
  }
#endif
}

}  // namespace stamps
}  // namespace gaac
