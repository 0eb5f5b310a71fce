// Fused GAAC v3 split-KV GQA decode attention (q_len = 1): compressed v3 blocks are copied into
// shared memory, decoded there by the warp that attends to them, and fed to the same MMA code as the
// BF16 kernel (gaac/attend.cuh), so the output is bit-identical to decode_attention.cu's for the
// same WARPS and split boundaries whenever the decoded values are the stored ones.
//
// Design followed (our own; the structure of decode_attention.cu, itself after flash-decoding and
// FlashInfer's decode): grid (num_splits, Hkv, B); each warp owns 16 rows of every stage and runs
// its own cp.async ring, so no CTA barrier is needed per stage. What changes is what a warp copies
// and what it does before the MMAs:
//
//   copy (stage it + S - 1): of each of K and V, the 16 rows' sign/mantissa plane (16 x D bytes) and
//     code words (6 x D bytes: D / 64 whole segments, the rows are segment-aligned for D % 64 == 0),
//     the two 16-byte chunks holding their segment-table words, and the 16-byte chunks holding their
//     entry list (known from the segment-table words, loaded one stage earlier; the block-table
//     entry one stage before that). A block stored as BF16 (entry | 1) and the BF16 tail are read
//     straight from global memory at decode time instead (rare / once per sequence).
//   decode (stage it): main path, every lane one chunk per segment (4 rows x 8 channels, no branch),
//     written as BF16 rows into the warp's padded buffer; then the entry list, one lane per wide
//     group (core.cuh fix_group), raw words read from global memory when a ballot says any exists.
//   attend: attend::WarpState::rows on the buffers (ldmatrix + mma, online softmax), as BF16.
//
// Compile-time parameters (-D): HEAD_DIM (64, 128 or 256), PAGE (block size T: a
// power of two >= 16), QUERY_GROUP (query heads per kv head), WARPS, STAGES (>= 2), MIN_CTAS_PER_SM (default 1), ENTRY_CHUNKS (16-byte
// chunks of entry list staged per warp, kind and stage; a longer list is read from global memory).
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
#ifndef ENTRY_CHUNKS
#define ENTRY_CHUNKS (HEAD_DIM / 16 + 1)
#endif

