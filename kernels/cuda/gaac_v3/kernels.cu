// GAAC format v3 CUDA kernels: encoder, standalone decoder, decode-and-reduce.
//
// All bit logic comes from core.cuh (the same header the g++ tests check against the PyTorch
// reference); this file only decides which lane does what. Compile-time parameters (-D):
// BLOCK_T (tokens per block, power of two >= 16), HEAD_DIM (multiple of 16, <= 256); GAAC_FP8 = 1
// (E4M3) or 2 (E5M2) builds the same kernels for FP8 tiles (core_fp8.cuh, docs/FORMAT_V3.md "FP8
// tiles"): uint8 codes in and out, rows of T*D bytes, no decode-and-reduce kernel.
//
// Work split (docs/FORMAT_V3.md): one lane = one chunk (4 rows x 8 channels, 32 values), one warp =
// one segment (32 chunks). Decoders: every lane runs the same main path (all groups as 3-bit), then
// the warp walks its segment's entry list, one lane per listed group (raw words located by a ballot
// and a popcount), so lanes never diverge on data and no decoder runs a prefix sum.
#ifdef GAAC_FP8
#include "core_fp8.cuh"
#else
#include "core.cuh"
#endif

#ifndef BLOCK_T
#error "BLOCK_T must be defined"
#endif
#ifndef HEAD_DIM
#error "HEAD_DIM must be defined"
#endif
#ifndef DECODE_THREADS  // 128: four warps with 4-segment staged windows fit 32 KB of static shared memory
#define DECODE_THREADS 128
#endif
#ifndef DECODE_MIN_CTAS  // 1,024 threads per SM: caps the decoder at 64 registers (50% occupancy)
#define DECODE_MIN_CTAS (1024 / DECODE_THREADS)
#endif
#ifndef REDUCE_MIN_CTAS  // decode-and-reduce keeps a row's wrong and right words too: 64 registers at 4-segment
// windows, 80 at the whole windows of head_dims whose segments are not contiguous (80, 96, 112)
#define REDUCE_MIN_CTAS ((32 % (HEAD_DIM / 8) ? 768 : 1024) / DECODE_THREADS)
#endif

