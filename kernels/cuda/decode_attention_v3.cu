// Fused GAAC v3 split-KV GQA decode attention (q_len = 1), warp-specialised: producer warps load
// compressed v3 tiles into registers and decode them into a shared-memory ring of BF16 rows;
// consumer warps run exactly the BF16 kernel's attention arithmetic on those rows
// (gaac/attend.cuh), so the output is bit-identical to decode_attention.cu's for the same WARPS and
// split boundaries whenever the decoded values are the stored ones.
//
// Design followed (our own; the BF16 kernel's structure, itself after flash-decoding and
// FlashInfer's decode, and the producer/consumer split of FA3 / FlashMLA on Hopper, with mbarriers
// between the roles). Grid (num_splits, Hkv, B); WARPS consumer warps, consumer c owns rows
// 16c .. 16c + 15 of every TILE = 16 * WARPS rows (as the BF16 kernel's warp c does); PPC producer
// warps per consumer (1, or 2 at d = 256), each owning at most 2 segments (1,024 values each) of that
// consumer's 16 rows. A producer, per tile:
//   loads (registers, one tile ahead): its segments' sign/mantissa bytes and code words, and the
//     32-bit words of their entry list (sized from the segment-table words, loaded two tiles ahead;
//     the block-table entry three tiles ahead), so no load waits on the previous one in the loop;
//   decodes (core.cuh): main path one chunk per lane per segment (no branch), then the entry list,
//     one lane per wide group (raw words from global memory when a ballot sees one);
//   writes the BF16 rows into decoded slot it % DEC_STAGES and arrives on its `full` barrier.
// BF16-stored blocks (entry | 1) and the BF16 tail are copied row by row from global memory.
//
// Compile-time parameters (-D): HEAD_DIM (64, 128 or 256), PAGE (block size T: a power of two
// >= 16), QUERY_GROUP (query heads per kv head), WARPS (consumer warps), DEC_STAGES (decoded ring
// depth, >= 2), MIN_CTAS_PER_SM (default 1). STAGES is accepted and unused (the launcher's knob name).

// core.cuh first: it has a constant named GROUP (8 channels), so the query-group size arrives as
// QUERY_GROUP and becomes attend.cuh's GROUP only after it.
#include "gaac_v3/core.cuh"  // the one copy of the v3 bit logic (g++-tested against the reference)
#ifdef GROUP
#error "pass the query heads per kv head as QUERY_GROUP (GROUP collides with core.cuh)"
#endif
#define GROUP QUERY_GROUP
#include "gaac/ptx.cuh"
#include "gaac/attend.cuh"

#ifndef MIN_CTAS_PER_SM
#define MIN_CTAS_PER_SM 1
#endif
#ifndef DEC_STAGES
#define DEC_STAGES 2
#endif