namespace {
using namespace gaac;
using attend::D;
using attend::G;
using attend::ROW;
using attend::THREADS;
using attend::W;
typedef unsigned char u8;

constexpr int T = PAGE;
constexpr int S = STAGES;
constexpr int TILE = 16 * W;            // rows per stage (16 per warp)
constexpr int N = T * D;                // values per block
constexpr int COLS = D / 8;             // chunk columns
constexpr int NSEG = D / 64;            // segments per warp slice of 16 rows
constexpr int SEGS = N / 1024;          // segments per block
constexpr int CODE_OFF = N;
constexpr int SEGTAB_OFF = N + 12 * (N / 32);
constexpr int ENTRY_OFF = SEGTAB_OFF + 4 * (SEGS + 1);
constexpr int SMB = 16 * D;             // sign/mantissa bytes of 16 rows
constexpr int CWB = 6 * D;              // code-word bytes of 16 rows (NSEG x 384)
constexpr int SEGB = 32;                // two chunks around the slice's segment-table words
constexpr int ENC = ENTRY_CHUNKS;
constexpr int SLOT = SMB + CWB + SEGB + 16 * ENC;  // bytes per (stage, warp, kind)
constexpr int DEC = 16 * ROW;                      // b16 elements of one decoded 16-row buffer

static_assert(D == 64 || D == 128 || D == 256, "the fused kernel takes HEAD_DIM 64, 128 or 256");
static_assert(T >= 16 && (T & (T - 1)) == 0, "PAGE must be a power of two >= 16 (format v3)");
static_assert(S >= 2, "STAGES must be >= 2");
static_assert(ENC >= 1 && ENC <= 32, "ENTRY_CHUNKS must be 1..32 (one chunk per lane)");
static_assert(32 % COLS == 0, "a lane's chunk column must be the same in every segment");

__device__ __forceinline__ u32 lds32(const void* p) { return *reinterpret_cast<const u32*>(p); }
__device__ __forceinline__ uint4 lds128(const void* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ void sts128(void* p, u32 a, u32 b, u32 c, u32 d) {
  *reinterpret_cast<uint4*>(p) = make_uint4(a, b, c, d);
}

// Where a warp's 16 rows of one kind come from: a block-table entry (offset | 1 if BF16-stored),
// or TAIL for the BF16 tail. The rows start at row r0 = tok0 % T of that block.
constexpr i64 TAIL = -1;

__device__ __forceinline__ i64 lookup(const i64* table, int nb, int tok0) {
  const int blk = tok0 / T;
  return blk < nb ? __ldg(table + blk) : TAIL;
}
__device__ __forceinline__ bool compressed(i64 e) { return e >= 0 && !(e & 1); }

// The segment-table words of the slice (first, last) that size its entry list. Every lane loads
// the same two words (one broadcast transaction each).
struct SegWords {
  u32 lo, hi;
};
__device__ __forceinline__ SegWords seg_words(const u8* pool, i64 e, int r0) {
  if (!compressed(e)) return {0u, 0u};
  const u8* st = pool + e + SEGTAB_OFF + 4 * (r0 * D / 1024);
  return {__ldg(reinterpret_cast<const u32*>(st)), __ldg(reinterpret_cast<const u32*>(st + 4 * NSEG))};
}

// The staged entry chunks of a slice: [a0, a0 + 16 * nch) of the block, or `over` when they do not fit.
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

// Issue the copies of one kind's compressed slice into its slot (nothing for BF16 rows).
__device__ __forceinline__ void issue_slice(u8* slot, const u8* pool, i64 e, int r0, SegWords sw, int lane) {
  if (!compressed(e)) return;
  const u8* blk = pool + e;
  const u8* sm = blk + r0 * D;
  const u8* cw = blk + CODE_OFF + 384 * (r0 * D / 1024);
#pragma unroll
  for (int c = lane; c < SMB / 16; c += 32) cp_async16(slot + 16 * c, sm + 16 * c, 16);
#pragma unroll
  for (int c = lane; c < CWB / 16; c += 32) cp_async16(slot + SMB + 16 * c, cw + 16 * c, 16);
  if (lane < 2) cp_async16(slot + SMB + CWB + 16 * lane, blk + ((SEGTAB_OFF + 4 * (r0 * D / 1024)) & ~15) + 16 * lane, 16);
  const EntryWindow ew = entry_window(sw.lo, sw.hi);
  if (!ew.over && lane < ew.nch) cp_async16(slot + SMB + CWB + SEGB + 16 * lane, blk + ew.a0 + 16 * lane, 16);
}

// 16 BF16 rows [T, D]-major from global memory (a BF16-stored block or the tail) into the buffer;
// rows outside [lo, hi) become zeros.
__device__ __forceinline__ void direct_rows(u16* dec, const u16* src, int tok0, int lo, int hi, int lane) {
#pragma unroll
  for (int c = lane; c < 16 * COLS; c += 32) {
    const int r = c / COLS, col = c % COLS;
    const bool ok = tok0 + r >= lo && tok0 + r < hi;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (ok) v = __ldg(reinterpret_cast<const uint4*>(src + r * D + 8 * col));
    *reinterpret_cast<uint4*>(dec + r * ROW + 8 * col) = v;
  }
}

// Decode one kind's staged compressed slice into 16 BF16 rows.
//   b8p: this lane's column's 4 pre-shifted base8 pair words; dbp_s: [D/2] (base16 - base8) pair words
//   in shared memory; blk: the block in global memory (raw words, and entry lists that did not fit).
__device__ __forceinline__ void decode_slice(u16* dec, const u8* slot, const u8* blk, int r0, const u32 (&b8p)[4],
                                             const u32* dbp_s, int lane) {
  using namespace gaac_v3;
  const int col = lane % COLS;
  // main path: lane = chunk `lane` of each of the slice's segments
#pragma unroll
  for (int k = 0; k < NSEG; ++k) {
    const int cl = 32 * k + lane;
    const uint4 a = lds128(slot + 32 * cl), b = lds128(slot + 32 * cl + 16);
    const u32 sm[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    const u32 w[3] = {lds32(slot + SMB + 384 * k + 4 * lane), lds32(slot + SMB + 384 * k + 128 + 4 * lane),
                      lds32(slot + SMB + 384 * k + 256 + 4 * lane)};
    u32 v[16];
    decode_chunk(sm, w, b8p, v);
    u16* dst = dec + 4 * (cl / COLS) * ROW + 8 * col;
#pragma unroll
    for (int r = 0; r < 4; ++r) sts128(dst + r * ROW, v[4 * r], v[4 * r + 1], v[4 * r + 2], v[4 * r + 3]);
  }
  // fix-up: the slice's entry list (contiguous over its segments), one lane per wide group
  const u8* seg = slot + SMB + CWB + ((4 * (r0 * D / 1024)) & 15);
  const u32 w0 = lds32(seg), wn = lds32(seg + 4 * NSEG);
  const int e0 = static_cast<int>(w0 & 0xFFFFu), n = static_cast<int>(wn & 0xFFFFu) - e0;
  if (n <= 0) return;  // warp-uniform
  int bnd[NSEG > 1 ? NSEG - 1 : 1];
#pragma unroll
  for (int k = 1; k < NSEG; ++k) bnd[k - 1] = static_cast<int>(lds32(seg + 4 * k) & 0xFFFFu);
  const EntryWindow ew = entry_window(w0, wn);
  const u8* staged = slot + SMB + CWB + SEGB;
  int rbase = static_cast<int>(w0 >> 16);
  __syncwarp();  // fix-up lanes read rows other lanes stored
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
      const u32 tot = __ldg(reinterpret_cast<const u32*>(blk + SEGTAB_OFF + 4 * SEGS)) & 0xFFFFu;
      const u8* raws = blk + ((ENTRY_OFF + 2 * static_cast<int>(tot) + 3) & ~3);
      if (raw) rw = __ldg(reinterpret_cast<const u32*>(raws) + rbase + __popc(bal & ((1u << lane) - 1u)));
    }
    if (act) {
      int s = 0;
#pragma unroll
      for (int k = 0; k < NSEG - 1; ++k) s += idx >= bnd[k];
      const int pos = entry_pos(entry), r = pos % CHUNK_ROWS, cl = 32 * s + pos / CHUNK_ROWS;
      const int c = cl % COLS;
      const uint4 db = lds128(dbp_s + 4 * c);
      const u32 d4[4] = {db.x, db.y, db.z, db.w};
      u16* dst = dec + (4 * (cl / COLS) + r) * ROW + 8 * c;
      const uint4 o = lds128(dst);
      u32 ow[4] = {o.x, o.y, o.z, o.w};
      fix_group(ow, d4, entry, rw);
      sts128(dst, ow[0], ow[1], ow[2], ow[3]);
    }
    rbase += __popc(bal);
  }
}

// Rows of a decoded buffer outside [lo, hi) -> zeros (a masked V row must be finite: P is 0 there).
__device__ __forceinline__ void mask_rows(u16* dec, int tok0, int lo, int hi, int lane) {
  if (tok0 >= lo && tok0 + 16 <= hi) return;  // warp-uniform
  __syncwarp();
#pragma unroll
  for (int c = lane; c < 16 * COLS; c += 32) {
    const int r = c / COLS;
    if (tok0 + r < lo || tok0 + r >= hi) *reinterpret_cast<uint4*>(dec + r * ROW + 8 * (c % COLS)) = make_uint4(0u, 0u, 0u, 0u);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS, MIN_CTAS_PER_SM)
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
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int splits = gridDim.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int hq0 = h * G, hq_total = hkv * G;

  // shared memory: ring [S][W][2 kinds][SLOT] | decoded rows [W][2][DEC] | dbp [2][D/2]
  u8* ring = smem;
  u16* dec_k = reinterpret_cast<u16*>(smem + S * W * 2 * SLOT) + warp * 2 * DEC;
  u16* dec_v = dec_k + DEC;
  u32* dbp_s = reinterpret_cast<u32*>(smem + S * W * 2 * SLOT + W * 2 * DEC * 2);
  for (int i = tid; i < D / 2; i += THREADS) {
    dbp_s[i] = __ldg(k_dbp + h * (D / 2) + i);
    dbp_s[D / 2 + i] = __ldg(v_dbp + h * (D / 2) + i);
  }
  u32 kb8[4], vb8[4];
  {
    const uint4 kb = __ldg(reinterpret_cast<const uint4*>(k_b8p + h * (D / 2)) + lane % COLS);
    const uint4 vb = __ldg(reinterpret_cast<const uint4*>(v_b8p + h * (D / 2)) + lane % COLS);
    kb8[0] = kb.x, kb8[1] = kb.y, kb8[2] = kb.z, kb8[3] = kb.w;
    vb8[0] = vb.x, vb8[1] = vb.y, vb8[2] = vb.z, vb8[3] = vb.w;
  }
  __syncthreads();  // dbp_s is read by every warp

  const int nb = num_blocks[b];
  const int len = nb * T + tail_len[b];
  const int lo = kv_start != nullptr ? max(kv_start[b], 0) : 0;
  const int s0 = split * tokens_per_split;
  const int hi = min(s0 + tokens_per_split, len);
  const int first = max(s0, lo / TILE * TILE);
  const int n_tiles = hi > first ? (hi - first + TILE - 1) / TILE : 0;

  const i64 bh = static_cast<i64>(b) * hkv + h;
  const i64* kt = k_table + bh * max_blocks;
  const i64* vt = v_table + bh * max_blocks;
  const u16* ktail = k_tail + bh * T * D;
  const u16* vtail = v_tail + bh * T * D;
  const int wrow = warp * 16;
  auto slot_of = [&](int it, int kind) { return ring + ((it % S) * W * 2 + warp * 2 + kind) * SLOT; };

  attend::WarpState st;
  st.init();

  // prologue: stages 0 .. S-2 in flight; stage S-1's entries and segment words loaded, stage S's entries
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < n_tiles) {
      const int tok0 = first + s * TILE + wrow, r0 = tok0 % T;
      const i64 ek = lookup(kt, nb, tok0), ev = lookup(vt, nb, tok0);
      issue_slice(slot_of(s, 0), k_pool, ek, r0, seg_words(k_pool, ek, r0), lane);
      issue_slice(slot_of(s, 1), v_pool, ev, r0, seg_words(v_pool, ev, r0), lane);
    }
    cp_async_commit();
  }
  i64 ek_n = TAIL, ev_n = TAIL, ek_nn = TAIL, ev_nn = TAIL;
  SegWords sk_n{0u, 0u}, sv_n{0u, 0u};
  if (S - 1 < n_tiles) {
    const int tok0 = first + (S - 1) * TILE + wrow;
    ek_n = lookup(kt, nb, tok0), ev_n = lookup(vt, nb, tok0);
    sk_n = seg_words(k_pool, ek_n, tok0 % T), sv_n = seg_words(v_pool, ev_n, tok0 % T);
  }
  if (S < n_tiles) {
    const int tok0 = first + S * TILE + wrow;
    ek_nn = lookup(kt, nb, tok0), ev_nn = lookup(vt, nb, tok0);
  }

  st.load_q(q + (static_cast<i64>(b) * hq_total + hq0) * D, lane);

  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<S - 2>();
    __syncwarp();  // stage `it` landed; every lane is done with the buffers and the slot refilled below
    {
      const int nx = it + S - 1;
      if (nx < n_tiles) {
        const int r0 = (first + nx * TILE + wrow) % T;
        issue_slice(slot_of(nx, 0), k_pool, ek_n, r0, sk_n, lane);
        issue_slice(slot_of(nx, 1), v_pool, ev_n, r0, sv_n, lane);
      }
      cp_async_commit();
      // the next stage's segment words (its entries were loaded an iteration ago), then the entries after it
      if (nx + 1 < n_tiles) {
        const int r1 = (first + (nx + 1) * TILE + wrow) % T;
        ek_n = ek_nn, ev_n = ev_nn;
        sk_n = seg_words(k_pool, ek_n, r1), sv_n = seg_words(v_pool, ev_n, r1);
      }
      if (nx + 2 < n_tiles) {
        const int tok2 = first + (nx + 2) * TILE + wrow;
        ek_nn = lookup(kt, nb, tok2), ev_nn = lookup(vt, nb, tok2);
      }
    }
    const int tok0 = first + it * TILE + wrow, r0 = tok0 % T;
    const i64 ek = lookup(kt, nb, tok0), ev = lookup(vt, nb, tok0);  // again (L1): no registers held per stage
    if (compressed(ek)) {
      decode_slice(dec_k, slot_of(it, 0), k_pool + ek, r0, kb8, dbp_s, lane);
    } else {
      direct_rows(dec_k, ek == TAIL ? ktail + r0 * D : reinterpret_cast<const u16*>(k_pool + (ek & ~1LL)) + r0 * D,
                  tok0, lo, hi, lane);
    }
    if (compressed(ev)) {
      decode_slice(dec_v, slot_of(it, 1), v_pool + ev, r0, vb8, dbp_s + D / 2, lane);
      mask_rows(dec_v, tok0, lo, hi, lane);
    } else {
      direct_rows(dec_v, ev == TAIL ? vtail + r0 * D : reinterpret_cast<const u16*>(v_pool + (ev & ~1LL)) + r0 * D,
                  tok0, lo, hi, lane);
    }
    __syncwarp();  // the decoded rows are visible to every lane's ldmatrix
    st.rows(dec_k, dec_v, tok0, lo, hi, lane, scale_log2);
  }
  cp_async_wait<0>();
  __syncthreads();
  attend::finish(st, smem, attend::Output{part_o, part_lse, out, counters, static_cast<i64>(b) * hq_total + hq0, bh,
                                          split, splits});
}