namespace {
using namespace gaac_v3;

constexpr int T = BLOCK_T;
constexpr int D = HEAD_DIM;
// the block geometry as a constant expression (a namespace-scope constexpr object could not be read in device code)
#ifdef GAAC_FP8
static_assert(GAAC_FP8 == 1 || GAAC_FP8 == 2, "GAAC_FP8 is 1 (E4M3) or 2 (E5M2)");
constexpr int MANT = GAAC_FP8 == 1 ? 3 : 2;  // mantissa bits
constexpr int SM_WORDS = 1 + MANT;           // words of a chunk's sign/mantissa record
#define GEO (make_geom_fp8(T, D, MANT))
typedef uint8_t value_t;  // an FP8 code
#else
#define GEO (make_geom(T, D))
typedef uint16_t value_t;  // a BF16 value
#endif
constexpr int NUMEL = T * D;
constexpr int CAP = (int)sizeof(value_t) * NUMEL;  // encoder row capacity = the block stored uncompressed
static_assert(GEO.entry_off <= CAP, "the fixed part of a block fits the row");
static_assert(D % 16 == 0 && D <= 256, "HEAD_DIM must be a multiple of 16 up to 256");
static_assert(GEO.segs <= 32, "the encoder runs one warp per segment in one CTA");

// segments per warp work item (the fix-up walks their entry lists as one list). BF16: 4 (call W1, H100, session
// 22, lab/results/w1_session22/: staged, the decoder runs at 92% of its read+write bound at 1 or 2 segments
// against 62-73% at the old whole-block windows: more items per block means more warps with loads in flight,
// which the 64-register cap cannot give one warp; 4 with the bulk store keeps the per-window fixed cost under
// 0.15 warp-instructions per value, eval/sass_decoder.py; call W2 measures it against 2). FP8 tiles keep the old rule, not measured again: a block cut into ceil(segs / 8) windows of equal
// size (the whole block up to 8 segments), so no window is much shorter than the others; so do BF16 head_dims
// whose segments are not contiguous (80, 96, 112: not staged).
#define GAAC_WHOLE_WINDOWS ((make_geom(T, D).segs + (make_geom(T, D).segs + 7) / 8 - 1) / ((make_geom(T, D).segs + 7) / 8))
#ifndef WINDOW_SEGS
#ifdef GAAC_FP8
#define WINDOW_SEGS GAAC_WHOLE_WINDOWS
#else  // staged geometries (a segment's values contiguous: 32 % (D / 8) == 0); the others keep whole windows
#define WINDOW_SEGS (SEG_CHUNKS % (D / GROUP) ? GAAC_WHOLE_WINDOWS : make_geom(T, D).segs < 4 ? make_geom(T, D).segs : 4)
#endif
#endif
constexpr int WIN = WINDOW_SEGS;
constexpr int NWIN = (make_geom(T, D).segs + WIN - 1) / WIN;
constexpr bool FULL = make_geom(T, D).chunks % SEG_CHUNKS == 0;  // every segment has 32 chunks
constexpr bool COL_FIXED = SEG_CHUNKS % (D / GROUP) == 0;      // a lane's column is the same in every segment
// DECODE_STAGE = 1 or 2: the standalone decoder writes a window's BF16 values into its warp's shared-memory buffer, the
// fix-up patches them there, and the warp then copies the window to global memory with 16-byte stores, 512
// contiguous bytes per warp instruction. Without it the main path stores to global memory and the fix-up reads
// those stores back (a read-modify-write through L2 per listed group). Only where a window's values are
// contiguous in the block (COL_FIXED: a segment is 1,024 consecutive values) and the buffers fit static shared
// memory; BF16 tiles only. 2: the copy-out is one bulk store by the copy engine (cp.async.bulk shared -> global,
// issued by lane 0; the buffer is reused once the engine has read it) instead of 16-byte stores by every lane:
// ~40 fewer instructions per window (the design of FA3's / CUTLASS's TMA epilogue store, in our own code). The default from call W1 (lab/experiments/codec_v3_sweep.py; 62% -> 92% of the bound at
// head_dim 128 on an H100, bit-exact in every variant).
#ifndef DECODE_STAGE
#define DECODE_STAGE 2
#endif
#ifdef GAAC_FP8
constexpr bool STAGE = false;
#else
constexpr bool STAGE = (DECODE_STAGE == 1 || DECODE_STAGE == 2) && COL_FIXED && (DECODE_THREADS / 32) * WIN * 2048 <= 48 * 1024;
#endif
constexpr bool STAGE_BULK = STAGE && DECODE_STAGE == 2;
constexpr int STAGE_VALUES = STAGE ? WIN * 1024 : 1;  // a warp's buffer (values)

__device__ __forceinline__ uint32_t ld32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ uint4 ld128(const void* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ void st128(void* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  *reinterpret_cast<uint4*>(p) = make_uint4(a, b, c, d);
}
// the bulk store of a staged window (sm_90): smem written by the lanes' ordinary stores is handed to the copy
// engine's proxy by a fence in every writing lane, then one lane issues the copy
// (the host shim's build, tests/test_v3_kernels_host.py, runs the same lane roles with a synchronous memcpy)
#ifdef GAAC_HOST_SHIM
inline void fence_proxy_async_smem() {}
inline void bulk_store_s2g(void* dst, const void* src, uint32_t bytes) { std::memcpy(dst, src, bytes); }
inline void bulk_wait_read() {}
inline void bulk_wait_all() {}
#else
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_store_s2g(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
               "cp.async.bulk.commit_group;\n" ::"l"(dst), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(src))), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
#endif
#ifdef GAAC_FP8
__device__ __forceinline__ void st64(void* p, uint32_t a, uint32_t b) { *reinterpret_cast<uint2*>(p) = make_uint2(a, b); }
// chunk c's sign/mantissa record: E4M3 one 16-byte load, E5M2 three words (12-byte records)
__device__ __forceinline__ void load_record(const uint8_t* p, uint32_t rec[SM_WORDS]) {
  if constexpr (SM_WORDS == 4) {
    const uint4 a = ld128(p);
    rec[0] = a.x, rec[1] = a.y, rec[2] = a.z, rec[3] = a.w;
  } else {
    GAAC_UNROLL
    for (int k = 0; k < SM_WORDS; ++k) rec[k] = ld32(p + 4 * k);
  }
}
#endif
__device__ __forceinline__ const uint8_t* block_ptr(const uint8_t* pool, long long entry) {
  return pool + (entry & ~(long long)(ALIGN - 1));
}
__device__ __forceinline__ int lane_col(int s, int lane) {
  if constexpr (COL_FIXED) return lane % GEO.cols;
  return chunk_col(GEO, SEG_CHUNKS * s + lane);
}

// Where results go: MODE_STORE writes BF16 to out (block i's first value); MODE_FOLD XORs every
// decoded pair word into acc and stores nothing.
enum { MODE_STORE = 0, MODE_FOLD = 1 };

// The main path of the window's chunks (lane = chunk 32s + lane of each segment s of the window).
template <int MODE>
__device__ __forceinline__ void window_main(const uint8_t* blk, int s_lo, int lane, const uint32_t* b8row, value_t* o,
                                            value_t* sbuf, uint32_t& acc) {
  uint4 bp = ld128(b8row + 4 * lane_col(s_lo, lane));
  // one base pointer per plane: inside the window every address is base + a constant (FULL) or
  // computed per segment (the last, short segment of an odd geometry)
#ifdef GAAC_FP8
  const uint8_t* smp = blk + 4 * SM_WORDS * (SEG_CHUNKS * s_lo + lane);
#else
  const uint8_t* smp = blk + 32 * (SEG_CHUNKS * s_lo + lane);
#endif
  const uint8_t* cwp = blk + GEO.code_off + 4 * (CODE_WORDS * SEG_CHUNKS * s_lo + lane);
  GAAC_UNROLL
  for (int k = 0; k < WIN; ++k) {
    const int s = s_lo + k;
    if (NWIN * WIN != GEO.segs && s >= GEO.segs) break;
    if (!FULL && lane >= seg_chunks(GEO, s)) continue;
    const int c = SEG_CHUNKS * s + lane;
    if constexpr (!COL_FIXED) bp = ld128(b8row + 4 * chunk_col(GEO, c));
#ifdef GAAC_FP8
    uint32_t rec[SM_WORDS];
    load_record(smp + 4 * SM_WORDS * SEG_CHUNKS * k, rec);
#else
    const uint4 a = ld128(smp + 1024 * k), b = ld128(smp + 1024 * k + 16);
    const uint32_t sm[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#endif
    uint32_t w[3];
    if constexpr (FULL) {
      GAAC_UNROLL
      for (int j = 0; j < 3; ++j) w[j] = ld32(cwp + 4 * CODE_WORDS * SEG_CHUNKS * k + 4 * SEG_CHUNKS * j);
    } else {
      GAAC_UNROLL
      for (int j = 0; j < 3; ++j) w[j] = ld32(blk + code_word_off(GEO, s, lane, j));
    }
    const uint32_t b8p[4] = {bp.x, bp.y, bp.z, bp.w};
#ifdef GAAC_FP8
    uint32_t v[8];  // row r = words 2r, 2r+1 (8 codes)
    decode_chunk_fp8<MANT>(rec, w, b8p, v);
#else
    uint32_t v[16];
    decode_chunk(sm, w, b8p, v);
#endif
    if constexpr (MODE == MODE_STORE) {
      value_t* dst;
      if constexpr (COL_FIXED)  // 32 chunks of a segment = 32 / cols bands of 4 rows
        dst = o + CHUNK_ROWS * ((SEG_CHUNKS * s_lo + lane) / GEO.cols) * D + GROUP * (lane % GEO.cols) +
              k * (CHUNK_ROWS * SEG_CHUNKS / GEO.cols) * D;
      else
        dst = o + chunk_row0(GEO, c) * D + GROUP * chunk_col(GEO, c);
      if constexpr (STAGE) dst = sbuf + (dst - o) - 1024 * s_lo;  // the same value's place in the warp's buffer
#ifdef GAAC_FP8
      GAAC_UNROLL
      for (int r = 0; r < 4; ++r) st64(dst + r * D, v[2 * r], v[2 * r + 1]);
#else
      GAAC_UNROLL
      for (int r = 0; r < 4; ++r) st128(dst + r * D, v[4 * r], v[4 * r + 1], v[4 * r + 2], v[4 * r + 3]);
#endif
    } else {
      GAAC_UNROLL
      for (int q = 0; q < 16; q += 2) acc ^= v[q] ^ v[q + 1];
    }
  }
}

// The fix-up of the window: its segments' entry lists are contiguous (and so are their raw words),
// so the warp walks them as one list, 32 entries per step; an entry's segment is found by comparing
// its index with the window's (at most 3) inner segment boundaries.
template <int MODE>
__device__ __forceinline__ void window_fix(const uint8_t* blk, int s_lo, int lane, const uint32_t* b8row,
                                           const uint32_t* dbrow, value_t* o, value_t* sbuf, uint32_t& acc) {
  const int s_hi = s_lo + WIN < GEO.segs ? s_lo + WIN : GEO.segs;
  const uint8_t* segtab = blk + GEO.segtab_off;
  const uint32_t s0 = ld32(segtab + 4 * s_lo), tot = ld32(segtab + 4 * GEO.segs);
  int bnd[WIN > 1 ? WIN - 1 : 1];
  GAAC_UNROLL
  for (int k = 1; k < WIN; ++k) bnd[k - 1] = (s_lo + k < s_hi) ? (int)(ld32(segtab + 4 * (s_lo + k)) & 0xFFFF) : 0x10000;
  const int e0 = s0 & 0xFFFF, n = (int)(ld32(segtab + 4 * s_hi) & 0xFFFF) - e0;
  const uint8_t* raws = blk + raw_off(GEO, tot & 0xFFFF);
  int rbase = s0 >> 16;
  if constexpr (MODE == MODE_STORE) __syncwarp();  // fix-up lanes read what other lanes of this warp stored
#ifdef GAAC_V3_COUNT_STEPS
  GAAC_UNROLL
  for (int j = 0; j < 32 * GAAC_V3_COUNT_STEPS; j += 32) {
#else
  for (int j = 0; j < n; j += 32) {  // warp-uniform trip count
#endif
    const int idx = e0 + j + lane;
    const bool act = j + lane < n;
    const uint32_t entry = act ? *reinterpret_cast<const uint16_t*>(blk + GEO.entry_off + 2 * idx) : 0u;
    const bool raw = act && entry_raw(entry);
    const unsigned bal = __ballot_sync(0xFFFFFFFFu, raw);
    if (act) {
#ifdef GAAC_FP8
      const uint32_t rw = raw ? (uint32_t)raws[rbase + __popc(bal & ((1u << lane) - 1u))] : 0u;  // a raw byte
#else
      const uint32_t rw = raw ? ld32(raws + 4 * (rbase + __popc(bal & ((1u << lane) - 1u)))) : 0u;
#endif
      int s = s_lo;
      GAAC_UNROLL
      for (int k = 0; k < WIN - 1; ++k) s += idx >= bnd[k];
      const int pos = entry_pos(entry), r = pos % CHUNK_ROWS, c = SEG_CHUNKS * s + pos / CHUNK_ROWS;
      const int col = chunk_col(GEO, c);
      const uint4 db = ld128(dbrow + 4 * col);
      const uint32_t d4[4] = {db.x, db.y, db.z, db.w};
#ifdef GAAC_FP8
      // the row rebuilt from its record and code words (as the main path decoded it), then fixed:
      // the lane reads nothing the main path stored, and overwrites the row's 8 codes
      static_assert(MODE == MODE_STORE, "FP8 tiles have no decode-and-reduce kernel");
      const int lane_c = c - SEG_CHUNKS * s, k = sm_row_word<MANT>(r);
      const uint8_t* rp = blk + 4 * SM_WORDS * c + 4 * k;
      const uint32_t lo = ld32(rp), hi = (MANT == 2 && k + 1 < SM_WORDS) ? ld32(rp + 4) : 0u;
      const uint32_t w[3] = {ld32(blk + code_word_off(GEO, s, lane_c, 0)), ld32(blk + code_word_off(GEO, s, lane_c, 1)),
                             ld32(blk + code_word_off(GEO, s, lane_c, 2))};
      const uint4 bp = ld128(b8row + 4 * col);
      const uint32_t b4[4] = {bp.x, bp.y, bp.z, bp.w};
      uint32_t out2[2];
      fix_row_fp8<MANT>(sm_row_bits<MANT>(lo, hi, r), w, b4, d4, r, entry, rw, out2);
      st64(o + (chunk_row0(GEO, c) + r) * D + GROUP * col, out2[0], out2[1]);
#else
      if constexpr (MODE == MODE_STORE) {
        uint16_t* dst = o + (chunk_row0(GEO, c) + r) * D + GROUP * col;
        if constexpr (STAGE) dst = sbuf + (dst - o) - 1024 * s_lo;
        const uint4 v = ld128(dst);
        uint32_t ow[4] = {v.x, v.y, v.z, v.w};
        fix_group(ow, d4, entry, rw);
        st128(dst, ow[0], ow[1], ow[2], ow[3]);
      } else {  // rebuild the main path's words of this row, fold (wrong ^ right)
        const int lane_c = c - SEG_CHUNKS * s;
        const uint32_t sm2[2] = {ld32(blk + 32 * c + 8 * r), ld32(blk + 32 * c + 8 * r + 4)};
        const uint32_t w[3] = {ld32(blk + code_word_off(GEO, s, lane_c, 0)), ld32(blk + code_word_off(GEO, s, lane_c, 1)),
                               ld32(blk + code_word_off(GEO, s, lane_c, 2))};
        const uint4 bp = ld128(b8row + 4 * col);
        const uint32_t b4[4] = {bp.x, bp.y, bp.z, bp.w};
        uint32_t wrong[4], right[4];
        decode_row(sm2, w, b4, r, wrong);
        GAAC_UNROLL
        for (int p = 0; p < 4; ++p) right[p] = wrong[p];
        fix_group(right, d4, entry, rw);
        GAAC_UNROLL
        for (int p = 0; p < 4; ++p) acc ^= wrong[p] ^ right[p];
      }
#endif
    }
    rbase += __popc(bal);
  }
}

// One work item: window wdx of block i (compressed), or its share of a BF16 block.
template <int MODE, bool RAW_PATH = true>
__device__ __forceinline__ void decode_item(const uint8_t* __restrict__ pool, long long ent, int i, int wdx, int lane,
                                            const uint32_t* b8p, const uint32_t* dbp, int base_stride, value_t* out,
                                            uint32_t& acc) {
  const uint8_t* blk = block_ptr(pool, ent);
  value_t* o = out + (size_t)i * NUMEL;
  const int s_lo = WIN * wdx;
  if (RAW_PATH && (ent & ENTRY_RAW_BIT)) {  // uncompressed block: this window's values (1,024 per segment)
    constexpr int VEC = 16 / (int)sizeof(value_t);  // values per 16-byte copy
    const int v_hi = (s_lo + WIN) * 1024 < NUMEL ? (s_lo + WIN) * 1024 : NUMEL;
    for (int v = s_lo * 1024 + VEC * lane; v < v_hi; v += 32 * VEC) {
      const uint4 x = ld128(blk + (int)sizeof(value_t) * v);
      if constexpr (MODE == MODE_STORE) *reinterpret_cast<uint4*>(o + v) = x;
      else acc ^= x.x ^ x.y ^ x.z ^ x.w;
    }
    return;
  }
  const uint32_t* b8row = b8p + (size_t)i * base_stride;
  if constexpr (STAGE && MODE == MODE_STORE) {
    __shared__ __align__(16) value_t stage_buf[DECODE_THREADS / 32][STAGE_VALUES];
    value_t* sbuf = stage_buf[threadIdx.x >> 5];
    if constexpr (STAGE_BULK) {
      if (lane == 0) bulk_wait_read();  // the previous item's bulk store has read the buffer
    }
    __syncwarp();  // ... and every lane's copy-out of it is done
    window_main<MODE>(blk, s_lo, lane, b8row, o, sbuf, acc);
    window_fix<MODE>(blk, s_lo, lane, b8row, dbp + (size_t)i * base_stride, o, sbuf, acc);
    const int v_lo = 1024 * s_lo, v_hi = v_lo + STAGE_VALUES < NUMEL ? v_lo + STAGE_VALUES : NUMEL;
    if constexpr (STAGE_BULK) {
      fence_proxy_async_smem();
      __syncwarp();  // every lane's values and fixes are in the buffer, visible to the copy engine
      if (lane == 0) bulk_store_s2g(o + v_lo, sbuf, 2u * static_cast<uint32_t>(v_hi - v_lo));
    } else {
      __syncwarp();  // every lane's values and fixes are in the buffer
      GAAC_UNROLL
      for (int v = 8 * lane; v < STAGE_VALUES; v += 256)
        if (v_lo + v < v_hi) *reinterpret_cast<uint4*>(o + v_lo + v) = *reinterpret_cast<const uint4*>(sbuf + v);
    }
  } else {
    window_main<MODE>(blk, s_lo, lane, b8row, o, nullptr, acc);
    window_fix<MODE>(blk, s_lo, lane, b8row, dbp + (size_t)i * base_stride, o, nullptr, acc);
  }
}

// DECODE_PREFETCH = k > 0 (an experiment, issue 14; off by default, the cubin unchanged): after each item, the warp
// asks L2 for the fixed part of its item k grid strides ahead (the window's sign/mantissa bytes and code words, or
// its raw values), one 128-byte line per lane and instruction, so that item's first loads find L2 rather than
// DRAM. Its block-table entry is loaded at the top of the item, so the item's own work covers that load. The
// loads of a window are short dependent chains per warp (W3/W4: 89-93% of the bound on the H100 at 4-7 CTAs per
// SM); a software prefetch one or two items ahead is the usual cure where registers cannot double-buffer (the
// L2-prefetch habit of memory-bound CUDA kernels; our own code). A hint only: the decoded bits cannot change.
#ifndef DECODE_PREFETCH
#define DECODE_PREFETCH 0
#endif
#if DECODE_PREFETCH && !defined(GAAC_FP8)
__device__ __forceinline__ void prefetch_l2_lines(const uint8_t* p, int bytes, int lane) {
  for (int off = 128 * lane; off < bytes; off += 32 * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
}
__device__ __forceinline__ void prefetch_item(const uint8_t* __restrict__ pool, long long ent, int wdx, int lane) {
  const uint8_t* blk = block_ptr(pool, ent);
  const int s_lo = WIN * wdx, s_hi = s_lo + WIN < GEO.segs ? s_lo + WIN : GEO.segs;
  if (ent & ENTRY_RAW_BIT) {
    const int v_hi = s_hi * 1024 < NUMEL ? s_hi * 1024 : NUMEL;
    prefetch_l2_lines(blk + 2 * 1024 * s_lo, 2 * (v_hi - 1024 * s_lo), lane);
    return;
  }
  const int sm_hi = 1024 * s_hi < GEO.code_off ? 1024 * s_hi : GEO.code_off;
  prefetch_l2_lines(blk + 1024 * s_lo, sm_hi - 1024 * s_lo, lane);
  const int c_lo = code_word_off(GEO, s_lo, 0, 0), c_hi = s_hi < GEO.segs ? code_word_off(GEO, s_hi, 0, 0) : GEO.segtab_off;
  prefetch_l2_lines(blk + c_lo, c_hi - c_lo, lane);
}
#endif

// Grid-stride loop over (block, window) items, one warp per item; returns this lane's XOR fold.
template <int MODE>
__device__ __forceinline__ uint32_t run_items(const uint8_t* __restrict__ pool, const long long* __restrict__ entries,
                                              const uint32_t* b8p, const uint32_t* dbp, int base_stride, value_t* out,
                                              int n_blocks) {
  const int lane = threadIdx.x & 31;
  const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, nwarps = (gridDim.x * blockDim.x) >> 5;
  const unsigned items = (unsigned)n_blocks * NWIN;  // n_blocks * NWIN < 2^32
  uint32_t acc = 0;
  for (unsigned item = warp; item < items; item += nwarps) {
    const int i = (int)(item / NWIN), wdx = (int)(item % NWIN);
#if DECODE_PREFETCH && !defined(GAAC_FP8)
    const unsigned ahead = item + DECODE_PREFETCH * nwarps;
    const long long ent_ahead = ahead < items ? entries[ahead / NWIN] : 0;
#endif
    decode_item<MODE>(pool, entries[i], i, wdx, lane, b8p, dbp, base_stride, out, acc);
#if DECODE_PREFETCH && !defined(GAAC_FP8)
    if (ahead < items) prefetch_item(pool, ent_ahead, (int)(ahead % NWIN), lane);
#endif
  }
  return acc;
}

}  // namespace

// Standalone decoder: pool + block-table entries -> BF16 (FP8: uint8 codes) [N, T, D]; grid-stride over
// (block, window). b8p / dbp: uint32 pair tables [Nb, D/2] (pair_const of base8, and of (base16 -
// base8) mod 256; FP8: of base_n and base_w - base_n); base_stride = D/2 when every block has its own
// row, 0 when all share row 0.
extern "C" __global__ void __launch_bounds__(DECODE_THREADS, DECODE_MIN_CTAS)
gaac_v3_decode(const uint8_t* __restrict__ pool, const long long* __restrict__ entries, const uint32_t* __restrict__ b8p,
               const uint32_t* __restrict__ dbp, int base_stride, value_t* __restrict__ out, int n_blocks) {
  run_items<MODE_STORE>(pool, entries, b8p, dbp, base_stride, out, n_blocks);
  if constexpr (STAGE_BULK) {
    if ((threadIdx.x & 31) == 0) bulk_wait_all();  // the buffers stay alive until the engine is done
  }
}

#ifndef GAAC_FP8

// Decode-and-reduce: decodes every value like gaac_v3_decode and stores none: every decoded 32-bit
// pair word is XOR-folded into one word per CTA (fold[blockIdx.x]); listed groups fold (wrong ^ right).
extern "C" __global__ void __launch_bounds__(DECODE_THREADS, REDUCE_MIN_CTAS)
gaac_v3_decode_reduce(const uint8_t* __restrict__ pool, const long long* __restrict__ entries, const uint32_t* __restrict__ b8p,
                      const uint32_t* __restrict__ dbp, int base_stride, uint32_t* __restrict__ fold, int n_blocks) {
  __shared__ uint32_t warp_fold[DECODE_THREADS / 32];
  const int lane = threadIdx.x & 31;
  uint32_t acc = run_items<MODE_FOLD>(pool, entries, b8p, dbp, base_stride, nullptr, n_blocks);
  GAAC_UNROLL
  for (int k = 16; k; k >>= 1) acc ^= __shfl_xor_sync(0xFFFFFFFFu, acc, k);
  if (lane == 0) warp_fold[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t a = 0;
    for (int k = 0; k < (int)(blockDim.x >> 5); ++k) a ^= warp_fold[k];
    fold[blockIdx.x] = a;
  }
}
#endif  // GAAC_FP8

#if defined(GAAC_V3_COUNT)
// Loop-free twin of one gaac_v3_decode item (the same decode_item), for eval/sass_decoder.py (BF16 and, with
// GAAC_FP8, FP8 tiles): built with -DGAAC_V3_COUNT_STEPS=k its fix-up runs exactly k unrolled
// 32-entry steps, so the static SASS count is what one warp issues for one window of WIN segments of a compressed
// block (the BF16-block branch, never taken for those, is left out).
extern "C" __global__ void gaac_v3_count_item(const uint8_t* __restrict__ pool, const long long* __restrict__ entries,
                                              const uint32_t* __restrict__ b8p, const uint32_t* __restrict__ dbp,
                                              int base_stride, value_t* __restrict__ out) {
  const unsigned item = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int i = (int)(item / NWIN), wdx = (int)(item % NWIN);
  uint32_t acc = 0;
  decode_item<MODE_STORE, false>(pool, entries[i], i, wdx, threadIdx.x & 31, b8p, dbp, base_stride, out, acc);
}
#endif

// Encoder: BF16 (FP8: uint8 codes) [N, T, D] -> rows uint8 [N, CAP] (block i's bytes at the start of
// row i; bytes past nbytes[i] are not written), nbytes int32 [N]. One CTA per block, one warp per
// segment (blockDim = 32 * segs). b8 / b16: uint8 [Nb, D] (FP8: base_n / base_w) with base_stride D
// (own row per block) or 0 (shared).
extern "C" __global__ void __launch_bounds__(32 * make_geom(T, D).segs)
gaac_v3_encode(const value_t* __restrict__ x, const uint8_t* __restrict__ b8, const uint8_t* __restrict__ b16, int base_stride,
               uint8_t* __restrict__ rows, int* __restrict__ nbytes) {
  __shared__ int seg_ent[32], seg_raw[32];
  const int i = blockIdx.x, lane = threadIdx.x & 31, s = threadIdx.x >> 5;
  const int m = seg_chunks(GEO, s), c = SEG_CHUNKS * s + lane;
  const bool live = lane < m;
  uint8_t* row = rows + (size_t)i * CAP;
#ifdef GAAC_FP8
  ChunkCodeFP8 cc;
#else
  ChunkCode cc;
#endif
  cc.wide = cc.raw = 0;
  if (live) {
    const int col = chunk_col(GEO, c);
    const value_t* src = x + (size_t)i * NUMEL + chunk_row0(GEO, c) * D + GROUP * col;
#ifdef GAAC_FP8
    uint32_t xv[8];  // row r = words 2r, 2r+1 (8 codes)
    GAAC_UNROLL
    for (int r = 0; r < 4; ++r) {
      const uint2 v = *reinterpret_cast<const uint2*>(src + r * D);
      xv[2 * r] = v.x, xv[2 * r + 1] = v.y;
    }
#else
    uint32_t xv[16];
    GAAC_UNROLL
    for (int r = 0; r < 4; ++r) {
      const uint4 v = ld128(src + r * D);
      xv[4 * r] = v.x, xv[4 * r + 1] = v.y, xv[4 * r + 2] = v.z, xv[4 * r + 3] = v.w;
    }
#endif
    const uint2 p8 = *reinterpret_cast<const uint2*>(b8 + (size_t)i * base_stride + GROUP * col);
    const uint2 p16 = *reinterpret_cast<const uint2*>(b16 + (size_t)i * base_stride + GROUP * col);
    const uint32_t b8w[2] = {p8.x, p8.y}, b16w[2] = {p16.x, p16.y};
#ifdef GAAC_FP8
    encode_chunk_fp8<MANT>(xv, b8w, b16w, cc);
    if constexpr (SM_WORDS == 4) {
      st128(row + 16 * c, cc.rec[0], cc.rec[1], cc.rec[2], cc.rec[3]);
    } else {
      GAAC_UNROLL
      for (int k = 0; k < SM_WORDS; ++k) *reinterpret_cast<uint32_t*>(row + 4 * SM_WORDS * c + 4 * k) = cc.rec[k];
    }
#else
    encode_chunk(xv, b8w, b16w, cc);
    st128(row + 32 * c, cc.sm[0], cc.sm[1], cc.sm[2], cc.sm[3]);
    st128(row + 32 * c + 16, cc.sm[4], cc.sm[5], cc.sm[6], cc.sm[7]);
#endif
    GAAC_UNROLL
    for (int k = 0; k < 3; ++k) *reinterpret_cast<uint32_t*>(row + code_word_off(GEO, s, lane, k)) = cc.w[k];
  }
  // ranks inside the segment (the encoder may scan; decoders never do)
  const int nw = __popc(cc.wide), nr = __popc(cc.raw);
  int iw = nw, ir = nr;
  GAAC_UNROLL
  for (int k = 1; k < 32; k <<= 1) {
    const int a = __shfl_up_sync(0xFFFFFFFFu, iw, k), b = __shfl_up_sync(0xFFFFFFFFu, ir, k);
    if (lane >= k) iw += a, ir += b;
  }
  if (lane == 31) seg_ent[s] = iw, seg_raw[s] = ir;
  __syncthreads();
  // segment starts and block totals: lane k holds segment k's counts, one more warp scan
  const int ke = lane < GEO.segs ? seg_ent[lane] : 0, kr = lane < GEO.segs ? seg_raw[lane] : 0;
  int se = ke, sr = kr;
  GAAC_UNROLL
  for (int k = 1; k < 32; k <<= 1) {
    const int a = __shfl_up_sync(0xFFFFFFFFu, se, k), b = __shfl_up_sync(0xFFFFFFFFu, sr, k);
    if (lane >= k) se += a, sr += b;
  }
  const int e_start = __shfl_sync(0xFFFFFFFFu, se - ke, s), r_start = __shfl_sync(0xFFFFFFFFu, sr - kr, s);
  const int e_tot = __shfl_sync(0xFFFFFFFFu, se, GEO.segs - 1), r_tot = __shfl_sync(0xFFFFFFFFu, sr, GEO.segs - 1);
  const int ro = raw_off(GEO, e_tot), nb = block_bytes(GEO, e_tot, r_tot);
  int e = e_start + iw - nw, q = r_start + ir - nr;
  GAAC_UNROLL
  for (int r = 0; r < 4; ++r) {
    if ((cc.wide >> r) & 1) {
      const int off = GEO.entry_off + 2 * e++;
      if (off + 2 <= CAP) *reinterpret_cast<uint16_t*>(row + off) = (uint16_t)(cc.entry[r] | (uint32_t)(4 * lane + r));
    }
    if ((cc.raw >> r) & 1) {
#ifdef GAAC_FP8
      const int off = ro + q++;  // raw bytes, unaligned
      if (off < CAP) row[off] = (uint8_t)cc.rword[r];
#else
      const int off = ro + 4 * q++;
      if (off + 4 <= CAP) *reinterpret_cast<uint32_t*>(row + off) = cc.rword[r];
#endif
    }
  }
  if (lane == 0) *reinterpret_cast<uint32_t*>(row + GEO.segtab_off + 4 * s) = (uint32_t)e_start | ((uint32_t)r_start << 16);
  if (threadIdx.x == 0) {
    *reinterpret_cast<uint32_t*>(row + GEO.segtab_off + 4 * GEO.segs) = (uint32_t)e_tot | ((uint32_t)r_tot << 16);
#ifdef GAAC_FP8
    nbytes[i] = nb;
  }
  // padding bytes are zero: none before the raw bytes, 0..15 after them (one byte per thread of warp 0)
  if (threadIdx.x < ALIGN) {
    const int k = ro + r_tot + threadIdx.x;
    if (k < nb && k < CAP) row[k] = 0;
  }
#else
    // padding bytes are zero: 0 or 2 between the entries and the raw words, 0..12 (whole words) at the end
    if (GEO.entry_off + 2 * e_tot < ro && ro <= CAP) *reinterpret_cast<uint16_t*>(row + ro - 2) = 0;
    for (int k = ro + 4 * r_tot; k < nb && k + 4 <= CAP; k += 4) *reinterpret_cast<uint32_t*>(row + k) = 0;
    nbytes[i] = nb;
  }
#endif
}

// Pack: block i's stored bytes -> pool + offs[i] (a 16-byte multiple the caller computed on the
// device, so the host never learns the lengths): the encoder row's first nbytes[i] bytes, or its BF16
// (FP8) bytes x[i] when nbytes[i] > CAP (it does not fit: stored raw). One CTA per block, 16 B per thread
// and step; stored lengths are 16-byte multiples (the format's block alignment).
extern "C" __global__ void gaac_v3_pack(const uint8_t* __restrict__ rows, const int* __restrict__ nbytes,
                                        const uint8_t* __restrict__ x, const long long* __restrict__ offs,
                                        uint8_t* __restrict__ pool) {
  const int i = blockIdx.x;
  const int nb = nbytes[i];
  const bool fits = nb <= CAP;
  const int len = fits ? nb : CAP;
  const uint8_t* src = (fits ? rows : x) + (size_t)i * CAP;
  uint8_t* dst = pool + offs[i];
  for (int k = 16 * threadIdx.x; k < len; k += 16 * blockDim.x) {
    const uint4 v = ld128(src + k);
    st128(dst + k, v.x, v.y, v.z, v.w);
  }
}
