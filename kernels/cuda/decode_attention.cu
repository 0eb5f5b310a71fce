// Split-KV GQA decode attention (q_len = 1) over the paged BF16 cache, tensor cores, swap-AB.
//
// Design followed (read, not copied): flash-decoding (split the context over CTAs, merge the
// splits by log-sum-exp), FlashInfer's decode (all query heads of a GQA group share each K/V tile
// staged in shared memory by a multi-stage cp.async ring), and the swap-AB trick of FlashInfer's SM90
// MLA decode: with only G <= 16 query heads per kv head, K/V rows go on the MMA's M side and the
// heads on its N side (S^T = K Q^T, O^T = V^T P^T), so no MMA row is padding.
//
// Compile-time parameters (-D): HEAD_DIM (multiple of 16, <= 256), GROUP (query heads per kv head,
// 1..16), PAGE (cache block size T, multiple of 16), WARPS (warps per CTA; each warp owns 16 rows of
// a stage), STAGES (>= 2), optional MIN_CTAS_PER_SM (launch-bounds occupancy hint, default 1: it caps
// the registers at 64K / (32 * WARPS * MIN_CTAS_PER_SM)).
//
// Grid (num_splits, Hkv, B); split s of sequence b covers positions
// [s * tokens_per_split, (s + 1) * tokens_per_split) clipped on the device to [kv_start[b], len[b]),
// so the launch shape depends only on host integers (CUDA-graph safe). num_splits == 1 writes the
// BF16 output directly; otherwise each split writes (o / l, log2-sum-exp) and the last CTA of its
// (sequence, kv head) to finish merges them (gaac_decode_combine is the same merge as a kernel of
// its own, kept for callers that produce partials elsewhere).
//
// Per warp and 16-row chunk: 16 x (HEAD_DIM/16) ldmatrix + MMA for S^T (rows = tokens, cols =
// heads), an online softmax in base 2 on the accumulator fragments, movmatrix to turn P^T's
// accumulator layout into the B-operand layout, then HEAD_DIM/16 ldmatrix.trans + MMA for O^T.
// Each warp copies, and reads, only its own 16 rows of every stage (its own cp.async ring, synced
// with __syncwarp), keeps its own softmax state, and the warps are merged through shared memory at
// the end: the only CTA barriers are at the end.
#include "gaac/ptx.cuh"
#include "gaac/paged.cuh"

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif
#ifndef MIN_CTAS_PER_SM
#define MIN_CTAS_PER_SM 1
#endif
#ifndef LOADER  // 0: cp.async 16 B per lane; 1: the copy engine (cp.async.bulk, one row per lane)
#define LOADER 0
#endif

namespace {
using namespace gaac;

constexpr int D = HEAD_DIM;
constexpr int G = GROUP;
constexpr int NT = (G + 7) / 8;      // MMA n-tiles of 8 query heads
constexpr int T = PAGE;
constexpr int W = WARPS;
constexpr int S = STAGES;
constexpr int TILE = 16 * W;         // rows per pipeline stage
constexpr int ROW = D + 8;           // smem row stride in b16: +16 B keeps ldmatrix conflict-free
constexpr int KS = D / 16;           // k-steps of S^T = K Q^T, m-tiles of O^T
constexpr int CPR = D / 8;           // 16-byte chunks per row
constexpr int THREADS = 32 * W;
constexpr int STAGE_ELEMS = TILE * ROW;
#define NEG_INF (-__int_as_float(0x7f800000))

static_assert(D % 16 == 0 && D >= 16 && D <= 256, "HEAD_DIM must be a multiple of 16 up to 256");
static_assert(G >= 1 && G <= 16, "GROUP must be 1..16");
static_assert(T % 16 == 0, "PAGE must be a multiple of 16");
static_assert(S >= 2, "STAGES must be >= 2");
static_assert((16 * CPR) % 32 == 0, "a warp's 16 rows must spread evenly over its lanes");

// Where a warp's 16 rows [tok0, tok0 + 16) start in K and V. tok0 is a multiple of 16 and so is T,
// so the rows lie in one block: one table look-up per warp and stage, made one iteration before the
// rows are issued so its latency hides behind a stage of compute instead of stalling the copies.
struct StageSrc {
  const u16* k;
  const u16* v;
};
__device__ __forceinline__ StageSrc stage_src(const PagedRows<T, D>& kp, const PagedRows<T, D>& vp, int tok0) {
  return {kp.block(tok0 / T) + (tok0 % T) * D, vp.block(tok0 / T) + (tok0 % T) * D};
}

// Stage one warp's 16 rows [tok0, tok0 + 16) of K and V into shared memory (its own rows of the
// stage: warps never read each other's rows, so each warp runs its own ring and waits for its own
// copies; no CTA barrier per stage). Rows outside [lo, hi) are written as zeros.
__device__ __forceinline__ void issue_rows(u16* sk, u16* sv, const PagedRows<T, D>& kp,
                                           const PagedRows<T, D>& vp, StageSrc src, int tok0, int lo,
                                           int hi, int lane) {
  constexpr int PER_LANE = 16 * CPR / 32;
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) {
    const int c = lane + i * 32;
    const int r = c / CPR;
    const int col = (c % CPR) * 8;
    const int p = tok0 + r;
    const bool ok = p >= lo && p < hi;
    const u16* ks = src.k + r * D;
    const u16* vs = src.v + r * D;
    // a masked row reads nothing (src-size 0) but still gets a valid address
    cp_async16(sk + r * ROW + col, ok ? ks + col : kp.tail, ok ? 16 : 0);
    cp_async16(sv + r * ROW + col, ok ? vs + col : vp.tail, ok ? 16 : 0);
  }
}

