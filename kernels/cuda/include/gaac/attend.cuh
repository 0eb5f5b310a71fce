// gaac/attend.cuh -- the attention arithmetic of one warp (one job: 16 staged K/V rows -> softmax
// state; then the warp and split merges). Shared by the BF16 kernel (decode_attention.cu) and the
// fused GAAC v3 kernel (decode_attention_v3.cu): both feed the MMAs from the same padded
// shared-memory rows through the same code, so for the same launch (warps, split boundaries) they
// do the same floating-point operations in the same order, and a fused output that differs from
// the BF16 twin's in any bit means the fused kernel decoded a K/V bit wrong.
//
// Swap-AB (FlashInfer's SM90 MLA decode trick, our own code): with G <= 16 query heads per kv head,
// K/V rows are the MMA's M side and the heads its N side: S^T = K Q^T, O^T = V^T P^T.
//
// The includer defines HEAD_DIM, GROUP, WARPS before including.
#pragma once
#include "ptx.cuh"
#include "stamps.cuh"

namespace gaac {
namespace attend {

constexpr int D = HEAD_DIM;
constexpr int G = GROUP;
constexpr int W = WARPS;
constexpr int NT = (G + 7) / 8;  // MMA n-tiles of 8 query heads
constexpr int KS = D / 16;       // k-steps of S^T = K Q^T, m-tiles of O^T
#ifndef ROW_PAD
#define ROW_PAD 8  // lab define (session 34): call Y20's per-SASS counters show the twin's copies asking L2 for 24
#endif            // sectors per 512 B (16 ideal) with shared-memory wavefronts in excess; 0 tests the padding's part
static_assert(ROW_PAD % 8 == 0 && ROW_PAD <= 8, "ROW_PAD: 0 or 8 b16 (the host sizes shared memory for D + 8)");
#ifndef SWIZZLE
#define SWIZZLE 0  // lab define (session 34): staged rows unpadded, their 16-byte chunks XOR-permuted (chunk_at)
#endif
static_assert(!SWIZZLE || D % 64 == 0, "SWIZZLE permutes chunks within 128-byte groups of a row: HEAD_DIM % 64 == 0");
// smem row stride in b16: +16 B keeps ldmatrix conflict-free; SWIZZLE instead keeps rows unpadded (every row starts
// on a 128-byte line, so a warp's 512-byte copy fills 4 whole lines) and stores chunk j of row r at chunk
// j ^ (r & 7): the 8 rows one ldmatrix reads at the same chunk land on 8 different 16-byte bank groups (the
// XOR layout CUTLASS's SM80 shared-memory swizzles use; ours is its 3-bit, 16-byte-unit case)
constexpr int ROW = SWIZZLE ? D : D + ROW_PAD;
// Where chunk `chunk` (16 bytes, 8 b16) of staged row `r` lives within the row, in chunks. Rows are counted from an
// 8-row-aligned base (a warp's 16 rows start at a multiple of 16 in every stage).
__device__ __forceinline__ int chunk_at(int r, int chunk) { return SWIZZLE ? (chunk ^ (r & 7)) : chunk; }
constexpr int THREADS = 32 * W;
#define GAAC_NEG_INF (-__int_as_float(0x7f800000))

static_assert(D % 16 == 0 && D >= 16 && D <= 256, "HEAD_DIM must be a multiple of 16 up to 256");
static_assert(G >= 1 && G <= 16, "GROUP must be 1..16");

struct NoHook {
  __device__ __forceinline__ void operator()() const {}
};

// One warp's running softmax state over the rows it has seen, and Q^T as MMA B fragments.
struct WarpState {
  float o[KS][NT][4];
  float m_run[NT][2], l_run[NT][2];
  u32 qf[NT][KS][2];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int m = 0; m < KS; ++m)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int j = 0; j < 4; ++j) o[m][nt][j] = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      m_run[nt][0] = m_run[nt][1] = GAAC_NEG_INF;
      l_run[nt][0] = l_run[nt][1] = 0.f;
    }
  }

  // Q^T as B fragments: b0 = Q[head g][16k + 2t4 .. +1], b1 = Q[head g][16k + 8 + 2t4 .. +1].
  // q_heads: the G query heads of this kv head, [G, D].
  __device__ __forceinline__ void load_q(const u16* q_heads, int lane) {
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int head = nt * 8 + g;
      const u32* qrow = reinterpret_cast<const u32*>(q_heads + head * D);
#pragma unroll
      for (int k = 0; k < KS; ++k) {
        qf[nt][k][0] = head < G ? __ldg(qrow + (16 * k + 2 * t4) / 2) : 0u;
        qf[nt][k][1] = head < G ? __ldg(qrow + (16 * k + 8 + 2 * t4) / 2) : 0u;
      }
    }
  }

  // Attend to 16 rows staged in shared memory: ks / vs = row 0 of K / V (row stride ROW); row r is
  // position tok0 + r, used only if lo <= tok0 + r < hi (a masked V row must hold finite values).
  // after_k() runs once the K rows have been read (S is in registers): a warp-specialised caller
  // signals there that the K buffer may be refilled while this warp still works on V. It adds no
  // arithmetic, so the result is the same with or without it.
  template <class AfterK = NoHook>
  __device__ __forceinline__ void rows(const u16* ks, const u16* vs, int tok0, int lo, int hi, int lane,
                                       float scale_log2, AfterK after_k = AfterK()) {
    // ldmatrix lane addressing (see the PTX ISA fragment layouts):
    // K as A (row-major 16x16): rows (lane & 7) + 8 * ((lane >> 3) & 1), cols 8 * (lane >> 4)
    const int ka_row = (lane & 7) + ((lane >> 3) & 1) * 8, ka_col = (lane >> 4) * 8;
    // V^T as A via .trans: stored rows (tokens) (lane & 7) + 8 * (lane >> 4), cols 8 * ((lane >> 3) & 1)
    const int va_row = (lane & 7) + (lane >> 4) * 8, va_col = ((lane >> 3) & 1) * 8;
#if SWIZZLE
    rows_from([&](int k, u32 (&a)[4]) { ldmatrix_x4(a, ks + ka_row * ROW + 8 * chunk_at(ka_row, 2 * k + ka_col / 8)); },
              [&](int m, u32 (&a)[4]) {
                ldmatrix_x4_trans(a, vs + va_row * ROW + 8 * chunk_at(va_row, 2 * m + va_col / 8));
              },
              tok0, lo, hi, lane, scale_log2, after_k);
#else
    rows_from([&](int k, u32 (&a)[4]) { ldmatrix_x4(a, ks + ka_row * ROW + 16 * k + ka_col); },
              [&](int m, u32 (&a)[4]) { ldmatrix_x4_trans(a, vs + va_row * ROW + 16 * m + va_col); }, tok0, lo, hi,
              lane, scale_log2, after_k);
#endif
  }

  // The same arithmetic on A fragments from any source: k_frag(k, a) gives K's m16n8k16 A fragment of
  // k-step k (rows = the 16 tokens, cols = channels 16k..16k+15), v_frag(m, a) V^T's of m-tile m (rows =
  // channels 16m..16m+15, cols = the 16 tokens), in the PTX ISA register layout (register 0: row lane/4,
  // cols 2(lane%4), +1; register 1: row + 8; registers 2, 3: cols + 8). Called in order k = 0..KS-1, then
  // m = 0..KS-1; a kernel that decodes straight into registers feeds the MMAs through here, so its output
  // is bit-identical to the ldmatrix path for the same fragments.
  template <class KFrag, class VFrag, class AfterK = NoHook>
  __device__ __forceinline__ void rows_from(KFrag k_frag, VFrag v_frag, int tok0, int lo, int hi, int lane,
                                            float scale_log2, AfterK after_k = AfterK()) {
    const int g = lane >> 2;

    // S^T[16 tokens x 8 heads] per n-tile
    float sacc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) sacc[nt][j] = 0.f;
