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
// a stage), STAGES (>= 2; 1 with the cp.async loader: no copy overlaps compute, for launches whose
// rings do not fit otherwise, e.g. the twin of the v4 kernel's 8 warps at d = 256), optional MIN_CTAS_PER_SM (launch-bounds occupancy hint, default 1: it caps
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
#include "gaac/attend.cuh"  // the per-warp attention arithmetic and the merges, shared with the fused kernel

#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif
#ifndef MIN_CTAS_PER_SM
#define MIN_CTAS_PER_SM 1
#endif
#ifndef LOADER  // 0: cp.async 16 B per lane; 1: the copy engine (cp.async.bulk, one row per lane)
#define LOADER 0
#endif
#ifndef COPY_QUADS  // lab define (session 35): copy_slot's 4 rows x 128 B per copy instruction
#define COPY_QUADS 0
#endif
static_assert(!COPY_QUADS || HEAD_DIM % 64 == 0, "COPY_QUADS copies 128-byte groups of a row: HEAD_DIM % 64 == 0");
#ifndef PLAIN_COPY  // lab define (session 35): 1 copies tiles whose rows are all valid without cp.async's src-size
#define PLAIN_COPY 0  // (zero-fill) operand, as FA2 predicates copies instead. Call Y24 (H200): its copies still ask
#endif                // L2 for 24 sectors per 512 B (FA2's: 16) and the time moved 0.1-0.3%: off

namespace {
using namespace gaac;

using attend::D;
using attend::G;
using attend::ROW;
using attend::THREADS;
using attend::W;
constexpr int T = PAGE;
constexpr int S = STAGES;
constexpr int TILE = 16 * W;         // rows per pipeline stage
constexpr int CPR = D / 8;           // 16-byte chunks per row
constexpr int STAGE_ELEMS = TILE * ROW;
#define NEG_INF GAAC_NEG_INF

static_assert(T % 16 == 0, "PAGE must be a multiple of 16");
static_assert(S >= 2 || (S == 1 && LOADER == 0), "STAGES must be >= 2 (1 only with the cp.async loader)");
static_assert(!SWIZZLE || LOADER == 0,
              "SWIZZLE permutes chunks within a row: the cp.async loader only (a bulk copy writes a row whole)");
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

#ifndef SPEC_ENTRIES
#define SPEC_ENTRIES 0  // lab A/B (not run yet): the first stages' table entries and Q read at entry (Spec says why)
#endif
// SPEC_ENTRIES=1: the prologue's chain is lengths (split_range) -> table entries -> copies, three DRAM trips before
// the first stage lands, and Q's loads go out after the copies. The v4 kernel's SPEC_TABLE idea: read the entries of
// the blocks a warp's first S stages land on if the split starts where nominal (split * tokens_per_split, no left
// padding past it) beside the lengths, and Q too; stage_src uses an entry where its block is the one read and reads
// the table as before where not. Any entry of the row [0, max_blocks) may be read; only those below nb are used.
struct Spec {
  int blk[S];
  int k[S], v[S];
  __device__ __forceinline__ void read(const int* kt, const int* vt, int max_blocks, int tok0) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      blk[s] = (tok0 + s * TILE) / T;
      k[s] = v[s] = 0;
      if (blk[s] < max_blocks) {
        k[s] = __ldg(kt + blk[s]);
        v[s] = __ldg(vt + blk[s]);
      } else {
        blk[s] = -1;
      }
    }
  }
  __device__ __forceinline__ StageSrc src(const PagedRows<T, D>& kp, const PagedRows<T, D>& vp, int tok0, int s) const {
    const int b_ = tok0 / T, r = (tok0 % T) * D;
    if (b_ != blk[s] || b_ >= kp.nb) return stage_src(kp, vp, tok0);
    return {kp.raw + static_cast<i64>(~k[s]) * (T * D) + r, vp.raw + static_cast<i64>(~v[s]) * (T * D) + r};
  }
};

// Which 16-byte chunk of which of the warp's 16 rows lane `lane` copies in its copy instruction i (0 .. CPR / 2 - 1).
// Default: the warp's 32 chunks of one instruction run along the rows (2 rows x 256 B at d = 128). COPY_QUADS (lab
// define, session 35): 4 rows x 128 B per instruction, the pattern FA2's copies have (its 64-column shared-memory
// tiles), whose requests Nsight Compute counts at 16 L2 sectors per 512 B where ours count 24 (calls Y20, Y21, Y24).
__device__ __forceinline__ void copy_slot(int i, int lane, int& r, int& chunk) {
#if COPY_QUADS
  constexpr int G8 = CPR / 8;  // 128-byte groups per row
  r = (i / G8) * 4 + lane / 8;
  chunk = (i % G8) * 8 + lane % 8;
#else
  const int c = lane + i * 32;
  r = c / CPR;
  chunk = c % CPR;
#endif
}