// The copy-engine variant: lane r < 16 copies K row r, lane 16 + r copies V row r (one bulk copy of
// D * 2 bytes each, into the padded shared-memory row), completing on the warp's barrier of this
// slot. A row outside [lo, hi) is not copied: a masked K row is never used (its score is -inf) and
// a masked V row is written with zeros by its lane (0 * garbage could be NaN in the MMA).
__device__ __forceinline__ void issue_rows_bulk(u16* sk, u16* sv, StageSrc src, int tok0, int lo, int hi,
                                                int lane, unsigned long long* bar) {
  const int r = lane & 15;
  const bool is_v = lane >= 16;
  const int p = tok0 + r;
  const bool ok = p >= lo && p < hi;
  // rows of this warp-stage that are copied: [max(lo, tok0), min(hi, tok0 + 16))
  const int nvalid = max(0, min(hi, tok0 + 16) - max(lo, tok0));
  if (lane == 0) mbar_arrive_expect_tx(bar, static_cast<u32>(nvalid) * (2u * D * 2u));
  __syncwarp();
  u16* dst = (is_v ? sv : sk) + r * ROW;
  if (ok) {
    bulk_copy_g2s(dst, (is_v ? src.v : src.k) + r * D, D * 2, bar);
  } else if (is_v) {
    uint4* d4 = reinterpret_cast<uint4*>(dst);
#pragma unroll
    for (int i = 0; i < D / 8; ++i) d4[i] = make_uint4(0u, 0u, 0u, 0u);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS, MIN_CTAS_PER_SM)
gaac_bf16_decode_split(const u16* __restrict__ q,        // [B, Hkv*G, D]
                       const u16* __restrict__ k_raw,    // [num_raw, T, D]
                       const u16* __restrict__ v_raw,
                       const int* __restrict__ k_table,  // [B, Hkv, max_blocks]
                       const int* __restrict__ v_table,
                       const u16* __restrict__ k_tail,   // [B, Hkv, T, D]
                       const u16* __restrict__ v_tail,
                       const int* __restrict__ num_blocks,  // [B]
                       const int* __restrict__ tail_len,    // [B]
                       const int* __restrict__ kv_start,    // [B] or null
                       float* __restrict__ part_o,          // [B, Hkv*G, splits, D]
                       float* __restrict__ part_lse,        // [B, Hkv*G, splits]
                       u16* __restrict__ out,               // [B, Hkv*G, D]
                       int* __restrict__ counters,          // [B*Hkv], zero between calls
                       int hkv, int max_blocks, int tokens_per_split, float scale_log2) {
  extern __shared__ __align__(16) unsigned char smem[];
  u16* sk = reinterpret_cast<u16*>(smem);
  u16* sv = sk + S * STAGE_ELEMS;

  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int splits = gridDim.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int hq0 = h * G;
  const int hq_total = hkv * G;

  const int nb = num_blocks[b];
  const int len = nb * T + tail_len[b];
  const int lo = kv_start != nullptr ? max(kv_start[b], 0) : 0;
  const int s0 = split * tokens_per_split;
  const int hi = min(s0 + tokens_per_split, len);
  const int first = max(s0, lo / TILE * TILE);
  const int n_tiles = hi > first ? (hi - first + TILE - 1) / TILE : 0;

  const i64 bh = static_cast<i64>(b) * hkv + h;
  PagedRows<T, D> kp{k_raw, k_tail + bh * T * D, k_table + bh * max_blocks, nb};
  PagedRows<T, D> vp{v_raw, v_tail + bh * T * D, v_table + bh * max_blocks, nb};

  float o[KS][NT][4];
#pragma unroll
  for (int m = 0; m < KS; ++m)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) o[m][nt][j] = 0.f;
  float m_run[NT][2], l_run[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    m_run[nt][0] = m_run[nt][1] = NEG_INF;
    l_run[nt][0] = l_run[nt][1] = 0.f;
  }

  // prologue: S - 1 stages of this warp's rows in flight, the table entries of the next one loaded
  const int wrow = warp * 16;  // this warp's rows in every stage
#if LOADER == 1
  __shared__ __align__(8) unsigned long long bars[W * S];
  unsigned long long* wbar = bars + warp * S;
  if (lane == 0)
    for (int s = 0; s < S; ++s) mbar_init(wbar + s, 1);
  fence_proxy_async();
  __syncwarp();
#endif
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    const int t = first + s * TILE + wrow;
#if LOADER == 1
    if (s < n_tiles) issue_rows_bulk(sk + s * STAGE_ELEMS + wrow * ROW, sv + s * STAGE_ELEMS + wrow * ROW,
                                     stage_src(kp, vp, t), t, lo, hi, lane, wbar + s);
#else
    if (s < n_tiles) issue_rows(sk + s * STAGE_ELEMS + wrow * ROW, sv + s * STAGE_ELEMS + wrow * ROW, kp, vp,
                                stage_src(kp, vp, t), t, lo, hi, lane);
    cp_async_commit();
#endif
  }
  StageSrc next_src = stage_src(kp, vp, first + (S - 1) * TILE + wrow);  // blocks past the end read no table

  // Q after the first copies are in flight: its load latency overlaps theirs
  // Q^T as B fragments: b0 = Q[head g][16k + 2t4 .. +1], b1 = Q[head g][16k + 8 + 2t4 .. +1].
  u32 qf[NT][KS][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int head = nt * 8 + g;
    const u32* qrow = reinterpret_cast<const u32*>(q + (static_cast<i64>(b) * hq_total + hq0 + head) * D);
#pragma unroll
    for (int k = 0; k < KS; ++k) {
      qf[nt][k][0] = head < G ? __ldg(qrow + (16 * k + 2 * t4) / 2) : 0u;
      qf[nt][k][1] = head < G ? __ldg(qrow + (16 * k + 8 + 2 * t4) / 2) : 0u;
    }
  }


  // ldmatrix lane addressing (see the PTX ISA fragment layouts):
  // K as A (row-major 16x16): rows (lane & 7) + 8 * ((lane >> 3) & 1), cols 8 * (lane >> 4)
  const int ka_row = (lane & 7) + ((lane >> 3) & 1) * 8, ka_col = (lane >> 4) * 8;
  // V^T as A via .trans: stored rows (tokens) (lane & 7) + 8 * (lane >> 4), cols 8 * ((lane >> 3) & 1)
  const int va_row = (lane & 7) + (lane >> 4) * 8, va_col = ((lane >> 3) & 1) * 8;

  for (int it = 0; it < n_tiles; ++it) {
#if LOADER == 1
    mbar_wait(wbar + it % S, (it / S) & 1);
    __syncwarp();  // every lane passed its reads of the slot refilled below (and the zero rows landed)
#else
    cp_async_wait<S - 2>();
    __syncwarp();  // this warp's copies of stage `it` landed; its reads of the slot refilled below are done
#endif
    {
      const int nx = it + S - 1;
      const int slot = nx % S;
#if LOADER == 1
      if (nx < n_tiles) {
        fence_proxy_async();  // the slot's earlier generic reads/writes before the copy engine's writes
        issue_rows_bulk(sk + slot * STAGE_ELEMS + wrow * ROW, sv + slot * STAGE_ELEMS + wrow * ROW, next_src,
                        first + nx * TILE + wrow, lo, hi, lane, wbar + slot);
      }
#else
      if (nx < n_tiles) issue_rows(sk + slot * STAGE_ELEMS + wrow * ROW, sv + slot * STAGE_ELEMS + wrow * ROW, kp, vp,
                                   next_src, first + nx * TILE + wrow, lo, hi, lane);
      cp_async_commit();
#endif
      // look up the stage after it now; its latency overlaps this stage's compute
      if (nx + 1 < n_tiles) next_src = stage_src(kp, vp, first + (nx + 1) * TILE + wrow);
    }
    const int slot = it % S;
    const u16* ks = sk + slot * STAGE_ELEMS + (warp * 16) * ROW;
    const u16* vs = sv + slot * STAGE_ELEMS + (warp * 16) * ROW;
    const int tok0 = first + it * TILE + warp * 16;

    // S^T[16 tokens x 8 heads] per n-tile
    float sacc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) sacc[nt][j] = 0.f;