#pragma unroll
    for (int k = 0; k < KS; ++k) {
      u32 a[4];
      k_frag(k, a);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma_bf16_16816(sacc[nt], a, qf[nt][k][0], qf[nt][k][1]);
    }
    after_k();

    // online softmax: this lane holds tokens g and g + 8, heads 2*t4 and 2*t4 + 1 of each n-tile
    const bool ok0 = tok0 + g >= lo && tok0 + g < hi;
    const bool ok1 = tok0 + g + 8 >= lo && tok0 + g + 8 < hi;
    u32 pb[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float s[4];
      s[0] = ok0 ? sacc[nt][0] * scale_log2 : GAAC_NEG_INF;
      s[1] = ok0 ? sacc[nt][1] * scale_log2 : GAAC_NEG_INF;
      s[2] = ok1 ? sacc[nt][2] * scale_log2 : GAAC_NEG_INF;
      s[3] = ok1 ? sacc[nt][3] * scale_log2 : GAAC_NEG_INF;
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
        ref[c] = m_new == GAAC_NEG_INF ? 0.f : m_new;  // nothing seen yet: keep exp2 away from inf - inf
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
      v_frag(m, a);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma_bf16_16816(o[m][nt], a, pb[nt][0], pb[nt][1]);
    }
  }
};

