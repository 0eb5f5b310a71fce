// gaac/ptx.cuh -- the few PTX instructions the decode kernels use, one inline wrapper each.
//
// Header-free on purpose: NVRTC compiles these sources with no CUDA include path, so nothing here
// needs <cuda_bf16.h> or <stdint.h>. BF16 values travel as raw 16-bit patterns packed in pairs
// into 32-bit registers (the lower element of a pair in the low half, as the MMA operands expect).
#pragma once

namespace gaac {

typedef unsigned int u32;
typedef unsigned short u16;
typedef long long i64;

// Programmatic dependent launch (sm_90+; lab define GAAC_PDL, off). With GAAC_PDL=1 the host launches the kernel
// with programmatic stream serialization (runtime.launch does so for a module built with it): the kernel may start
// while the previous kernel of the stream still runs, so its first statement must be pdl_wait(), which returns once
// every earlier kernel has finished and its writes are visible; before it the kernel reads nothing. That overlaps
// a launch's latency (the idle device time between kernels of a replayed graph) with the kernel before it.
// pdl_launch_dependents() lets the next kernel, if it too is launched so, start early (it still waits for this one
// to finish before reading anything). The design follows the CUDA programming guide's PDL section; with
// GAAC_PDL=0 both are empty and the cubins are those without them.
#ifndef GAAC_PDL
#define GAAC_PDL 0
#endif
__device__ __forceinline__ void pdl_wait() {
#if GAAC_PDL && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if GAAC_PDL && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
  return static_cast<u32>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous global->shared copy; src_bytes = 0 writes 16 zero bytes (masked rows).
// (An L2::256B prefetch hint was timed in call 3 and changed nothing at B=1 64K. L2_HINT, a lab define, off:
// session 33's Nsight Compute run found the twin asking L2 for 1.5x the sectors FA2 does at B=16 32K, with
// the same LDGSTS count and DRAM bytes; FA2's copies carry the 128B hint. 128 / 256 select the hint.)
#ifndef L2_HINT
#define L2_HINT 0
#endif
#if L2_HINT == 128
#define GAAC_L2_HINT ".L2::128B"
#elif L2_HINT == 256
#define GAAC_L2_HINT ".L2::256B"
#else
#define GAAC_L2_HINT ""
#endif
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global" GAAC_L2_HINT " [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes));
}
// The same copy without the src-size operand (every byte read): PLAIN_COPY's whole tiles (decode_attention.cu).
__device__ __forceinline__ void cp_async16_full(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global" GAAC_L2_HINT " [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
// 4- or 8-byte asynchronous global->shared copy through L1 (.ca; .cg takes 16 bytes only): small
// metadata (block-table entries, segment-table words) staged without a register waiting on it.
template <int N>
__device__ __forceinline__ void cp_async_small(void* dst, const void* src) {
  static_assert(N == 4 || N == 8, "cp.async.ca copies 4, 8 or 16 bytes");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(smem_addr(dst)), "l"(src), "n"(N));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ---- mbarrier + 1-D bulk copy (the copy engine, sm_90): completion counted in bytes ----
__device__ __forceinline__ void mbar_init(unsigned long long* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
// Arrive once and announce `bytes` of bulk copies that will complete on this barrier's phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
// Arrive once (release: this thread's earlier shared-memory reads and writes happen before).
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Wait for the phase of `parity` to complete. try_wait suspends the thread until the phase completes or a
// time limit passes; without a hint that limit is short, and the retry loop (TRYWAIT, BRA, YIELD) was ~30%
// of the fused kernel's executed instructions (lab/cuda-decode-notebook.md, call L3), issue slots the
// decoding warps of the same scheduler could use. MBAR_SUSPEND_NS gives the limit, in ns, as a hint
// (CUTLASS's ClusterBarrier::wait passes 0x989680); 0 = the hardware's own limit.
#ifndef MBAR_SUSPEND_NS
#define MBAR_SUSPEND_NS 10000000
#endif
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, u32 parity) {
#if MBAR_SUSPEND_NS
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1, %2;\n"
      " @!p bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)), "r"(parity), "r"(static_cast<u32>(MBAR_SUSPEND_NS))
      : "memory");
#else
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)), "r"(parity)
      : "memory");
#endif
}
// Order this thread's earlier shared-memory accesses before later async-proxy (copy engine) ones.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Copy `bytes` (multiple of 16, both addresses 16-byte aligned) global -> shared; completes on `bar`.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, u32 bytes, unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// Four 8x8 b16 matrices from shared memory; lane l gives the row address of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// D = A * B + D, m16n8k16, bf16 operands, fp32 accumulators (PTX ISA fragment layouts).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Transpose an 8x8 b16 matrix held one row-pair per lane (the accumulator layout) in registers.
__device__ __forceinline__ u32 movmatrix_trans(u32 x) {
  u32 y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Two fp32 -> one bf16x2 word, round to nearest even; lo lands in the low half.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ u16 to_bf16(float x) {
  return static_cast<u16>(pack_bf16x2(x, 0.f) & 0xFFFFu);
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float log2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace gaac