#pragma unroll
    for (int k = 0; k < KS; ++k) {
      u32 a[4];
      ldmatrix_x4(a, ks + ka_row * ROW + 16 * k + ka_col);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma_bf16_16816(sacc[nt], a, qf[nt][k][0], qf[nt][k][1]);
    }

    // online softmax: this lane holds tokens g and g + 8, heads 2*t4 and 2*t4 + 1 of each n-tile
    const bool ok0 = tok0 + g >= lo && tok0 + g < hi;
    const bool ok1 = tok0 + g + 8 >= lo && tok0 + g + 8 < hi;
    u32 pb[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float s[4];
      s[0] = ok0 ? sacc[nt][0] * scale_log2 : NEG_INF;
      s[1] = ok0 ? sacc[nt][1] * scale_log2 : NEG_INF;
      s[2] = ok1 ? sacc[nt][2] * scale_log2 : NEG_INF;
      s[3] = ok1 ? sacc[nt][3] * scale_log2 : NEG_INF;
      float mx[2] = {fmaxf(s[0], s[2]), fmaxf(s[1], s[3])};
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffffu, mx[c], 4));
        mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffffu, mx[c], 8));
        mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffffu, mx[c], 16));
      }
      float alpha[2], ref[2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float m_new = fmaxf(m_run[nt][c], mx[c]);
        ref[c] = m_new == NEG_INF ? 0.f : m_new;  // nothing seen yet: keep exp2 away from inf - inf
        alpha[c] = exp2_approx(m_run[nt][c] - ref[c]);
        m_run[nt][c] = m_new;
      }
      float p[4];
      p[0] = exp2_approx(s[0] - ref[0]);
      p[1] = exp2_approx(s[1] - ref[1]);
      p[2] = exp2_approx(s[2] - ref[0]);
      p[3] = exp2_approx(s[3] - ref[1]);
      l_run[nt][0] = l_run[nt][0] * alpha[0] + (p[0] + p[2]);
      l_run[nt][1] = l_run[nt][1] * alpha[1] + (p[1] + p[3]);