// Where a CTA's result goes: one (split, kv head, sequence) of the grid.
struct Output {
  float* part_o;    // [B, Hq, splits, D]
  float* part_lse;  // [B, Hq, splits]
  u16* out;         // [B, Hq, D]
  int* counters;    // [B * Hkv], zero between calls
  i64 row0;         // b * Hq + h * G: the first query head row of this CTA
  i64 bh;           // b * Hkv + h
  int split, splits;
};

// The tokens one CTA attends to: split `split` of sequence `b` (num_blocks full blocks of `page`
// tokens + tail_len, the first kv_start positions masked), in tiles of `tile` rows starting at
// `first` (a multiple of `tile`, so the BF16 and fused kernels walk the same tiles).
struct SplitRange {
  int nb;       // complete blocks of the sequence
  int lo, hi;   // attended positions [lo, hi) of this split
  int first;    // first row of the first tile
  int n_tiles;  // tiles of `tile` rows from `first`
};
__device__ __forceinline__ SplitRange split_range(const int* num_blocks, const int* tail_len, const int* kv_start,
                                                  int b, int split, int tokens_per_split, int page, int tile) {
  SplitRange r;
  r.nb = num_blocks[b];
  const int len = r.nb * page + tail_len[b];
  r.lo = kv_start != nullptr ? max(kv_start[b], 0) : 0;
  const int s0 = split * tokens_per_split;
  r.hi = min(s0 + tokens_per_split, len);
  r.first = max(s0, r.lo / tile * tile);
  r.n_tiles = r.hi > r.first ? (r.hi - r.first + tile - 1) / tile : 0;
  return r;
}

// One merged (head, 4 channels) item: to the bf16 output (final) or to partial row `first`.
__device__ __forceinline__ void store_item(const Output& dst, int head, int d4, int first, bool final, float4 a) {
  if (final) {
    u32* o32 = reinterpret_cast<u32*>(dst.out + (dst.row0 + head) * D + 4 * d4);
    o32[0] = pack_bf16x2(a.x, a.y);
    o32[1] = pack_bf16x2(a.z, a.w);
  } else {
    reinterpret_cast<float4*>(dst.part_o + ((dst.row0 + head) * dst.splits + first) * D)[d4] = a;
  }
}

#ifndef MERGE_CHUNK
#define MERGE_CHUNK 0
#endif
#ifndef MERGE_BATCH
#define MERGE_BATCH 0  // 1 = loads in batches of 16, 2 = runs of 16, 8, 4, 2, 1 (merge_splits says why); the v4
#endif                 // planner passes 2 at head_dim >= 128 (fused_attention_v4.merge_batch), the twin keeps 0

// threadFenceReduction arrival: every thread of the CTA calls it after its stores; true in the CTA
// whose arrival brings *counter to `total` (that CTA resets it to zero for the next call and for
// CUDA-graph replays, and sees every other CTA's stores).
#ifndef ARRIVE_RELEASE
#define ARRIVE_RELEASE 1  // on since call Y14 (H100 A/B, lab/results/arrive_release_h100.json); 0 = the fences before
#endif
__device__ __forceinline__ bool arrive_last(int* counter, int total) {
  __shared__ int is_last;
#if ARRIVE_RELEASE
  // The release/acquire pattern of CUTLASS's semaphore: the CTA barrier orders every thread's partial stores before
  // thread 0's gpu-scope release (cumulative in the PTX memory model); its acquire and the barrier after it order
  // the other CTAs' stores before every thread's later loads (L2 loads, __ldcg). ARRIVE_RELEASE=0 (the build before
  // call Y14, kept for A/Bs) has each thread run __threadfence (MEMBAR.SC.GPU + CCTL.IVALL in SASS) on the way to the
  // count, at both merge levels: 0.7-6% slower per call on the H100 (B=1 rows, the largest on the shortest calls).
  __syncthreads();
  if (threadIdx.x == 0) {
    int prev;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(prev) : "l"(counter) : "memory");
    is_last = prev == total - 1;
    if (is_last) *counter = 0;
  }
  __syncthreads();
  const bool last = is_last;
  __syncthreads();  // is_last is reused by the next arrival
  return last;