namespace {
using namespace gaac;
using attend::D;
using attend::G;
using attend::ROW;
using attend::W;
typedef unsigned char u8;

constexpr int T = PAGE;
constexpr int DS = DEC_STAGES;
constexpr int TILE = 16 * W;                  // rows per tile (16 per consumer warp)
constexpr int N = T * D;                      // values per block
constexpr int COLS = D / 8;                   // chunk columns
constexpr int NSEG = D / 64;                  // segments in a consumer's 16 rows
constexpr int PSEG = NSEG < 2 ? NSEG : 2;     // segments per producer
constexpr int PPC = NSEG / PSEG;              // producers per consumer
constexpr int PROWS = 16 / PPC;               // rows per producer
constexpr int NPROD = W * PPC;
constexpr int ALL_THREADS = 32 * (W + NPROD);
constexpr int SEGS = N / 1024;                // segments per block
constexpr int CODE_OFF = N;
constexpr int SEGTAB_OFF = N + 12 * (N / 32);
constexpr int ENTRY_OFF = SEGTAB_OFF + 4 * (SEGS + 1);
constexpr int DEC = 16 * ROW;                 // b16 elements of one decoded 16-row buffer

static_assert(D == 64 || D == 128 || D == 256, "the fused kernel takes HEAD_DIM 64, 128 or 256");
static_assert(T >= 16 && (T & (T - 1)) == 0, "PAGE must be a power of two >= 16 (format v3)");
static_assert(DS >= 2, "DEC_STAGES must be >= 2");
static_assert(32 % COLS == 0, "a lane's chunk column must be the same in every segment");

constexpr i64 TAIL = -1;  // "block" of the rows past the complete blocks: the BF16 tail

__device__ __forceinline__ u32 ldg32(const void* p) { return __ldg(reinterpret_cast<const u32*>(p)); }
__device__ __forceinline__ uint4 ldg128(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ uint4 lds128(const void* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ void sts128(void* p, u32 a, u32 b, u32 c, u32 d) {
  *reinterpret_cast<uint4*>(p) = make_uint4(a, b, c, d);
}
__device__ __forceinline__ bool compressed(i64 e) { return e >= 0 && !(e & 1); }

__device__ __forceinline__ i64 lookup(const i64* table, int nb, int tok0) {
  const int blk = tok0 / T;
  return blk < nb ? __ldg(table + blk) : TAIL;
}

// One kind's compressed data of a producer's segments, in registers: lane = chunk `lane` of each
// segment; ent = 32-bit word `lane` of the segments' entry list window starting at byte a0.
struct Regs {
  uint4 sm[PSEG][2];
  u32 cw[PSEG][3];
  u32 ent;
};

// Segment-table words of a producer's segments: lane l <= PSEG holds word s0 + l.
__device__ __forceinline__ u32 load_seg(const u8* pool, i64 e, int s0, int lane) {
  return compressed(e) && lane <= PSEG ? ldg32(pool + e + SEGTAB_OFF + 4 * (s0 + lane)) : 0u;
}

// The entry-list window of the segments: 32-bit words [a0, a0 + 4 * nw) of the block.
struct Window {
  int e0, n, a0;
  bool over;  // more than 32 words: read entries from global memory at decode time
};
__device__ __forceinline__ Window window(u32 seg) {
  const u32 w0 = __shfl_sync(0xFFFFFFFFu, seg, 0), wn = __shfl_sync(0xFFFFFFFFu, seg, PSEG);
  const int e0 = static_cast<int>(w0 & 0xFFFFu), e1 = static_cast<int>(wn & 0xFFFFu);
  const int a0 = (ENTRY_OFF + 2 * e0) & ~3;
  const int nw = (ENTRY_OFF + 2 * e1 - a0 + 3) >> 2;
  return {e0, e1 - e0, a0, nw > 32};
}

__device__ __forceinline__ void load_regs(Regs& r, const u8* pool, i64 e, int s0, u32 seg, int lane) {
  const Window w = window(seg);  // every lane runs the shuffles
  if (!compressed(e)) return;
  const u8* blk = pool + e;
#pragma unroll
  for (int k = 0; k < PSEG; ++k) {
    const u8* sm = blk + 1024 * (s0 + k) + 32 * lane;
    r.sm[k][0] = ldg128(sm);
    r.sm[k][1] = ldg128(sm + 16);
    const u8* cw = blk + CODE_OFF + 384 * (s0 + k) + 4 * lane;
    r.cw[k][0] = ldg32(cw);
    r.cw[k][1] = ldg32(cw + 128);
    r.cw[k][2] = ldg32(cw + 256);
  }
  r.ent = (!w.over && 4 * lane < 4 * 32 && w.a0 + 4 * lane < ENTRY_OFF + 2 * (w.e0 + w.n) + 3 && w.n > 0)
              ? ldg32(blk + w.a0 + 4 * lane) : 0u;
}

// Decode a producer's segments of one kind into the consumer's 16-row buffer `dec`.
//   q: the producer's index within its consumer (its segments are 2q, 2q + 1 of the 16 rows)
__device__ __forceinline__ void decode_regs(u16* dec, const Regs& r, const u8* blk, u32 seg, int q,
                                            const u32 (&b8p)[4], const u32* dbp_s, int lane) {
  using namespace gaac_v3;
  const int col = lane % COLS;
#pragma unroll
  for (int k = 0; k < PSEG; ++k) {
    const int cl = 32 * (PSEG * q + k) + lane;  // chunk within the consumer's 16 rows
    const u32 sm[8] = {r.sm[k][0].x, r.sm[k][0].y, r.sm[k][0].z, r.sm[k][0].w,
                       r.sm[k][1].x, r.sm[k][1].y, r.sm[k][1].z, r.sm[k][1].w};
    u32 v[16];
    decode_chunk(sm, r.cw[k], b8p, v);
    u16* dst = dec + 4 * (cl / COLS) * ROW + 8 * col;
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) sts128(dst + rr * ROW, v[4 * rr], v[4 * rr + 1], v[4 * rr + 2], v[4 * rr + 3]);
  }
  const Window w = window(seg);
  if (w.n <= 0) return;  // warp-uniform
  int bnd[PSEG > 1 ? PSEG - 1 : 1];
#pragma unroll
  for (int k = 1; k < PSEG; ++k) bnd[k - 1] = static_cast<int>(__shfl_sync(0xFFFFFFFFu, seg, k) & 0xFFFFu);
  int rbase = static_cast<int>(__shfl_sync(0xFFFFFFFFu, seg, 0) >> 16);
  __syncwarp();  // fix-up lanes read rows other lanes stored
  for (int j = 0; j < w.n; j += 32) {  // warp-uniform trip count
    const int idx = w.e0 + j + lane;
    const bool act = j + lane < w.n;
    const int b = ENTRY_OFF + 2 * idx - w.a0;  // byte of this entry in the window
    u32 entry;
    if (!w.over && j == 0) {
      const u32 word = __shfl_sync(0xFFFFFFFFu, r.ent, (b >> 2) & 31);
      entry = act ? (word >> (8 * (b & 2))) & 0xFFFFu : 0u;
    } else {
      entry = act ? static_cast<u32>(__ldg(reinterpret_cast<const u16*>(blk + ENTRY_OFF + 2 * idx))) : 0u;
    }
    const bool raw = act && entry_raw(entry);
    const unsigned bal = __ballot_sync(0xFFFFFFFFu, raw);
    u32 rw = 0u;
    if (bal) {  // rare: raw words sit after the whole block's entry list
      const u32 tot = ldg32(blk + SEGTAB_OFF + 4 * SEGS) & 0xFFFFu;
      const u8* raws = blk + ((ENTRY_OFF + 2 * static_cast<int>(tot) + 3) & ~3);
      if (raw) rw = ldg32(raws + 4 * (rbase + __popc(bal & ((1u << lane) - 1u))));
    }
    if (act) {
      int s = 0;
#pragma unroll
      for (int k = 0; k < PSEG - 1; ++k) s += idx >= bnd[k];
      const int pos = entry_pos(entry), rr = pos % CHUNK_ROWS, cl = 32 * (PSEG * q + s) + pos / CHUNK_ROWS;
      const int c = cl % COLS;
      const uint4 db = lds128(dbp_s + 4 * c);
      const u32 d4[4] = {db.x, db.y, db.z, db.w};
      u16* dst = dec + (4 * (cl / COLS) + rr) * ROW + 8 * c;
      const uint4 o = lds128(dst);
      u32 ow[4] = {o.x, o.y, o.z, o.w};
      fix_group(ow, d4, entry, rw);
      sts128(dst, ow[0], ow[1], ow[2], ow[3]);
    }
    rbase += __popc(bal);
  }
}

// A producer's rows [q * PROWS, (q + 1) * PROWS) of 16 BF16 rows from global memory (a BF16-stored
// block or the tail; src = row 0 of the 16); rows outside [lo, hi) become zeros.
__device__ __forceinline__ void direct_rows(u16* dec, const u16* src, int q, int tok0, int lo, int hi, int lane) {
#pragma unroll
  for (int c = lane; c < PROWS * COLS; c += 32) {
    const int rr = q * PROWS + c / COLS, col = c % COLS;
    const bool ok = tok0 + rr >= lo && tok0 + rr < hi;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (ok) v = ldg128(src + rr * D + 8 * col);
    *reinterpret_cast<uint4*>(dec + rr * ROW + 8 * col) = v;
  }
}

// A producer's decoded rows outside [lo, hi) -> zeros (a masked V row must be finite: P is 0 there).
__device__ __forceinline__ void mask_rows(u16* dec, int q, int tok0, int lo, int hi, int lane) {
  if (tok0 >= lo && tok0 + 16 <= hi) return;  // warp-uniform
  __syncwarp();
#pragma unroll
  for (int c = lane; c < PROWS * COLS; c += 32) {
    const int rr = q * PROWS + c / COLS;
    if (tok0 + rr < lo || tok0 + rr >= hi) *reinterpret_cast<uint4*>(dec + rr * ROW + 8 * (c % COLS)) = make_uint4(0u, 0u, 0u, 0u);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(ALL_THREADS, MIN_CTAS_PER_SM)
gaac_v3_decode_split(const u16* __restrict__ q,          // [B, Hkv*G, D]
                     const u8* __restrict__ k_pool,      // v3 blocks (+ guard bytes)
                     const u8* __restrict__ v_pool,
                     const i64* __restrict__ k_table,    // [B, Hkv, max_blocks] entries: offset | 1 if BF16
                     const i64* __restrict__ v_table,
                     const u16* __restrict__ k_tail,     // [B, Hkv, T, D]
                     const u16* __restrict__ v_tail,
                     const u32* __restrict__ k_b8p,      // [Hkv, D/2] pre-shifted base8 pairs
                     const u32* __restrict__ k_dbp,      // [Hkv, D/2] pre-shifted (base16 - base8) pairs
                     const u32* __restrict__ v_b8p,
                     const u32* __restrict__ v_dbp,
                     const int* __restrict__ num_blocks,  // [B]
                     const int* __restrict__ tail_len,    // [B]
                     const int* __restrict__ kv_start,    // [B] or null
                     float* __restrict__ part_o,          // [B, Hkv*G, splits, D]
                     float* __restrict__ part_lse,        // [B, Hkv*G, splits]
                     u16* __restrict__ out,               // [B, Hkv*G, D]
                     int* __restrict__ counters,          // [B*Hkv], zero between calls
                     int hkv, int max_blocks, int tokens_per_split, float scale_log2) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ __align__(8) unsigned long long full[DS * W], empty[DS * W];
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int splits = gridDim.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int hq0 = h * G, hq_total = hkv * G;

  // shared memory: decoded ring [DS][W][2 kinds][DEC] | dbp [2][D/2]
  u16* ring = reinterpret_cast<u16*>(smem);
  u32* dbp_s = reinterpret_cast<u32*>(smem + DS * W * 2 * DEC * 2);
  for (int i = tid; i < D / 2; i += ALL_THREADS) {
    dbp_s[i] = __ldg(k_dbp + h * (D / 2) + i);
    dbp_s[D / 2 + i] = __ldg(v_dbp + h * (D / 2) + i);
  }
  if (tid == 0) {
    for (int i = 0; i < DS * W; ++i) {
      mbar_init(full + i, 32 * PPC);  // every lane of the consumer's producers arrives
      mbar_init(empty + i, 32);       // every lane of the consumer arrives
    }
  }
  __syncthreads();

  const int nb = num_blocks[b];
  const int len = nb * T + tail_len[b];
  const int lo = kv_start != nullptr ? max(kv_start[b], 0) : 0;
  const int s0 = split * tokens_per_split;
  const int hi = min(s0 + tokens_per_split, len);
  const int first = max(s0, lo / TILE * TILE);
  const int n_tiles = hi > first ? (hi - first + TILE - 1) / TILE : 0;
  const i64 bh = static_cast<i64>(b) * hkv + h;

  attend::WarpState st;
  if (warp < W) {
    // ---------------- consumer: the BF16 kernel's arithmetic on the decoded rows ----------------
    st.init();
    st.load_q(q + (static_cast<i64>(b) * hq_total + hq0) * D, lane);
    for (int it = 0; it < n_tiles; ++it) {
      const int slot = it % DS;
      mbar_wait(full + slot * W + warp, (it / DS) & 1);
      const u16* dk = ring + (slot * W + warp) * 2 * DEC;
      st.rows(dk, dk + DEC, first + it * TILE + 16 * warp, lo, hi, lane, scale_log2);
      mbar_arrive(empty + slot * W + warp);
    }
  } else {
    // ---------------- producer: load one tile ahead, decode into the ring ----------------
    const int pi = warp - W, c = pi / PPC, qq = pi % PPC;
    const i64* kt = k_table + bh * max_blocks;
    const i64* vt = v_table + bh * max_blocks;
    const u16* ktail = k_tail + bh * T * D;
    const u16* vtail = v_tail + bh * T * D;
    const int crow = 16 * c;  // the consumer's rows in every tile
    u32 kb8[4], vb8[4];
    {
      const uint4 kb = ldg128(reinterpret_cast<const uint4*>(k_b8p + h * (D / 2)) + lane % COLS);
      const uint4 vb = ldg128(reinterpret_cast<const uint4*>(v_b8p + h * (D / 2)) + lane % COLS);
      kb8[0] = kb.x, kb8[1] = kb.y, kb8[2] = kb.z, kb8[3] = kb.w;
      vb8[0] = vb.x, vb8[1] = vb.y, vb8[2] = vb.z, vb8[3] = vb.w;
    }
    // first segment of this producer in the tile starting at token tok0 (rows tok0 % T ..)
    auto seg0 = [&](int tok0) { return (tok0 % T) * D / 1024 + PSEG * qq; };
    auto tok_of = [&](int it) { return first + it * TILE + crow; };
    // pipeline: entries 3 tiles ahead, segment words 2 ahead, data 1 ahead
    i64 ek1 = TAIL, ev1 = TAIL, ek2 = TAIL, ev2 = TAIL, ek3, ev3;
    u32 sk1 = 0u, sv1 = 0u, sk2 = 0u, sv2 = 0u;
    Regs rk0, rv0, rk1, rv1;
    i64 ek0 = TAIL, ev0 = TAIL;
    u32 sk0 = 0u, sv0 = 0u;
    if (0 < n_tiles) ek0 = lookup(kt, nb, tok_of(0)), ev0 = lookup(vt, nb, tok_of(0));
    if (1 < n_tiles) ek1 = lookup(kt, nb, tok_of(1)), ev1 = lookup(vt, nb, tok_of(1));
    if (2 < n_tiles) ek2 = lookup(kt, nb, tok_of(2)), ev2 = lookup(vt, nb, tok_of(2));
    sk0 = load_seg(k_pool, ek0, seg0(tok_of(0)), lane), sv0 = load_seg(v_pool, ev0, seg0(tok_of(0)), lane);
    sk1 = load_seg(k_pool, ek1, seg0(tok_of(1)), lane), sv1 = load_seg(v_pool, ev1, seg0(tok_of(1)), lane);
    load_regs(rk0, k_pool, ek0, seg0(tok_of(0)), sk0, lane);
    load_regs(rv0, v_pool, ev0, seg0(tok_of(0)), sv0, lane);
    for (int it = 0; it < n_tiles; ++it) {
      // issue the loads of the tiles ahead (their results are first used an iteration later)
      ek3 = 3 + it < n_tiles ? lookup(kt, nb, tok_of(it + 3)) : TAIL;
      ev3 = 3 + it < n_tiles ? lookup(vt, nb, tok_of(it + 3)) : TAIL;
      sk2 = load_seg(k_pool, ek2, seg0(tok_of(it + 2)), lane);
      sv2 = load_seg(v_pool, ev2, seg0(tok_of(it + 2)), lane);
      load_regs(rk1, k_pool, ek1, seg0(tok_of(it + 1)), sk1, lane);
      load_regs(rv1, v_pool, ev1, seg0(tok_of(it + 1)), sv1, lane);
      // decode tile `it` into its slot once the consumer is done with that slot's previous tile
      const int slot = it % DS;
      if (it >= DS) mbar_wait(empty + slot * W + c, ((it / DS) + 1) & 1);
      u16* dk = ring + (slot * W + c) * 2 * DEC;
      u16* dv = dk + DEC;
      const int tok0 = tok_of(it), r0 = tok0 % T;
      if (compressed(ek0)) {
        decode_regs(dk, rk0, k_pool + ek0, sk0, qq, kb8, dbp_s, lane);
      } else {
        direct_rows(dk, ek0 == TAIL ? ktail + r0 * D : reinterpret_cast<const u16*>(k_pool + (ek0 & ~1LL)) + r0 * D,
                    qq, tok0, lo, hi, lane);
      }
      if (compressed(ev0)) {
        decode_regs(dv, rv0, v_pool + ev0, sv0, qq, vb8, dbp_s + D / 2, lane);
        mask_rows(dv, qq, tok0, lo, hi, lane);
      } else {
        direct_rows(dv, ev0 == TAIL ? vtail + r0 * D : reinterpret_cast<const u16*>(v_pool + (ev0 & ~1LL)) + r0 * D,
                    qq, tok0, lo, hi, lane);
      }
      mbar_arrive(full + slot * W + c);
      // shift the pipeline
      rk0 = rk1, rv0 = rv1;
      ek0 = ek1, ev0 = ev1, sk0 = sk1, sv0 = sv1;
      ek1 = ek2, ev1 = ev2, sk1 = sk2, sv1 = sv2;
      ek2 = ek3, ev2 = ev3;
    }
  }
  __syncthreads();
  attend::finish(st, smem, attend::Output{part_o, part_lse, out, counters, static_cast<i64>(b) * hq_total + hq0, bh,
                                          split, splits},
                 ALL_THREADS);
}