#pragma unroll
      for (int m = 0; m < KS; ++m) {
        o[m][nt][0] *= alpha[0];
        o[m][nt][1] *= alpha[1];
        o[m][nt][2] *= alpha[0];
        o[m][nt][3] *= alpha[1];
      }
      // accumulator layout (row = token, col pair = heads) -> B layout (k = token pair, n = head)
      pb[nt][0] = movmatrix_trans(pack_bf16x2(p[0], p[1]));
      pb[nt][1] = movmatrix_trans(pack_bf16x2(p[2], p[3]));
    }

    // O^T[d x heads] += V^T[d x 16 tokens] P^T[16 tokens x heads]
#pragma unroll
    for (int m = 0; m < KS; ++m) {
      u32 a[4];
      ldmatrix_x4_trans(a, vs + va_row * ROW + 16 * m + va_col);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma_bf16_16816(o[m][nt], a, pb[nt][0], pb[nt][1]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // ---- merge the warps' softmax states through shared memory (the ring is free now) ----
  float* sm_m = reinterpret_cast<float*>(smem);            // [W][NT*8]
  float* sm_l = sm_m + W * NT * 8;                          // [W][NT*8]
  float* sm_o = sm_l + W * NT * 8;                          // [W][NT*8][D]
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float l = l_run[nt][c];
      l += __shfl_xor_sync(0xffffffffu, l, 4);
      l += __shfl_xor_sync(0xffffffffu, l, 8);
      l += __shfl_xor_sync(0xffffffffu, l, 16);
      const int head = nt * 8 + 2 * t4 + c;
      if (g == 0) {
        sm_m[warp * NT * 8 + head] = m_run[nt][c];
        sm_l[warp * NT * 8 + head] = l;
      }
    }
#pragma unroll
    for (int m = 0; m < KS; ++m) {
      float* base = sm_o + (warp * NT * 8 + nt * 8 + 2 * t4) * D + 16 * m + g;
      base[0] = o[m][nt][0];
      base[D] = o[m][nt][1];
      base[8] = o[m][nt][2];
      base[D + 8] = o[m][nt][3];
    }
  }
  __syncthreads();

  for (int i = tid; i < G * D; i += THREADS) {
    const int head = i / D, d = i % D;
    float mx = NEG_INF;
#pragma unroll
    for (int w = 0; w < W; ++w) mx = fmaxf(mx, sm_m[w * NT * 8 + head]);
    const float ref = mx == NEG_INF ? 0.f : mx;
    float l = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float sc = exp2_approx(sm_m[w * NT * 8 + head] - ref);
      l += sm_l[w * NT * 8 + head] * sc;
      acc += sm_o[(w * NT * 8 + head) * D + d] * sc;
    }
    const i64 row = static_cast<i64>(b) * hq_total + hq0 + head;
    const float val = l > 0.f ? acc / l : 0.f;
    if (splits == 1) {
      out[row * D + d] = to_bf16(val);
    } else {
      part_o[(row * splits + split) * D + d] = val;
      if (d == 0) part_lse[row * splits + split] = l > 0.f ? ref + log2_approx(l) : NEG_INF;
    }
  }
  if (splits == 1) return;

  // ---- the last CTA of this (sequence, kv head) to finish merges all splits (no second launch) ----
  // threadFenceReduction pattern: partials stored, fence, count; the CTA that brings the count to
  // `splits` reads everyone's partials (L2, bypassing L1) and resets the counter for the next call,
  // so the counter buffer stays zero between calls (and across CUDA-graph replays).
  __shared__ int is_last;
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const int prev = atomicAdd(counters + bh, 1);
    is_last = prev == splits - 1;
    if (is_last) counters[bh] = 0;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  // weights of the splits per head in shared memory (the ring and the warp merge are done with it;
  // the host sizes the dynamic shared memory to hold G * splits floats)
  float* wts = reinterpret_cast<float*>(smem);
  const i64 row0 = static_cast<i64>(b) * hq_total + hq0;
  for (int i = tid; i < G * splits; i += THREADS) wts[i] = __ldcg(part_lse + row0 * splits + i);
  __syncthreads();
  // one warp per head: lanes over the splits (max, then the normalised weights)
  for (int head = warp; head < G; head += W) {
    float* w = wts + head * splits;
    float mx = NEG_INF;
    for (int s2 = lane; s2 < splits; s2 += 32) mx = fmaxf(mx, w[s2]);
#pragma unroll
    for (int o2 = 16; o2 > 0; o2 >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o2));
    const float ref = mx == NEG_INF ? 0.f : mx;
    float wsum = 0.f;
    for (int s2 = lane; s2 < splits; s2 += 32) {
      w[s2] = exp2_approx(w[s2] - ref);
      wsum += w[s2];
    }
