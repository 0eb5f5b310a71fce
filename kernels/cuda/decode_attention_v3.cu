// Fused GAAC v3 split-KV GQA decode attention (q_len = 1), warp-specialised: producer warps stage
// compressed v3 tiles in shared memory (cp.async) and decode them into a shared-memory ring of BF16
// rows; consumer warps run exactly the BF16 kernel's attention arithmetic on those rows
// (gaac/attend.cuh), so the output is bit-identical to decode_attention.cu's for the same WARPS and
// split boundaries whenever the decoded values are the stored ones.
//
// Design followed (our own; the BF16 kernel's structure, itself after flash-decoding and
// FlashInfer's decode, and the producer/consumer split of FA3 / FlashMLA on Hopper, with mbarriers
// between the roles). Grid (num_splits, Hkv, B); WARPS consumer warps, consumer c owns rows
// 16c .. 16c + 15 of every TILE = 16 * WARPS rows (as the BF16 kernel's warp c does); PPC producer
// warps per consumer: the consumer's d / 64 segments (1,024 values each) in groups of PROD_SEGS, and
// per group one producer for both kinds (KIND_SPLIT 0) or one for K and one for V (KIND_SPLIT 1, the
// default: half the look-ups and copy issue per producer; lab/cuda-decode-notebook.md call G10).
// A producer, per tile:
//   copies (cp.async, STAGES - 1 tiles ahead: a decode kernel needs ~80 KB in flight per SM at the
//     H200's loaded latency, more than registers can hold): its segments' sign/mantissa bytes and
//     code words, the chunks of their segment-table words and of their entry list (sized from the
//     segment-table words loaded one stage earlier, the block-table entry one stage before that);
//   decodes from shared memory (core.cuh): main path one chunk per lane per segment, then the entry list,
//     one lane per wide group (raw words from global memory when a ballot sees one);
//   writes the BF16 rows into decoded slot it % DEC_STAGES and arrives on its `full` barrier.
// BF16-stored blocks (entry | 1) and the BF16 tail are copied row by row from global memory.
//
// Compile-time parameters (-D): HEAD_DIM (64, 128 or 256), PAGE (block size T: a power of two
// >= 16), QUERY_GROUP (query heads per kv head), WARPS (consumer warps), STAGES (compressed ring
// depth, >= 2), DEC_STAGES (decoded ring depth, >= 2), DEC_K_STAGES (slots of the decoded K ring:
// DEC_STAGES, or 1: a consumer frees its K buffer as soon as S is computed, `kfree` barrier, so the
// K producer refills it while the consumer works on V; 8.7 KB less per CTA at d=128, room for one
// more CTA per SM), PROD_SEGS (segments per producer, 1 or 2),
// KIND_SPLIT (0 or 1, above), ENTRY_CHUNKS (16-byte chunks of entry list staged per producer, kind
// and stage; longer lists are read from global memory), MIN_CTAS_PER_SM; lab instruments PROF, PROBE.
// Tried and removed: software-pipelined producers (a tile's fix-up after the next tile's main path), 5-10%
// slower than this loop at equal shared memory and occupancy (lab/cuda-decode-notebook.md, session 13).

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
#ifndef STAGES
#define STAGES 4
#endif
#ifndef DEC_K_STAGES
#define DEC_K_STAGES DEC_STAGES
#endif
#ifndef PROD_SEGS  // segments (1,024 values) of each of K and V a producer warp decodes per tile: 1 or 2
#define PROD_SEGS 2
#endif
// Measurement instruments (lab/probe_fused.py; the product never sets them): PROF adds a trailing
// `unsigned long long* prof` parameter and sums clock64() cycles per phase and role into it
// (prof[0..7]: producer wait-copies, issue, wait-empty, decode, loop, -, tiles, warps; prof[8..15]:
// consumer wait-full, rows, loop, -, -, -, tiles, warps); PROBE bits switch work off to time the
// rest (1: producers skip decoding, 2: producers skip the compressed copies and decode zeros, so
// no fix-up work, 4: consumers skip the
// attention arithmetic). Outputs are meaningless with PROBE != 0.
#ifndef PROBE
#define PROBE 0
#endif
#ifdef PROF
#define PROF_T(x) const long long x = clock64()
#else
#define PROF_T(x)
#endif
#ifndef KIND_SPLIT  // 1: a producer warp decodes one kind (K or V) of its segments, 0: both
#define KIND_SPLIT 0
#endif
#ifndef ENTRY_CHUNKS  // 16-byte chunks of entry list staged per producer, kind and stage (32 entries per segment)
#define ENTRY_CHUNKS (4 * PSEG + 1)
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
constexpr int KDS = DEC_K_STAGES;             // slots of the decoded K ring (DS, or 1)
constexpr int TILE = 16 * W;                  // rows per tile (16 per consumer warp)
constexpr int N = T * D;                      // values per block
constexpr int COLS = D / 8;                   // chunk columns
constexpr int NSEG = D / 64;                  // segments in a consumer's 16 rows
constexpr int PSEG = NSEG < PROD_SEGS ? NSEG : PROD_SEGS;  // segments per producer
constexpr int SG = NSEG / PSEG;               // segment groups of a consumer's 16 rows
constexpr int NK = KIND_SPLIT ? 1 : 2;        // kinds (K, V) one producer decodes
constexpr int PPC = SG * (3 - NK);            // producers per consumer
constexpr int PROWS = 16 / SG;                // rows per segment group
constexpr int NPROD = W * PPC;
constexpr int ALL_THREADS = 32 * (W + NPROD);
constexpr int SEGS = N / 1024;                // segments per block
constexpr int CODE_OFF = N;
constexpr int SEGTAB_OFF = N + 12 * (N / 32);
constexpr int ENTRY_OFF = SEGTAB_OFF + 4 * (SEGS + 1);
constexpr int DEC = 16 * ROW;                 // b16 elements of one decoded 16-row buffer
constexpr int S = STAGES;                     // compressed ring depth (S - 1 stages in flight)
constexpr int SMB = 1024 * PSEG;              // sign/mantissa bytes of a producer's segments
constexpr int CWB = 384 * PSEG;               // their code words
constexpr int SEGB = 32;                      // two chunks around their segment-table words
constexpr int ENC = ENTRY_CHUNKS;
constexpr int SLOT = SMB + CWB + SEGB + 16 * ENC;  // bytes per (stage, producer, kind)
static_assert(S >= 2, "STAGES must be >= 2");
static_assert(PROD_SEGS == 1 || PROD_SEGS == 2, "PROD_SEGS must be 1 or 2");
static_assert(ENC >= 1 && ENC <= 32, "ENTRY_CHUNKS must be 1..32 (one chunk per lane)");

