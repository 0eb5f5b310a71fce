// Lab probe (session 39): what one kernel boundary costs inside a replayed CUDA graph, by the kind of neighbour.
// Two kernels with one job each: `small` (a few threads, no shared memory) and `big` (one CTA per SM with
// `smem` bytes of dynamic shared memory, as the v4 attention and cuBLAS's TMA GEMMs take), each adding 1 to one
// int so the chain has a data dependence. Built with GAAC_PDL=1 both wait (griddepcontrol.wait) first and may be
// launched early (programmatic dependent launch). Not product code: lab/experiments/graph_gaps/probe.py times it.
#include "gaac/ptx.cuh"

extern "C" __global__ void probe_small(int* __restrict__ x) {
  gaac::pdl_wait();
  gaac::pdl_launch_dependents();
  if (threadIdx.x == 0 && blockIdx.x == 0) x[0] += 1;
}

extern "C" __global__ void probe_big(int* __restrict__ x, int smem_bytes) {
  gaac::pdl_wait();
  gaac::pdl_launch_dependents();
  extern __shared__ int buf[];
  // the launch reserves smem_bytes; touching one word per thread (and the last) keeps the kernel itself short
  buf[threadIdx.x] = threadIdx.x;
  if (threadIdx.x == 0) buf[smem_bytes / 4 - 1] = 0;
  __syncthreads();
  if (threadIdx.x == 0 && blockIdx.x == 0) x[0] += 1 + (buf[5] == -1);
}