#else
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int prev = atomicAdd(counter, 1);
    is_last = prev == total - 1;
    if (is_last) *counter = 0;
  }
  __syncthreads();
  const bool last = is_last;
  __syncthreads();  // is_last is reused by the next arrival
  if (last) __threadfence();
  return last;
#endif
}

#if MERGE_BATCH == 2
// One run of MERGE_BATCH=2's merge: the N partials s0 .. s0 + N - 1 of one item, every load issued before the first
// FMA (one L2 round trip), then the FMAs in split order (the order of the plain loop: same bits).
template <int N>
__device__ __forceinline__ void merge_run(const float4* po, const float* w, int s0, int step, float4& a) {
  float4 x[N];
#pragma unroll
  for (int u = 0; u < N; ++u) x[u] = __ldcg(po + (s0 + u) * step);
#pragma unroll
  for (int u = 0; u < N; ++u) {
    const float ww = w[s0 + u];
    a.x += ww * x[u].x;
    a.y += ww * x[u].y;
    a.z += ww * x[u].z;
    a.w += ww * x[u].w;
  }
}
#endif

// Merge `n` split partials of this CTA's G heads: rows first, first + stride, ... of part_o / part_lse
// (each normalised by its own sum, with its log2-sum-exp). final: the bf16 output; else the merged
// partial and its log2-sum-exp go to row `first` (in place: every thread reads its own item's rows
// before it writes them, and the weights are in shared memory before any lse is written).
__device__ __forceinline__ void merge_splits(const Output& dst, unsigned char* smem, int first, int stride, int n,
                                             bool final, int nthreads) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = nthreads >> 5;
  const int splits = dst.splits;
  // weights of the splits per head in shared memory (the host sizes it for n = splits: merge_smem_bytes)
  float* wts = reinterpret_cast<float*>(smem);
  for (int i = tid; i < G * n; i += nthreads) {
    const int head = i / n, k = i % n;
    wts[i] = __ldcg(dst.part_lse + (dst.row0 + head) * splits + first + k * stride);
  }
  __syncthreads();
  // one warp per head: lanes over the splits (max, then the normalised weights)
  for (int head = warp; head < G; head += nwarps) {
    float* w = wts + head * n;
    float mx = GAAC_NEG_INF;
    for (int s2 = lane; s2 < n; s2 += 32) mx = fmaxf(mx, w[s2]);
#pragma unroll
    for (int o2 = 16; o2 > 0; o2 >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o2));
    const float ref = mx == GAAC_NEG_INF ? 0.f : mx;
    float wsum = 0.f;
    for (int s2 = lane; s2 < n; s2 += 32) {
      w[s2] = exp2_approx(w[s2] - ref);
      wsum += w[s2];
    }
#pragma unroll
    for (int o2 = 16; o2 > 0; o2 >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, o2);
    const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
    for (int s2 = lane; s2 < n; s2 += 32) w[s2] *= inv;
    if (!final && lane == 0)
      dst.part_lse[(dst.row0 + head) * splits + first] = wsum > 0.f ? ref + log2_approx(wsum) : GAAC_NEG_INF;
  }
  __syncthreads();
  // one thread per (head, 4 channels) item: float4 loads of every split's partial, 16 in flight. Spreading an
  // item over several threads (partials added through shared memory, 8 in flight) was slower on the H100:
  // SmolLM2 B=1 16K 12.7 -> 14.7 us, Gemma3 B=1 16K 24.4 -> 27.1 (lab/results/x2_session24/).
  constexpr int D4 = D / 4;