static_assert(D == 64 || D == 128 || D == 256, "the fused kernel takes HEAD_DIM 64, 128 or 256");
static_assert(T >= 16 && (T & (T - 1)) == 0, "PAGE must be a power of two >= 16 (format v3)");
static_assert(DS >= 2, "DEC_STAGES must be >= 2");
static_assert(KDS == 1 || KDS == DS, "DEC_K_STAGES must be 1 or DEC_STAGES");
static_assert(32 % COLS == 0, "a lane's chunk column must be the same in every segment");

constexpr i64 TAIL = -1;  // "block" of the rows past the complete blocks: the BF16 tail

__device__ __forceinline__ u32 ldg32(const void* p) { return __ldg(reinterpret_cast<const u32*>(p)); }
__device__ __forceinline__ uint4 ldg128(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ uint4 lds128(const void* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ void sts128(void* p, u32 a, u32 b, u32 c, u32 d) {
  *reinterpret_cast<uint4*>(p) = make_uint4(a, b, c, d);
}
__device__ __forceinline__ bool compressed(i64 e) { return e >= 0 && !(e & 1); }


__device__ __forceinline__ u32 lds32(const void* p) { return *reinterpret_cast<const u32*>(p); }

// The segment-table words (first, last) of a producer's segments.
struct SegWords {
  u32 lo, hi;
};

// The staged entry chunks of the segments: [a0, a0 + 16 * nch) of the block, or `over` when they do not fit.
struct EntryWindow {
  int a0, nch;
  bool over;
};
__device__ __forceinline__ EntryWindow entry_window(u32 lo, u32 hi) {
  const int b0 = ENTRY_OFF + 2 * static_cast<int>(lo & 0xFFFFu), b1 = ENTRY_OFF + 2 * static_cast<int>(hi & 0xFFFFu);
  const int a0 = b0 & ~15, a1 = (b1 + 15) & ~15;
  const int nch = (a1 - a0) >> 4;
  return {a0, nch, nch > ENC};
}

// Issue the copies of one kind's compressed segments [s0, s0 + PSEG) into a slot (nothing for BF16 rows).
__device__ __forceinline__ void issue_slice(u8* slot, const u8* pool, i64 e, int s0, SegWords sw, int lane) {
  if (!compressed(e)) return;
  const u8* blk = pool + e;
  const u8* sm = blk + 1024 * s0;
  const u8* cw = blk + CODE_OFF + 384 * s0;
#pragma unroll
  for (int c = lane; c < SMB / 16; c += 32) cp_async16(slot + 16 * c, sm + 16 * c, 16);
#pragma unroll
  for (int c = lane; c < CWB / 16; c += 32) cp_async16(slot + SMB + 16 * c, cw + 16 * c, 16);
  if (lane < 2) cp_async16(slot + SMB + CWB + 16 * lane, blk + ((SEGTAB_OFF + 4 * s0) & ~15) + 16 * lane, 16);
  const EntryWindow ew = entry_window(sw.lo, sw.hi);
  if (!ew.over && lane < ew.nch) cp_async16(slot + SMB + CWB + SEGB + 16 * lane, blk + ew.a0 + 16 * lane, 16);
}

// Decode one kind's staged segments into the consumer's 16-row buffer `dec`.
//   q: the producer's index within its consumer (its segments are PSEG*q .. of the 16 rows)
//   b8p: this lane's column's 4 pre-shifted base8 pairs; dbp_s: [D/2] (base16 - base8) pairs in shared
//   memory; blk: the block in global memory (raw words, and entry lists that did not fit the stage).
// Main path: every group as 3-bit (core.cuh decode_chunk), one chunk per lane per segment.
__device__ __forceinline__ void decode_main(u16* dec, const u8* slot, int q, const u32 (&b8p)[4], int lane) {
  using namespace gaac_v3;
  const int col = lane % COLS;
#pragma unroll
  for (int k = 0; k < PSEG; ++k) {
    const int cl = 32 * (PSEG * q + k) + lane;  // chunk within the consumer's 16 rows
    const uint4 a = lds128(slot + 1024 * k + 32 * lane), b = lds128(slot + 1024 * k + 32 * lane + 16);
    const u32 sm[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    const u32 w[3] = {lds32(slot + SMB + 384 * k + 4 * lane), lds32(slot + SMB + 384 * k + 128 + 4 * lane),
                      lds32(slot + SMB + 384 * k + 256 + 4 * lane)};
    u32 v[16];
    decode_chunk(sm, w, b8p, v);
    u16* dst = dec + 4 * (cl / COLS) * ROW + 8 * col;
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) sts128(dst + rr * ROW, v[4 * rr], v[4 * rr + 1], v[4 * rr + 2], v[4 * rr + 3]);
  }
}

// Fix-up: the segments' entry list, one lane per wide group (after a __syncwarp that makes the
// main path's rows visible to every lane).
__device__ __forceinline__ void decode_fix(u16* dec, const u8* slot, const u8* blk, int s0, int q, const u32* dbp_s,
                                           int lane) {
  using namespace gaac_v3;
  const u8* seg = slot + SMB + CWB + ((4 * s0) & 15);
  const u32 w0 = lds32(seg), wn = lds32(seg + 4 * PSEG);
  const int e0 = static_cast<int>(w0 & 0xFFFFu), n = static_cast<int>(wn & 0xFFFFu) - e0;
  if (n <= 0) return;  // warp-uniform
  int bnd[PSEG > 1 ? PSEG - 1 : 1];
#pragma unroll
  for (int k = 1; k < PSEG; ++k) bnd[k - 1] = static_cast<int>(lds32(seg + 4 * k) & 0xFFFFu);
  const EntryWindow ew = entry_window(w0, wn);
  const u8* staged = slot + SMB + CWB + SEGB;
  int rbase = static_cast<int>(w0 >> 16);
  for (int j = 0; j < n; j += 32) {  // warp-uniform trip count
    const int idx = e0 + j + lane;
    const bool act = j + lane < n;
    u32 entry = 0u;
    if (act) {
      const int off = ENTRY_OFF + 2 * idx;
      entry = ew.over ? static_cast<u32>(__ldg(reinterpret_cast<const u16*>(blk + off)))
                      : static_cast<u32>(*reinterpret_cast<const u16*>(staged + off - ew.a0));
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

#ifdef PROF
// One role's PROF record: 5 phase cycle sums at dst[0..4], tiles at dst[6], warps at dst[7].
__device__ __forceinline__ void prof_add(unsigned long long* dst, const long long (&v)[5], int tiles) {
#pragma unroll
  for (int i = 0; i < 5; ++i) atomicAdd(dst + i, static_cast<unsigned long long>(v[i]));
  atomicAdd(dst + 6, static_cast<unsigned long long>(tiles));
  atomicAdd(dst + 7, 1ull);
}
#endif

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
                     int hkv, int max_blocks, int tokens_per_split, float scale_log2
#ifdef PROF
                     , unsigned long long* __restrict__ prof
#endif
                     ) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ __align__(8) unsigned long long full[DS * W], empty[DS * W], kfree[W];

  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int splits = gridDim.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int hq0 = h * G, hq_total = hkv * G;

  // shared memory: decoded K ring [KDS][W][DEC] | decoded V ring [DS][W][DEC] | dbp [2][D/2] |
  // compressed ring [S][NPROD][NK][SLOT]
  u16* ring = reinterpret_cast<u16*>(smem);
  u32* dbp_s = reinterpret_cast<u32*>(smem + (KDS + DS) * W * DEC * 2);
  u8* cring = smem + (KDS + DS) * W * DEC * 2 + 4 * D;
  auto kbuf = [&](int slot, int cw) { return ring + ((KDS == 1 ? 0 : slot) * W + cw) * DEC; };
  auto vbuf = [&](int slot, int cw) { return ring + (KDS * W + slot * W + cw) * DEC; };
  for (int i = tid; i < D / 2; i += ALL_THREADS) {
    dbp_s[i] = __ldg(k_dbp + h * (D / 2) + i);
    dbp_s[D / 2 + i] = __ldg(v_dbp + h * (D / 2) + i);
  }
  if (PROBE & 2) {  // no copies: decode zeros (empty entry lists: the fix-ups do nothing)
    for (int i = tid; i < S * NPROD * NK * SLOT / 16; i += ALL_THREADS) sts128(cring + 16 * i, 0u, 0u, 0u, 0u);
  }
  if (tid == 0) {
    for (int i = 0; i < DS * W; ++i) {
      mbar_init(full + i, 32 * PPC);  // every lane of the consumer's producers arrives
      mbar_init(empty + i, 32);       // every lane of the consumer arrives
    }
    for (int i = 0; i < W; ++i) mbar_init(kfree + i, 32);  // the consumer's lanes, once S is in registers
    fence_proxy_async();
  }
  __syncthreads();

  const attend::SplitRange rg = attend::split_range(num_blocks, tail_len, kv_start, b, split, tokens_per_split, T, TILE);
  const int nb = rg.nb, lo = rg.lo, hi = rg.hi, first = rg.first, n_tiles = rg.n_tiles;
  const i64 bh = static_cast<i64>(b) * hkv + h;

  attend::WarpState st;
  if (warp < W) {
    // ---------------- consumer: the BF16 kernel's arithmetic on the decoded rows ----------------
    st.init();
    st.load_q(q + (static_cast<i64>(b) * hq_total + hq0) * D, lane);
#ifdef PROF
    long long c_wait = 0, c_rows = 0;
    PROF_T(c_start);
#endif
    for (int it = 0; it < n_tiles; ++it) {
      const int slot = it % DS;
      PROF_T(t0);
      mbar_wait(full + slot * W + warp, (it / DS) & 1);
      PROF_T(t1);
      auto k_read = [&] {  // a one-slot K ring: the K producer may refill it now
        if (KDS == 1) mbar_arrive(kfree + warp);
      };
      if (!(PROBE & 4)) st.rows(kbuf(slot, warp), vbuf(slot, warp), first + it * TILE + 16 * warp, lo, hi, lane,
                                scale_log2, k_read);
      else k_read();
      PROF_T(t2);
      mbar_arrive(empty + slot * W + warp);
#ifdef PROF
      c_wait += t1 - t0, c_rows += t2 - t1;
#endif
    }
#ifdef PROF
    PROF_T(c_end);
    const long long cv[5] = {c_wait, c_rows, c_end - c_start, 0, 0};
    if (lane == 0) prof_add(prof + 8, cv, n_tiles);
#endif
  } else {
    // ---------------- producer: a cp.async ring of compressed tiles, decoded into the BF16 ring ----
    const int pi = warp - W, c = pi / PPC;
    // its segment group of the consumer's rows, and the kinds it decodes (warp-uniform; with
    // KIND_SPLIT the producers of a segment group take K and V: half the per-tile look-ups and
    // copy issue of a producer that takes both, calls G1/G9)
    const int qq = KIND_SPLIT ? (pi % PPC) >> 1 : pi % PPC;
    const bool doK = !KIND_SPLIT || (pi & 1) == 0, doV = !KIND_SPLIT || (pi & 1) == 1;
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
    auto tok_of = [&](int it) { return first + it * TILE + crow; };
    auto seg0 = [&](int tok0) { return (tok0 % T) * D / 1024 + PSEG * qq; };  // first segment of this producer
    auto cslot = [&](int it, int kind) { return cring + ((it % S) * NPROD * NK + pi * NK + (NK == 2 ? kind : 0)) * SLOT; };
    // The look-ups run ahead asynchronously (cp.async into small shared rings, completed with the
    // stage groups), so no register ever waits on a global load inside the loop: a tile's block-table
    // entries are copied at iteration m - 3(S-1), its segment-table words (needing the entry) at
    // m - 2(S-1), its compressed parts (needing both) at m - (S-1); each step reads what landed S-1
    // iterations after it was issued. (Register look-ups one stage ahead cost one loaded-latency
    // round trip per tile: ~2.8 us per slice whatever the work, calls F1-F9.)
    constexpr int LA = 3 * (S - 1);
    constexpr int R = LA + 2;                       // ring slots: a tile's metadata lives LA + 1 iterations
    __shared__ __align__(8) i64 ent_r[R][NPROD][2];  // block-table entries (K, V)
    __shared__ __align__(8) u32 seg_r[R][NPROD][4];  // segment words (K lo, K hi, V lo, V hi)
    auto ent_issue = [&](int m, bool sync) {         // lanes 0 / 1: K / V entry of tile m
      if (lane < 2 && m < n_tiles && (lane == 0 ? doK : doV)) {
        const int blk = tok_of(m) / T;
        i64* dst = &ent_r[m % R][pi][lane];
        const i64* src = (lane == 0 ? kt : vt) + blk;
        if (blk >= nb) *dst = TAIL;
        else if (sync) *dst = __ldg(src);
        else cp_async_small<8>(dst, src);
      }
    };
    auto seg_issue = [&](int m, bool sync) {         // lanes 0..3: its segment words (entries landed)
      if (lane < 4 && m < n_tiles && (lane < 2 ? doK : doV)) {
        const i64 e = ent_r[m % R][pi][lane >> 1];
        if (compressed(e)) {
          const u8* src = (lane < 2 ? k_pool : v_pool) + e + SEGTAB_OFF + 4 * (seg0(tok_of(m)) + (lane & 1) * PSEG);
          u32* dst = &seg_r[m % R][pi][lane];
          if (sync) *dst = ldg32(src);
          else cp_async_small<4>(dst, src);
        }
      }
    };
    auto main_issue = [&](int m) {                   // every lane: the compressed parts of tile m
      if (m >= n_tiles) return;
      const i64 ek = ent_r[m % R][pi][0], ev = ent_r[m % R][pi][1];
      const u32* sw = seg_r[m % R][pi];
      const int s0 = seg0(tok_of(m));
      if (doK) issue_slice(cslot(m, 0), k_pool, ek, s0, SegWords{sw[0], sw[1]}, lane);
      if (doV) issue_slice(cslot(m, 1), v_pool, ev, s0, SegWords{sw[2], sw[3]}, lane);
    };
    // prologue: the metadata the first iterations need, loaded directly; stages 0 .. S-2 in flight
    for (int m = 0; m < LA; ++m) ent_issue(m, true);
    __syncwarp();
    for (int m = 0; m < 2 * (S - 1); ++m) seg_issue(m, true);
    __syncwarp();
#pragma unroll
    for (int m = 0; m < S - 1; ++m) {
      main_issue(m);
      cp_async_commit();
    }
#ifdef PROF
    long long p_cp = 0, p_issue = 0, p_empty = 0, p_dec = 0;
    PROF_T(p_start);
#endif
    for (int it = 0; it < n_tiles; ++it) {
      PROF_T(t0);
      cp_async_wait<S - 2>();
      __syncwarp();  // stage `it` landed (and every copy issued S - 1 iterations ago); the slots refilled below are free
      PROF_T(t1);
      const i64 ek = ent_r[it % R][pi][0], ev = ent_r[it % R][pi][1];
      if (!(PROBE & 2)) main_issue(it + S - 1);
      seg_issue(it + 2 * (S - 1), false);
      ent_issue(it + LA, false);
      cp_async_commit();
      PROF_T(t2);
      const int slot = it % DS;
      // the buffers it writes are free: the consumer has finished tile it - DS (V, and K with a
      // DS-slot K ring), or has computed S of tile it - 1 (K with a one-slot K ring)
      if (it >= DS && (doV || KDS == DS)) mbar_wait(empty + slot * W + c, ((it / DS) + 1) & 1);
      if (KDS == 1 && doK && it >= 1) mbar_wait(kfree + c, (it - 1) & 1);
      PROF_T(t3);
      u16* dk = kbuf(slot, c);
      u16* dv = vbuf(slot, c);
      const int tok0 = tok_of(it), r0 = tok0 % T, s0 = seg0(tok0);
      // main paths of K and V back to back (independent: the scheduler interleaves them), one
      // __syncwarp, then the two fix-ups
      if (!(PROBE & 1)) {
      if (doK && compressed(ek)) decode_main(dk, cslot(it, 0), qq, kb8, lane);
      if (doV && compressed(ev)) decode_main(dv, cslot(it, 1), qq, vb8, lane);
      __syncwarp();
      if (!doK) {
      } else if (compressed(ek)) {
        decode_fix(dk, cslot(it, 0), k_pool + ek, s0, qq, dbp_s, lane);
      } else {
        direct_rows(dk, ek == TAIL ? ktail + r0 * D : reinterpret_cast<const u16*>(k_pool + (ek & ~1LL)) + r0 * D,
                    qq, tok0, lo, hi, lane);
      }
      if (!doV) {
      } else if (compressed(ev)) {
        decode_fix(dv, cslot(it, 1), v_pool + ev, s0, qq, dbp_s + D / 2, lane);
        mask_rows(dv, qq, tok0, lo, hi, lane);
      } else {
        direct_rows(dv, ev == TAIL ? vtail + r0 * D : reinterpret_cast<const u16*>(v_pool + (ev & ~1LL)) + r0 * D,
                    qq, tok0, lo, hi, lane);
      }
      }  // PROBE & 1
      PROF_T(t4);
      mbar_arrive(full + slot * W + c);
#ifdef PROF
      p_cp += t1 - t0, p_issue += t2 - t1, p_empty += t3 - t2, p_dec += t4 - t3;
#endif
    }
#ifdef PROF
    PROF_T(p_end);
    const long long pv[5] = {p_cp, p_issue, p_empty, p_dec, p_end - p_start};
    if (lane == 0) prof_add(prof, pv, n_tiles);
#endif
    cp_async_wait<0>();
  }
  __syncthreads();
  attend::finish(st, smem, attend::Output{part_o, part_lse, out, counters, static_cast<i64>(b) * hq_total + hq0, bh,
                                          split, splits},
                 ALL_THREADS);
}