// Stage one warp's 16 rows [tok0, tok0 + 16) of K and V into shared memory (its own rows of the
// stage: warps never read each other's rows, so each warp runs its own ring and waits for its own
// copies; no CTA barrier per stage). Rows outside [lo, hi) are written as zeros.
__device__ __forceinline__ void issue_rows(u16* sk, u16* sv, const PagedRows<T, D>& kp,
                                           const PagedRows<T, D>& vp, StageSrc src, int tok0, int lo,
                                           int hi, int lane) {
  constexpr int PER_LANE = 16 * CPR / 32;
#if PLAIN_COPY
  if (tok0 >= lo && tok0 + 16 <= hi) {  // warp-uniform: every row valid, copies without the src-size operand
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
      int r, chunk;
      copy_slot(i, lane, r, chunk);
      const int at = r * ROW + 8 * attend::chunk_at(r, chunk), col = chunk * 8;
      cp_async16_full(sk + at, src.k + r * D + col);
      cp_async16_full(sv + at, src.v + r * D + col);
    }
    return;
  }
#endif
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) {
    int r, chunk;
    copy_slot(i, lane, r, chunk);
    const int col = chunk * 8;
    const int p = tok0 + r;
    const bool ok = p >= lo && p < hi;
    const u16* ks = src.k + r * D;
    const u16* vs = src.v + r * D;
    // a masked row reads nothing (src-size 0) but still gets a valid address
#if SWIZZLE
    const int at = r * ROW + 8 * attend::chunk_at(r, chunk);
    cp_async16(sk + at, ok ? ks + col : kp.tail, ok ? 16 : 0);
    cp_async16(sv + at, ok ? vs + col : vp.tail, ok ? 16 : 0);
#else
    cp_async16(sk + r * ROW + col, ok ? ks + col : kp.tail, ok ? 16 : 0);
    cp_async16(sv + r * ROW + col, ok ? vs + col : vp.tail, ok ? 16 : 0);
#endif
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
  const int hq0 = h * G;
  const int hq_total = hkv * G;

#if SPEC_ENTRIES
  const i64 bh = static_cast<i64>(b) * hkv + h;
  const int wrow = warp * 16;  // this warp's rows in every stage
  attend::WarpState st;
  Spec sp;
  sp.read(k_table + bh * max_blocks, v_table + bh * max_blocks, max_blocks, split * tokens_per_split + wrow);
  st.load_q(q + (static_cast<i64>(b) * hq_total + hq0) * D, lane);
#endif
  const attend::SplitRange rg = attend::split_range(num_blocks, tail_len, kv_start, b, split, tokens_per_split, T, TILE);
  const int nb = rg.nb, lo = rg.lo, hi = rg.hi, first = rg.first, n_tiles = rg.n_tiles;

#if !SPEC_ENTRIES  // (bh, st and wrow where they always were: the default cubin is the one every GPU test ran)
  const i64 bh = static_cast<i64>(b) * hkv + h;
#endif
  PagedRows<T, D> kp{k_raw, k_tail + bh * T * D, k_table + bh * max_blocks, nb};
  PagedRows<T, D> vp{v_raw, v_tail + bh * T * D, v_table + bh * max_blocks, nb};
#if SPEC_ENTRIES
  // the stage sources of the prologue: the speculative entries where the split starts where nominal
  auto src_at = [&](int t, int s_) { return sp.src(kp, vp, t, s_); };
#else
  auto src_at = [&](int t, int) { return stage_src(kp, vp, t); };
#endif

  stamps::reset();
  stamps::mark(0);
#if !SPEC_ENTRIES
  attend::WarpState st;
#endif
  st.init();

#if !SPEC_ENTRIES
  const int wrow = warp * 16;  // this warp's rows in every stage
#endif
  // prologue: S - 1 stages of this warp's rows in flight, the table entries of the next one loaded
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
                                     src_at(t, s), t, lo, hi, lane, wbar + s);
#else
    if (s < n_tiles) issue_rows(sk + s * STAGE_ELEMS + wrow * ROW, sv + s * STAGE_ELEMS + wrow * ROW, kp, vp,
                                src_at(t, s), t, lo, hi, lane);
    cp_async_commit();
#endif
  }
  StageSrc next_src = src_at(first + (S - 1) * TILE + wrow, S - 1);  // blocks past the end read no table

  // Q after the first copies are in flight: its load latency overlaps theirs (SPEC_ENTRIES: loaded at entry)
  if (!SPEC_ENTRIES) st.load_q(q + (static_cast<i64>(b) * hq_total + hq0) * D, lane);
  stamps::mark(1);

  for (int it = 0; it < n_tiles; ++it) {
#if LOADER == 1
    mbar_wait(wbar + it % S, (it / S) & 1);
    __syncwarp();  // every lane passed its reads of the slot refilled below (and the zero rows landed)
#else
    if (S >= 2) cp_async_wait<(S >= 2 ? S - 2 : 0)>();
    __syncwarp();  // this warp's copies of stage `it` landed (S = 1: below); its reads of the slot refilled below are done
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
#if LOADER == 0
      if (S == 1) {  // one slot: stage `it` was issued just now
        cp_async_wait<0>();
        __syncwarp();
      }
#endif
    }
    if (it == 0) stamps::mark(2);  // GAAC_STAMPS builds only: the first tile staged
    const int slot = it % S;
    st.rows(sk + slot * STAGE_ELEMS + wrow * ROW, sv + slot * STAGE_ELEMS + wrow * ROW, first + it * TILE + wrow, lo,
            hi, lane, scale_log2);
  }
  cp_async_wait<0>();
  stamps::mark(3);
  __syncthreads();
  attend::finish(st, smem, attend::Output{part_o, part_lse, out, counters, static_cast<i64>(b) * hq_total + hq0, bh,
                                          split, splits});
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
