// GAAC format v3 on the CPU: encoder, decoder and a tiled decode attention, built from the one core
// (kernels/cuda/gaac_v3/core.cuh, through host_block.h). Loaded by kernels/cpu/native.py with ctypes
// after a g++ build at first use; every function is extern "C" and takes raw pointers.
//
// The attention's arithmetic is defined by kernels/cpu/reference.py (tiled_attention_reference), which
// must give the same bits: float32 throughout, the same order of every sum, the same exp (exp_neg
// below, a Cody-Waite reduction and a degree-7 Taylor polynomial, our own), no FMA contraction
// (built with -ffp-contract=off). Design followed: FlashAttention-style online softmax over tiles
// (one tile = one block of T tokens, decoded into a small buffer), split over the context like
// flash-decoding, the splits merged at the end; the code is ours.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "host_block.h"
#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

using namespace gaac_v3;

namespace {

inline float bf16_f(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// float32 -> BF16, round to nearest even; NaN -> 0x7FC0 (what torch's .to(torch.bfloat16) gives).
inline uint16_t f_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// exp(x) for x <= 0 (0 below -87 and for NaN). Each operation rounds once (no FMA): the reference
// (kernels/cpu/reference.py exp_neg) performs the same operations with torch.
// exact float32 values (hex literals): reference.py uses the same numbers
constexpr float LOG2E = 0x1.715476p+0f, LN2_HI = 0x1.63p-1f, LN2_LO = -0x1.bd0106p-13f;
constexpr float C2 = 0.5f, C3 = 1.0f / 6.0f, C4 = 1.0f / 24.0f, C5 = 1.0f / 120.0f, C6 = 1.0f / 720.0f, C7 = 1.0f / 5040.0f;
inline float exp_neg(float x) {
  const bool keep = x >= -87.0f;
  const float xc = keep ? x : 0.0f;
  const float n = std::nearbyint(xc * LOG2E);
  float r = xc - n * LN2_HI;
  r = r - n * LN2_LO;
  float p = C7;
  p = p * r + C6;
  p = p * r + C5;
  p = p * r + C4;
  p = p * r + C3;
  p = p * r + C2;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
  float sc;
  std::memcpy(&sc, &bits, 4);
  return keep ? p * sc : 0.0f;
}

// torch.maximum: NaN if either is NaN
inline float maxnan(float a, float b) { return (a != a || b != b) ? NAN : (a > b ? a : b); }

constexpr int MIN_ITEMS_PER_THREAD = 4;

// Work items on nthreads threads; body(item, thread index < nthreads). Built with OpenMP, the items
// run on the OpenMP pool torch itself uses (the same libgomp.so.1 is loaded once per process), so no
// second set of threads competes with torch's spinning workers (measured: 3.3x slower calls right
// after a torch matmul with std::thread); without OpenMP, std::thread per call.
template <class F>
void parallel_for(int n, int nthreads, F&& body) {
  // small calls stay on the calling thread: waking the pool costs more than it saves (and on an
  // oversubscribed machine a parallel region waits for a descheduled worker)
  if (n < 2 * MIN_ITEMS_PER_THREAD) nthreads = 1;
#if defined(_OPENMP)
  if (nthreads > 1 && n > 1) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int i = 0; i < n; ++i) body(i, omp_get_thread_num());
    return;
  }
#endif
  if (nthreads <= 1 || n <= 1) {
    for (int i = 0; i < n; ++i) body(i, 0);
    return;
  }
  if (nthreads > n) nthreads = n;
  std::atomic<int> next{0};
  auto run = [&](int tid) {
    for (int i; (i = next.fetch_add(1)) < n;) body(i, tid);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < nthreads; ++t) pool.emplace_back(run, t);
  run(0);
  for (auto& th : pool) th.join();
}

// One kind (K or V) of one layer: PagedTensorV3's fields as pointers.
struct Paged {
  const uint8_t* pool;
  long long pool_bytes;
  const int64_t* table;  // [B, H, max_blocks]
  int max_blocks;
  const uint16_t* tail;  // [B, H, tail_cap, D]
  int tail_cap;
  const uint32_t* b8p;   // [H, D/2]
  const uint32_t* dbp;
};