#if MERGE_BATCH == 2
  // runs of 16, then at most one run each of 8, 4, 2 and 1 for the remainder: every load of a run in flight together
  // and none past n. Call Y19 (H100, lab/results/v4_ab_h100_y19.json) timed MERGE_BATCH=1 (below): -14% at Gemma3 B=1
  // 16K (final merge of 9 chunks: 9 trips -> 1), -6.5% at Qwen3 B=1 16K (15 splits), but +3.2% at SmolLM2 B=1 16K
  // (65 splits: its last batch loads 15 partials it never uses). Here a remainder of r costs popcount(r) trips
  // (15 -> 4, 9 -> 2, 1 -> 1) and no unused load. Same split order: same bits.
  for (int i = tid; i < G * D4; i += nthreads) {
    const int head = i / D4, d4 = i % D4;
    const float* w = wts + head * n;
    const float4* po = reinterpret_cast<const float4*>(dst.part_o + ((dst.row0 + head) * splits + first) * D) + d4;
    const int step = stride * D4;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
    int s0 = 0;
    for (; s0 + 16 <= n; s0 += 16) merge_run<16>(po, w, s0, step, a);
    if (n - s0 >= 8) {
      merge_run<8>(po, w, s0, step, a);
      s0 += 8;
    }
    if (n - s0 >= 4) {
      merge_run<4>(po, w, s0, step, a);
      s0 += 4;
    }
    if (n - s0 >= 2) {
      merge_run<2>(po, w, s0, step, a);
      s0 += 2;
    }
    if (n - s0 >= 1) merge_run<1>(po, w, s0, step, a);
    store_item(dst, head, d4, first, final, a);
  }
#elif MERGE_BATCH
  // every split's partial in batches of 16 loads issued together. With `#pragma unroll 16` over a run-time n (the
  // build below) the compiler batches whole groups of 16 and runs the remainder (n % 16, all of n < 16) as a loop of
  // one load and its FMAs, one L2 round trip each (SASS: the remainder's LDG.E.128.STRONG.GPU all land in one
  // register). Gemma3 B=1's final merge (9 chunks, two items per thread at d = 256) was 18 trips in a row. An index
  // past n reads split n - 1 again and its FMAs are skipped (predicated loads let ptxas interleave them with the
  // FMAs, ~4 in flight; tests/test_v4_cuda_build.py checks the runs of 16). Accumulation order is unchanged: same bits.
  for (int i = tid; i < G * D4; i += nthreads) {
    const int head = i / D4, d4 = i % D4;
    const float* w = wts + head * n;
    const float4* po = reinterpret_cast<const float4*>(dst.part_o + ((dst.row0 + head) * splits + first) * D) + d4;
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
    for (int s0 = 0; s0 < n; s0 += 16) {
      float4 x[16];
#pragma unroll
      for (int u = 0; u < 16; ++u)  // past n: split n - 1 again (unpredicated loads stay batched), never used
        x[u] = __ldcg(po + min(s0 + u, n - 1) * stride * D4);
#pragma unroll
      for (int u = 0; u < 16; ++u) {
        if (s0 + u < n) {
          const float ww = w[s0 + u];
          a0 += ww * x[u].x;
          a1 += ww * x[u].y;
          a2 += ww * x[u].z;
          a3 += ww * x[u].w;
        }
      }
    }
    store_item(dst, head, d4, first, final, make_float4(a0, a1, a2, a3));
  }
#else
  for (int i = tid; i < G * D4; i += nthreads) {
    const int head = i / D4, d4 = i % D4;
    const float* w = wts + head * n;
    const float4* po = reinterpret_cast<const float4*>(dst.part_o + ((dst.row0 + head) * splits + first) * D) + d4;
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma unroll 16
    for (int s2 = 0; s2 < n; ++s2) {
      const float4 x = __ldcg(po + s2 * stride * D4);
      const float ww = w[s2];
      a0 += ww * x.x;
      a1 += ww * x.y;
      a2 += ww * x.z;
      a3 += ww * x.w;
    }
    store_item(dst, head, d4, first, final, make_float4(a0, a1, a2, a3));
  }
#endif
}