#pragma unroll
    for (int o2 = 16; o2 > 0; o2 >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, o2);
    const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
    for (int s2 = lane; s2 < splits; s2 += 32) w[s2] *= inv;
  }
  __syncthreads();
  // one thread per (head, 4 channels): float4 loads of every split's partial, many in flight
  constexpr int D4 = D / 4;
  for (int i = tid; i < G * D4; i += THREADS) {
    const int head = i / D4, d4 = i % D4;
    const float* w = wts + head * splits;
    const float4* po = reinterpret_cast<const float4*>(part_o + (row0 + head) * splits * D) + d4;
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma unroll 16
    for (int s2 = 0; s2 < splits; ++s2) {
      const float4 x = __ldcg(po + s2 * D4);
      const float ww = w[s2];
      a0 += ww * x.x;
      a1 += ww * x.y;
      a2 += ww * x.z;
      a3 += ww * x.w;
    }
    u32* o32 = reinterpret_cast<u32*>(out + (row0 + head) * D + 4 * d4);
    o32[0] = pack_bf16x2(a0, a1);
    o32[1] = pack_bf16x2(a2, a3);
  }
}

// Merge the splits of each (sequence, query head) by their log2-sum-exp; one CTA per row, one
// thread per channel. Rows whose splits saw no token (all lse = -inf) come out as zeros.
extern "C" __global__ void gaac_decode_combine(const float* __restrict__ part_o,   // [R, splits, D]
                                               const float* __restrict__ part_lse, // [R, splits]
                                               u16* __restrict__ out,              // [R, D]
                                               int splits) {
  const i64 row = blockIdx.x;
  const float* lse = part_lse + row * splits;
  float mx = NEG_INF;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, lse[s]);
  const float ref = mx == NEG_INF ? 0.f : mx;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float wsum = 0.f, acc = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float w = exp2_approx(lse[s] - ref);
      wsum += w;
      acc += w * part_o[(row * splits + s) * D + d];
    }
    out[row * D + d] = to_bf16(wsum > 0.f ? acc / wsum : 0.f);
  }
}