// Tile i (block i, or the tail when i == num_blocks) of (b, h) as BF16 [n, D] into buf; returns a
// pointer to its rows (the raw block or the tail in place, or buf) or nullptr for a corrupt block.
const uint16_t* load_tile(const Geom& g, const Paged& p, int H, int b, int h, int i, int nb, uint32_t* buf) {
  const size_t bh = (size_t)b * H + h;
  if (i == nb) return p.tail + bh * p.tail_cap * g.D;
  const int64_t e = p.table[bh * p.max_blocks + i];
  const long long off = e & ~(long long)(ALIGN - 1);
  if ((e & (ALIGN - 1) & ~ENTRY_RAW_BIT) || off < 0) return nullptr;
  if (e & ENTRY_RAW_BIT) {
    if (off + 2LL * g.T * g.D > p.pool_bytes) return nullptr;
    return reinterpret_cast<const uint16_t*>(p.pool + off);
  }
  if (check_block(g, p.pool + off, p.pool_bytes - off)) return nullptr;
  decode_block(g, p.pool + off, p.b8p + (size_t)h * g.D / 2, p.dbp + (size_t)h * g.D / 2, buf, g.D / 2);
  return reinterpret_cast<const uint16_t*>(buf);
}

// The K tile (BF16 rows kt[t * D + d], n rows) as float columns kT[d * T + t], the layout the QK loop
// runs over t in. Data movement only (no rounding anywhere): 16 x 16 transposes in registers where
// AVX-512 is there, the scalar loop for the rest (and everywhere without it).
inline void transpose_k(const uint16_t* kt, int n, int D, int T, float* kT) {
  int t0 = 0;
#if defined(__AVX512F__)
  if (D % 16 == 0)
    for (; t0 + 16 <= n; t0 += 16)
      for (int d0 = 0; d0 < D; d0 += 16) {
        __m512 r[16], x[16];
        for (int i = 0; i < 16; ++i) {  // row t0 + i, channels d0 .. d0 + 15, as floats (bf16_f)
          const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kt + (size_t)(t0 + i) * D + d0));
          r[i] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        }
        for (int i = 0; i < 8; ++i) {
          x[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
          x[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        for (int i = 0; i < 4; ++i) {
          r[4 * i] = _mm512_shuffle_ps(x[4 * i], x[4 * i + 2], 0x44);
          r[4 * i + 1] = _mm512_shuffle_ps(x[4 * i], x[4 * i + 2], 0xEE);
          r[4 * i + 2] = _mm512_shuffle_ps(x[4 * i + 1], x[4 * i + 3], 0x44);
          r[4 * i + 3] = _mm512_shuffle_ps(x[4 * i + 1], x[4 * i + 3], 0xEE);
        }
        for (int g8 = 0; g8 < 16; g8 += 8)
          for (int i = g8; i < g8 + 4; ++i) {
            x[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
            x[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
          }
        for (int i = 0; i < 8; ++i) {
          r[i] = _mm512_shuffle_f32x4(x[i], x[i + 8], 0x88);
          r[i + 8] = _mm512_shuffle_f32x4(x[i], x[i + 8], 0xDD);
        }
        for (int j = 0; j < 16; ++j) _mm512_storeu_ps(kT + (size_t)(d0 + j) * T + t0, r[j]);  // column d0 + j
      }
#endif
  for (int t = t0; t < n; ++t)
    for (int d = 0; d < D; ++d) kT[(size_t)d * T + t] = bf16_f(kt[(size_t)t * D + d]);
}

// Positions (QK) or channels (PV) per register block: 4 vectors of 16 floats, so that consecutive
// adds of a block do not wait on each other.
constexpr int RB = 64;

// s[t] = sum over d = 0 .. D-1, in that order, of q[d] * kT[d * T + t] (float32, each product and
// sum rounded once: the reference's order). Blocks of RB positions keep their sums in registers.
inline void qk_scores(const float* q, const float* kT, int n, int D, int T, float* s) {
  int t0 = 0;
  for (; t0 + RB <= n; t0 += RB) {
    float acc[RB];
    for (int j = 0; j < RB; ++j) acc[j] = 0.0f;
    for (int d = 0; d < D; ++d) {
      const float qd = q[d];
      const float* kr = kT + (size_t)d * T + t0;
      for (int j = 0; j < RB; ++j) acc[j] = acc[j] + qd * kr[j];
    }
    for (int j = 0; j < RB; ++j) s[t0 + j] = acc[j];
  }
  for (int t = t0; t < n; ++t) s[t] = 0.0f;
  for (int d = 0; d < D && t0 < n; ++d) {
    const float qd = q[d];
    const float* kr = kT + (size_t)d * T;
    for (int t = t0; t < n; ++t) s[t] = s[t] + qd * kr[t];
  }
}

// acc[d] = sum over t = 0 .. n-1, in that order, of p[t] * vf[t * D + d] (the reference's order),
// in blocks of RB channels held in registers.
inline void pv_sums(const float* p, const float* vf, int n, int D, float* acc_out) {
  int d0 = 0;
  for (; d0 + RB <= D; d0 += RB) {
    float acc[RB];
    for (int j = 0; j < RB; ++j) acc[j] = 0.0f;
    for (int t = 0; t < n; ++t) {
      const float pt = p[t];
      const float* vr = vf + (size_t)t * D + d0;
      for (int j = 0; j < RB; ++j) acc[j] = acc[j] + pt * vr[j];
    }
    for (int j = 0; j < RB; ++j) acc_out[d0 + j] = acc[j];
  }
  for (int d = d0; d < D; ++d) acc_out[d] = 0.0f;
  for (int t = 0; t < n && d0 < D; ++t) {
    const float pt = p[t];
    const float* vr = vf + (size_t)t * D;
    for (int d = d0; d < D; ++d) acc_out[d] = acc_out[d] + pt * vr[d];
  }
}

}  // namespace

extern "C" {

int gaac_cpu_abi() { return 3; }

// Encode N blocks x (BF16 bits [N, T, D]) with per-block bases b8/b16 (uint8 [N, D]) into rows
// (uint8 [N, 2*T*D], zeros after each block) and nbytes (int32 [N]); the same bytes as
// gaac_hf.codec.v3.encode_blocks_v3.
void gaac_v3_encode(int T, int D, int N, const uint16_t* x, const uint8_t* b8, const uint8_t* b16, uint8_t* rows,
                    int32_t* nbytes, int nthreads) {
  const Geom g = make_geom(T, D);
  const int cap = 2 * T * D;
  std::vector<EncodeScratch> scratch(nthreads < 1 ? 1 : nthreads);
  parallel_for(N, nthreads, [&](int i, int tid) {
    const uint32_t* xb = reinterpret_cast<const uint32_t*>(x + (size_t)i * T * D);
    int n_ent, n_raw;
    uint8_t* row = rows + (size_t)i * cap;
    const int len = encode_block_rows(g, [&](int r) { return xb + (size_t)r * (D / 2); }, b8 + (size_t)i * D,
                                      b16 + (size_t)i * D, scratch[tid], row, cap, &n_ent, &n_raw);
    if (len < cap) std::memset(row + len, 0, cap - len);
    nbytes[i] = len;
  });
}

// The complete blocks of one append to a layer, K and V in one parallel region, read straight from
// the model's [B, H, S, D] tensors (strides in elements, channels contiguous): block j of (b, h) is
// rows j*T .. j*T+T-1 of src + b*sb + h*sh + row*sr. Block i = (b*H + h)*nfull + j of kind k (0 = K,
// 1 = V) goes to rows[k*N + i] (N = B*H*nfull, 2*T*D bytes each): its encoded bytes, or its BF16 rows
// when the encoding does not fit (stored as BF16, like gaac_hf.codec.v3.pack_blocks); nbytes[k*N + i]:
// its encoded length (> 2*T*D: stored as BF16, 2*T*D bytes). bases: uint8 [2 kinds][2: base8, base16][H][D].
// stats[4k ..]: stored bytes, wide groups, raw groups, BF16 blocks of kind k (the pool counters).
void gaac_v3_encode_kv(int T, int D, int B, int H, int nfull, const uint16_t* k, long long ksb, long long ksh,
                       long long ksr, const uint16_t* v, long long vsb, long long vsh, long long vsr, const uint8_t* bases,
                       uint8_t* rows, int32_t* nbytes, long long* stats, int nthreads) {
  const Geom g = make_geom(T, D);
  const int cap = 2 * T * D, N = B * H * nfull;
  std::vector<EncodeScratch> scratch(nthreads < 1 ? 1 : nthreads);
  std::vector<int32_t> groups(2 * (size_t)N * 2);  // per block: wide, raw
  parallel_for(2 * N, nthreads, [&](int it, int tid) {
    const int kind = it / N, i = it % N, j = i % nfull, h = (i / nfull) % H, b = i / (nfull * H);
    const uint16_t* src = kind ? v : k;
    const long long sb = kind ? vsb : ksb, sh = kind ? vsh : ksh, sr = kind ? vsr : ksr;
    const uint16_t* x0 = src + b * sb + h * sh + (long long)j * T * sr;
    const uint8_t* b8 = bases + ((size_t)(2 * kind) * H + h) * D;
    const uint8_t* b16 = bases + ((size_t)(2 * kind + 1) * H + h) * D;
    uint8_t* row = rows + (size_t)it * cap;
    auto row_words = [&](int r) { return reinterpret_cast<const uint32_t*>(x0 + r * sr); };
    int n_ent, n_raw;
    const int len = encode_block_rows(g, row_words, b8, b16, scratch[tid], row, cap, &n_ent, &n_raw);
    if (len > cap)  // does not fit: the block's BF16 bytes instead
      for (int r = 0; r < T; ++r) std::memcpy(row + (size_t)r * 2 * D, x0 + r * sr, 2 * (size_t)D);
    nbytes[it] = len;
    groups[2 * (size_t)it] = n_ent;
    groups[2 * (size_t)it + 1] = n_raw;
  });
  for (int kind = 0; kind < 2; ++kind) {
    long long* st = stats + 4 * kind;
    st[0] = st[1] = st[2] = st[3] = 0;
    for (int i = kind * N; i < (kind + 1) * N; ++i) {
      st[0] += nbytes[i] > cap ? cap : nbytes[i];
      st[1] += groups[2 * (size_t)i];
      st[2] += groups[2 * (size_t)i + 1];
      st[3] += nbytes[i] > cap;
    }
  }
}

// Place N encoded blocks in a pool: block i at offs[i], its nbytes[i] bytes from rows when they fit
// (nbytes <= 2*T*D), else its BF16 bytes from x.
void gaac_v3_pack(int T, int D, int N, const uint8_t* rows, const int32_t* nbytes, const uint16_t* x,
                  const int64_t* offs, uint8_t* pool) {
  const int cap = 2 * T * D;
  for (int i = 0; i < N; ++i) {
    if (nbytes[i] <= cap) std::memcpy(pool + offs[i], rows + (size_t)i * cap, nbytes[i]);
    else std::memcpy(pool + offs[i], x + (size_t)i * T * D, cap);
  }
}

// Place the blocks of gaac_v3_encode_kv in the K and V pools: kind k's N blocks back to back in
// block order from byte used[k] of pool[k] (the caller made room for stats[4k]), and their entries
// (offset | 1 for a BF16 block) at column nb0 + j of row (b, h) of table[k] (int64 [B, H, max_blocks[k]]).
void gaac_v3_pack_kv(int T, int D, int B, int H, int nfull, const uint8_t* rows, const int32_t* nbytes,
                     uint8_t* pool_k, long long used_k, int64_t* table_k, int max_blocks_k, uint8_t* pool_v,
                     long long used_v, int64_t* table_v, int max_blocks_v, int nb0) {
  const int cap = 2 * T * D, N = B * H * nfull;
  for (int kind = 0; kind < 2; ++kind) {
    uint8_t* pool = kind ? pool_v : pool_k;
    int64_t* table = kind ? table_v : table_k;
    const int mb = kind ? max_blocks_v : max_blocks_k;
    long long off = kind ? used_v : used_k;
    for (int i = 0; i < N; ++i) {
      const int it = kind * N + i, len = nbytes[it] > cap ? cap : nbytes[it];
      std::memcpy(pool + off, rows + (size_t)it * cap, len);
      table[(size_t)(i / nfull) * mb + nb0 + i % nfull] = off | (nbytes[it] > cap ? ENTRY_RAW_BIT : 0);
      off += len;
    }
  }
}

// Decode N blocks through table entries (int64 [N], offset | 1 for BF16 blocks) of heads (int64 [N])
// with pair constants b8p/dbp (uint32 [H, D/2]) into out (BF16 bits [N, T, D]). Returns 0, or 1 + the
// index of the first corrupt entry or block (the structural checks of check_block).
long long gaac_v3_decode(int T, int D, int N, const uint8_t* pool, long long pool_bytes, const int64_t* entries,
                         const int64_t* heads, const uint32_t* b8p, const uint32_t* dbp, uint16_t* out, int nthreads) {
  const Geom g = make_geom(T, D);
  std::atomic<long long> bad{0};
  parallel_for(N, nthreads, [&](int i, int) {
    const int64_t e = entries[i];
    const long long off = e & ~(long long)(ALIGN - 1);
    uint16_t* o = out + (size_t)i * T * D;
    bool ok = !((e & (ALIGN - 1) & ~ENTRY_RAW_BIT) || off < 0);
    if (ok && (e & ENTRY_RAW_BIT)) {
      ok = off + 2LL * T * D <= pool_bytes;
      if (ok) std::memcpy(o, pool + off, 2 * (size_t)T * D);
    } else if (ok) {
      ok = check_block(g, pool + off, pool_bytes - off) == 0;
      if (ok) decode_block(g, pool + off, b8p + heads[i] * D / 2, dbp + heads[i] * D / 2, reinterpret_cast<uint32_t*>(o), D / 2);
    }
    if (!ok) {
      long long want = i + 1, cur = bad.load();
      while ((cur == 0 || cur > want) && !bad.compare_exchange_weak(cur, want)) {}
    }
  });
  return bad.load();
}

// Decode attention over one paged v3 layer (kernels/paged.py PagedKV with PagedTensorV3 K and V).
//   q     BF16 [B, H*n_rep, Sq, D]; query head hq reads kv-head hq / n_rep
//   out   BF16 [B, Sq, H*n_rep, D], or out_f32 (float [B, Sq, H*n_rep, D], the values before rounding) if given
//   num_blocks, tail_len int32 [B]; sequence b holds num_blocks[b]*T + tail_len[b] tokens
//   mask  uint8 [B, Sq, mask_len] (1 = attend) or null: then query i sees positions >= kv_start[b]
//         (if kv_start) and <= len_b - Sq + i (bottom-right causal)
// Work items: (b, kv-head, split of split_tiles tiles). Returns 0, or 1 + the first corrupt tile index.
long long gaac_v3_attention(int T, int D, int B, int H, int n_rep, int Sq, const uint16_t* q,
                            const uint8_t* pool_k, long long pool_k_bytes, const int64_t* table_k, int max_blocks_k,
                            const uint16_t* tail_k, const uint32_t* b8p_k, const uint32_t* dbp_k,
                            const uint8_t* pool_v, long long pool_v_bytes, const int64_t* table_v, int max_blocks_v,
                            const uint16_t* tail_v, const uint32_t* b8p_v, const uint32_t* dbp_v, int tail_cap,
                            const int32_t* num_blocks, const int32_t* tail_len, const uint8_t* mask, int mask_len,
                            const int32_t* kv_start, float scale, int split_tiles, int nthreads, uint16_t* out,
                            float* out_f32) {
  const Geom g = make_geom(T, D);
  const Paged pk{pool_k, pool_k_bytes, table_k, max_blocks_k, tail_k, tail_cap, b8p_k, dbp_k};
  const Paged pv{pool_v, pool_v_bytes, table_v, max_blocks_v, tail_v, tail_cap, b8p_v, dbp_v};
  const int Hq = H * n_rep, U = Sq * n_rep;  // U: query vectors per (b, kv-head)
  int nsplit = 1;
  for (int b = 0; b < B; ++b) {
    const int tiles = num_blocks[b] + (tail_len[b] > 0);
    const int s = (tiles + split_tiles - 1) / split_tiles;
    if (s > nsplit) nsplit = s;
  }
  // scaled queries, float [B, Hq, Sq, D]
  std::vector<float> qs((size_t)B * Hq * Sq * D);
  for (size_t i = 0; i < qs.size(); ++i) qs[i] = bf16_f(q[i]) * scale;
  // partial results per item and query vector: m, l, acc[D]
  const int W = D + 2;
  std::vector<float> part((size_t)B * H * nsplit * U * W);
  const int items = B * H * nsplit;
  const int nt_threads = nthreads < 1 ? 1 : nthreads;
  std::vector<std::vector<float>> scratch(nt_threads);
  std::atomic<long long> bad{0};
  parallel_for(items, nt_threads, [&](int it, int tid) {
    const int sp = it % nsplit, h = (it / nsplit) % H, b = it / (nsplit * H);
    float* P = &part[(size_t)it * U * W];
    for (int u = 0; u < U; ++u) {
      P[u * W] = -INFINITY;
      P[u * W + 1] = 0.0f;
      for (int d = 0; d < D; ++d) P[u * W + 2 + d] = 0.0f;
    }
    const int nb = num_blocks[b], tl = tail_len[b], len = nb * T + tl;
    const int tiles = nb + (tl > 0);
    const int i0 = sp * split_tiles, i1 = (i0 + split_tiles < tiles) ? i0 + split_tiles : tiles;
    if (i0 >= i1) return;
    std::vector<float>& sc = scratch[tid];
    sc.resize((size_t)2 * T * D + 3 * T + D + (size_t)T * D);
    float* kT = sc.data();                   // [D][T]
    float* vf = kT + (size_t)T * D;          // [T][D]
    float* s = vf + (size_t)T * D;           // [T]
    float* pr = s + T;                       // [T]
    float* vis = pr + T;                     // [T] 1 / 0
    float* pvacc = vis + T;                  // [D]
    uint32_t* dec = reinterpret_cast<uint32_t*>(pvacc + D);  // [T * D / 2] decode buffer
    uint32_t* dec2 = dec + (size_t)T * D / 2;
    for (int i = i0; i < i1; ++i) {
      const int n = i < nb ? T : tl, pos0 = i * T;
      const uint16_t* kt = load_tile(g, pk, H, b, h, i, nb, dec);
      const uint16_t* vt = load_tile(g, pv, H, b, h, i, nb, dec2);
      if (!kt || !vt) {
        long long want = i + 1, cur = bad.load();
        while ((cur == 0 || cur > want) && !bad.compare_exchange_weak(cur, want)) {}
        return;
      }
      transpose_k(kt, n, D, T, kT);
      for (int t = 0; t < n; ++t)
        for (int d = 0; d < D; ++d) vf[(size_t)t * D + d] = bf16_f(vt[(size_t)t * D + d]);
      for (int u = 0; u < U; ++u) {
        const int iq = u / n_rep, hq = h * n_rep + u % n_rep;
        const float* qv = &qs[(((size_t)b * Hq + hq) * Sq + iq) * D];
        qk_scores(qv, kT, n, D, T, s);
        if (mask) {
          const uint8_t* mr = mask + ((size_t)b * Sq + iq) * mask_len;
          for (int t = 0; t < n; ++t) vis[t] = (pos0 + t < mask_len && mr[pos0 + t]) ? 1.0f : 0.0f;
        } else {
          const int lo = kv_start ? kv_start[b] : 0, hi = len - Sq + iq;
          for (int t = 0; t < n; ++t) vis[t] = (pos0 + t >= lo && pos0 + t <= hi) ? 1.0f : 0.0f;
        }
        float mt = -INFINITY;
        for (int t = 0; t < n; ++t)
          if (vis[t] != 0.0f) mt = maxnan(mt, s[t]);
        float* st = P + u * W;
        const float m_run = st[0], m_new = maxnan(m_run, mt);
        const float alpha = m_run == -INFINITY ? 0.0f : exp_neg(m_run - m_new);
        for (int t = 0; t < n; ++t) pr[t] = vis[t] != 0.0f ? exp_neg(s[t] - m_new) : 0.0f;
        float ls = 0.0f;
        for (int t = 0; t < n; ++t) ls = ls + pr[t];
        pv_sums(pr, vf, n, D, pvacc);
        st[0] = m_new;
        st[1] = st[1] * alpha + ls;
        for (int d = 0; d < D; ++d) st[2 + d] = st[2 + d] * alpha + pvacc[d];
      }
    }
  });
  if (bad.load()) return bad.load();
  // merge the splits of each (b, kv-head) in order: M = max m_j, w_j = exp(m_j - M) (0 for an empty split)
  for (int b = 0; b < B; ++b) {
    const int tiles = num_blocks[b] + (tail_len[b] > 0);
    const int ns = tiles ? (tiles + split_tiles - 1) / split_tiles : 1;
    for (int h = 0; h < H; ++h)
      for (int u = 0; u < U; ++u) {
        const int iq = u / n_rep, hq = h * n_rep + u % n_rep;
        float M = -INFINITY;
        for (int j = 0; j < ns; ++j) M = maxnan(M, part[(((size_t)(b * H + h) * nsplit + j) * U + u) * W]);
        float L = 0.0f, A[256];
        for (int d = 0; d < D; ++d) A[d] = 0.0f;
        for (int j = 0; j < ns; ++j) {
          const float* st = &part[(((size_t)(b * H + h) * nsplit + j) * U + u) * W];
          const float w = st[0] == -INFINITY ? 0.0f : exp_neg(st[0] - M);
          L = L + st[1] * w;
          for (int d = 0; d < D; ++d) A[d] = A[d] + st[2 + d] * w;
        }
        const size_t at = (((size_t)b * Sq + iq) * Hq + hq) * D;
        for (int d = 0; d < D; ++d) {
          const float r = L == 0.0f ? 0.0f : A[d] / L;
          if (out_f32) out_f32[at + d] = r;  // the float32 result before rounding (tests: a finer check)
          else out[at + d] = f_bf16(r);
        }
      }
  }
  return 0;
}

}  // extern "C"