// Merge the warps' states through shared memory (smem: the CTA's dynamic shared memory, free now,
// at least 4 * (2 * W * NT * 8 + W * NT * 8 * D) bytes and attention.py's merge_smem_bytes()), write
// the CTA's result, and when splits > 1 let the last CTA of this (sequence, kv head) merge every split in the same
// launch (threadFenceReduction pattern; the counter returns to zero for the next call and for
// CUDA-graph replays). Every thread of the CTA calls this: the W warps holding softmax states
// (warps 0 .. W-1) and, in a warp-specialised kernel, `nthreads - THREADS` more that help merge.
__device__ __forceinline__ void finish(const WarpState& st, unsigned char* smem, const Output& dst,
                                       int nthreads = THREADS) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int splits = dst.splits, split = dst.split;
  float* sm_m = reinterpret_cast<float*>(smem);  // [W][NT*8]
  float* sm_l = sm_m + W * NT * 8;               // [W][NT*8]
  float* sm_o = sm_l + W * NT * 8;               // [W][NT*8][D]
  if (warp < W) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float l = st.l_run[nt][c];
      l += __shfl_xor_sync(0xffffffffu, l, 4);
      l += __shfl_xor_sync(0xffffffffu, l, 8);
      l += __shfl_xor_sync(0xffffffffu, l, 16);
      const int head = nt * 8 + 2 * t4 + c;
      if (g == 0) {
        sm_m[warp * NT * 8 + head] = st.m_run[nt][c];
        sm_l[warp * NT * 8 + head] = l;
      }
    }
#pragma unroll
    for (int m = 0; m < KS; ++m) {
      float* base = sm_o + (warp * NT * 8 + nt * 8 + 2 * t4) * D + 16 * m + g;
      base[0] = st.o[m][nt][0];
      base[D] = st.o[m][nt][1];
      base[8] = st.o[m][nt][2];
      base[D + 8] = st.o[m][nt][3];
    }
  }
  }
  __syncthreads();

  for (int i = tid; i < G * D; i += nthreads) {
    const int head = i / D, d = i % D;
    float mx = GAAC_NEG_INF;
#pragma unroll
    for (int w = 0; w < W; ++w) mx = fmaxf(mx, sm_m[w * NT * 8 + head]);
    const float ref = mx == GAAC_NEG_INF ? 0.f : mx;
    float l = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float sc = exp2_approx(sm_m[w * NT * 8 + head] - ref);
      l += sm_l[w * NT * 8 + head] * sc;
      acc += sm_o[(w * NT * 8 + head) * D + d] * sc;
    }
    const i64 row = dst.row0 + head;
    const float val = l > 0.f ? acc / l : 0.f;
    if (splits == 1) {
      dst.out[row * D + d] = to_bf16(val);
    } else {
      dst.part_o[(row * splits + split) * D + d] = val;
      if (d == 0) dst.part_lse[row * splits + split] = l > 0.f ? ref + log2_approx(l) : GAAC_NEG_INF;
    }
  }
  stamps::mark(4);
  if (splits == 1) {
    stamps::save(2);
    stamps::print_stream();
    return;
  }

  // ---- the last CTA of this (sequence, kv head) to finish merges all splits (no second launch) ----
  // partials stored, fence, count; the CTA that brings the count to its total reads everyone's
  // partials (L2, bypassing L1) and resets the counter for the next call. With MERGE_CHUNK = C > 0 (the
  // host sets it where one CTA would read too much: attention.py merge_chunk) the merge has two
  // levels: the last CTA of each chunk of C consecutive splits merges them into the chunk's first
  // slot (part_o / part_lse rows, in place), then the last chunk to finish merges the chunks. Counters
  // per (sequence, kv head): [final, chunk 0, chunk 1, ...] (attention.py merge_counters).
  const bool tree = MERGE_CHUNK > 0 && splits > MERGE_CHUNK;
  const int nch = tree ? (splits + MERGE_CHUNK - 1) / MERGE_CHUNK : 0;
  int* const base = dst.counters + dst.bh * (1 + nch);
  if (tree) {
    const int chunk = split / MERGE_CHUNK, c0 = chunk * MERGE_CHUNK;
    const int cn = splits - c0 < MERGE_CHUNK ? splits - c0 : MERGE_CHUNK;
    stamps::save(0);
    if (!arrive_last(base + 1 + chunk, cn)) return;
    merge_splits(dst, smem, c0, 1, cn, false, nthreads);
    stamps::mark(5);
    stamps::save(1);
    if (!arrive_last(base, nch)) return;
    stamps::mark(7);  // GAAC_STAMPS builds only: the final arrival won (its atomic's round trip is behind it)
    merge_splits(dst, smem, 0, MERGE_CHUNK, nch, true, nthreads);
  } else {
    stamps::save(0);
    if (!arrive_last(base, splits)) return;
    stamps::mark(7);
    merge_splits(dst, smem, 0, 1, splits, true, nthreads);
  }
  stamps::mark(6);
  stamps::save(2);
  stamps::print_stream();
}

}  // namespace attend
}  // namespace gaac
