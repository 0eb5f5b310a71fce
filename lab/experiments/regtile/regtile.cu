// Register-tile GAAC decode attention (lab prototype; layout in lab/experiments/regtile/format.py).
//
// One warp role. Every warp owns 16 rows of each pipeline stage (as in the BF16 kernel,
// kernels/cuda/decode_attention.cu): lane 0 copies the stage's compressed K and V tiles into the warp's
// own shared-memory slot with two bulk copies (the copy engine, completing on the slot's mbarrier);
// then each lane reads its own words with vector LDS and rebuilds the m16n8k16 A fragments in registers
// (the format puts every lane's bytes together), and feeds them to attend::WarpState::rows_from, the
// same arithmetic the BF16 twin runs on ldmatrix fragments: for the same warps and splits the output
// must be bit-identical to the twin's. No decoded ring, no producer warps, no barrier between roles.
// Design followed: Marlin (weights pre-shuffled into MMA fragment order and dequantised in registers);
// our own layout and code. Bit logic: gaac_v3::pair_field / bitsel / prmt from the product's core.cuh.
//
// Defines: HEAD_DIM (64, 128), QUERY_GROUP, WARPS, STAGES (>= 2), MIN_CTAS_PER_SM, WIDE_FIX (1; 0 = probe that
// skips the 4-bit / raw fix-up: wrong bits, timing only), FMT4 (1: the fixed 4-bit lane layout of format4.py,
// whose pairs need no fix-up; WIDE_FIX=0 then skips only the raw groups' high nibbles; 2: its variant with
// sign/mantissa words, format4i.py).
#include "gaac_v3/core.cuh"  // first: its GROUP constant (8 channels) collides with the query-group define
#define GROUP QUERY_GROUP
#include "gaac/ptx.cuh"
#include "gaac/attend.cuh"
#include "f4_pair.h"  // F4 pair decode (host + device; g++-tested in lab/test_experiments.py)

#ifndef MIN_CTAS_PER_SM
#define MIN_CTAS_PER_SM 1
#endif
#ifndef WIDE_FIX
#define WIDE_FIX 1
#endif
#ifndef FMT4
#define FMT4 0
#endif

namespace {
using namespace gaac;
using attend::D;
using attend::W;
using attend::THREADS;
constexpr int T = 64;
constexpr int S = STAGES;
constexpr int TILE = 16 * W;
constexpr int NP = D / 4, KS = D / 16, NW = 3 * NP / 16;
constexpr int SIDE = FMT4 ? 32 : (D == 128 ? 96 : 64);
constexpr int CODE_OFF = 16 * D, SIDE_OFF = CODE_OFF + (FMT4 ? 8 * D : 128 * NW), TB = SIDE_OFF + SIDE;
// where a tile's raw-group count sits in its side area, as a mask of the u32 at SIDE_OFF + NRAW_AT
constexpr int NRAW_AT = FMT4 ? 0 : 32;
constexpr u32 NRAW_MASK = FMT4 ? 0xFFu : 0xFF00u;
constexpr int BLOCK_BYTES = (T / 16) * TB;
// per-lane pair constants: F4 needs base16 pairs only (uint2), the 3-bit layout base8 and base8 ^ base16 (uint4)
template <bool F4> struct CstOf { using type = uint4; };  // (no <type_traits> under NVRTC)
template <> struct CstOf<true> { using type = uint2; };
using Cst = CstOf<FMT4 != 0>::type;
constexpr int CONST_BYTES = 2 * KS * 32 * static_cast<int>(sizeof(Cst));
static_assert(D == 64 || D == 128, "prototype: head_dim 64 or 128");
static_assert(TB % 16 == 0, "tile records are 16-byte multiples");

// Per-lane pair constants of one kind, [KS][32] uint4 {b8p0, b8p1, b8p0 ^ b16p0, b8p1 ^ b16p1}: index i
// is the channel pair of registers j with (K) j >> 1 == i, (V) j & 1 == i.
__device__ __forceinline__ void build_consts(Cst* cst, const unsigned char* k8, const unsigned char* k16,
                                             const unsigned char* v8, const unsigned char* v16) {
  for (int idx = threadIdx.x; idx < 2 * KS * 32; idx += blockDim.x) {
    const int kind = idx / (KS * 32), s = (idx / 32) % KS, lane = idx % 32, g = lane >> 2, t = lane & 3;
    u32 r[4];
    for (int i = 0; i < 2; ++i) {
      u32 b8, b16;
      if (kind == 0) {
        const int c = 16 * s + 2 * t + 8 * i;
        b8 = gaac_v3::pair_const(k8[c], k8[c + 1]);
        b16 = gaac_v3::pair_const(k16[c], k16[c + 1]);
      } else {
        const int c = 16 * s + g + 8 * i;
        b8 = gaac_v3::pair_const(v8[c], v8[c]);
        b16 = gaac_v3::pair_const(v16[c], v16[c]);
      }
      r[i] = FMT4 ? b16 : b8;  // F4: one window per channel, base16
      r[2 + i] = FMT4 ? 0u : b8 ^ b16;
    }
#if FMT4
    cst[idx] = make_uint2(r[0], r[1]);
#else
    cst[idx] = make_uint4(r[0], r[1], r[2], r[3]);
#endif
  }
}

// One lane's view of a staged compressed tile: its words in registers, its side-area offsets.
// RAW: the tile lists raw groups (a warp-uniform choice made per tile from both kinds' headers); a lane
// holds at most 2 of them (the encoder stores a tile with more as BF16), found once in load().
// What both lane layouts hold: the lane, its kind's constants, and its sign/mantissa words of a staged tile
// (uint4 u of lane l at u * 512 + 16 l).
struct SmPlane {
  uint4 sm[NP / 8];
  const Cst* cst;  // this kind's constants, [KS][32]
  int lane;
  __device__ __forceinline__ void load_sm(const unsigned char* tb, const Cst* cst_kind, int lane_) {
    lane = lane_;
    cst = cst_kind;
#pragma unroll
    for (int u = 0; u < NP / 8; ++u) sm[u] = *reinterpret_cast<const uint4*>(tb + u * 512 + lane * 16);
  }
  __device__ __forceinline__ u32 smw(int q) const {  // the word holding pair q
    const uint4 v = sm[q >> 3];
    const int k = (q >> 1) & 3;
    return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
  }
};

#if FMT4
// F4 (format4.py): every group 4-bit or raw; pair j of group s = bitsel(SIGN_MANT, PRMT(sm), base16 pair +
// (rotr(w_s, 4 j) & 0x07800780) [+ (rotr(hi_s, 4 j) & 0x78007800) for a raw group]). No mask, no h bytes.
template <bool IS_V, bool RAW>
struct LaneTile : SmPlane {
  uint4 cw4[KS / 4];
  u32 rs0, nib0;  // RAW: this lane's raw group of this kind (s, high-nibble word); s = 0xFF when none

  __device__ __forceinline__ void load(const unsigned char* tb, const Cst* cst_kind, int lane_) {
    load_sm(tb, cst_kind, lane_);
#pragma unroll
    for (int u = 0; u < KS / 4; ++u) cw4[u] = *reinterpret_cast<const uint4*>(tb + CODE_OFF + u * 512 + lane * 16);
    rs0 = 0xFFu;
    nib0 = 0u;
    if (RAW) {  // all 3 record slots, unconditionally (8-byte aligned); the encoder allows one per lane
      const unsigned char* side = tb + SIDE_OFF;
      const u32 n_raw = side[0];
#pragma unroll
      for (u32 r = 0; r < 3; ++r) {
        const uint2 rec = *reinterpret_cast<const uint2*>(side + 8 + 8 * r);
        const bool hit = r < n_raw && (rec.y & 0xFFu) == static_cast<u32>(lane);
        rs0 = hit ? (rec.y >> 8) & 0xFFu : rs0;
        nib0 = hit ? rec.x : nib0;
      }
    }
  }

  __device__ __forceinline__ void group(int s, u32 (&a)[4]) const {
    const uint2 c4 = cst[s * 32 + lane];
    const uint4 wv = cw4[s >> 2];
    const u32 w = (s & 3) == 0 ? wv.x : (s & 3) == 1 ? wv.y : (s & 3) == 2 ? wv.z : wv.w;
#if WIDE_FIX
    const u32 hw = RAW && static_cast<u32>(s) == rs0 ? nib0 : 0u;
#else
    const u32 hw = 0u;
#endif
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int q = 4 * s + j;
      const u32 x = gaac_f4::sm_bits<FMT4 == 2>(smw(q), q);  // FMT4 2: sign/mantissa words (format4i.py)
      const int i = IS_V ? (j & 1) : (j >> 1);
      a[j] = gaac_f4::pair<RAW && WIDE_FIX>(x, w, hw, i ? c4.y : c4.x, j);
    }
  }
};
#else
template <bool IS_V, bool RAW>
struct LaneTile : SmPlane {
  u32 cw[NW];
  u32 mask, hpos;
  u32 rs0, rs1, nib0, nib1;  // RAW: this lane's raw groups (s, code bits 4-7); s = 0xFF when none
  const unsigned char* side;

  __device__ __forceinline__ void load(const unsigned char* tb, const Cst* cst_kind, int lane_) {
    load_sm(tb, cst_kind, lane_);
#pragma unroll
    for (int w = 0; w < NW; ++w) cw[w] = *reinterpret_cast<const u32*>(tb + CODE_OFF + w * 128 + lane * 4);
    side = tb + SIDE_OFF;
    mask = side[lane];
    // exclusive prefix count of the wide groups of lower lanes: where this lane's h bytes start
    const u32 mine = __popc(mask);
    u32 x = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const u32 y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    hpos = 36 + x - mine;
    rs0 = rs1 = 0xFFu;
    nib0 = nib1 = 0u;
    if (RAW) {
      const u32 hdr = *reinterpret_cast<const u32*>(side + 32);
      const u32 n_raw = (hdr >> 8) & 0xFF, raw_at = (36 + (hdr & 0xFF) + 3) & ~3u;
      for (u32 r = 0; r < n_raw; ++r) {
        // records are 4-byte aligned only (raw_at = round4(36 + n_h)): two 32-bit loads, not one 64-bit
        const u32* rp = reinterpret_cast<const u32*>(side + raw_at + 8 * r);
        const uint2 rec = make_uint2(rp[0], rp[1]);
        if ((rec.y & 0xFFu) == static_cast<u32>(lane)) {
          if (rs0 == 0xFFu) {
            rs0 = (rec.y >> 8) & 0xFFu;
            nib0 = rec.x;
          } else {
            rs1 = (rec.y >> 8) & 0xFFu;
            nib1 = rec.x;
          }
        }
      }
    }
  }

  // group s -> the 4 A-fragment registers of k-step / m-tile s
  __device__ __forceinline__ void group(int s, u32 (&a)[4]) const {
    const uint4 c4 = cst[s * 32 + lane];
#if WIDE_FIX
    const u32 wide = (mask >> s) & 1u;
    // this group's h byte: independent of the other groups' (no running offset), so the loads issue early
    const u32 hbyte = wide ? side[hpos + __popc(mask & ((1u << s) - 1u))] : 0u;
    const u32 hh = (hbyte & 0xFu) | ((hbyte & 0xF0u) << 12);
    const u32 wm = 0u - wide;
#else
    const u32 hh = 0u, wm = 0u;
#endif
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int q = 4 * s + j;
      const u32 x = gaac_v3::prmt(smw(q), 0, (q & 1) ? 0x3322u : 0x1100u);
      const u32 f = gaac_v3::pair_field(cw[(q >> 4) * 3], cw[(q >> 4) * 3 + 1], cw[(q >> 4) * 3 + 2], q & 15);
      const int i = IS_V ? (j & 1) : (j >> 1);
      const u32 b8p = i ? c4.y : c4.x, x16 = i ? c4.w : c4.z;
      const u32 base = b8p ^ (x16 & wm);
      const u32 hb = ((hh >> j) & 0x00010001u) << 10;
      a[j] = gaac_v3::bitsel(gaac_v3::SIGN_MANT, x, base + f + hb);
    }
#if WIDE_FIX
    if (RAW) {  // code bits 4-7 of a raw group (zero for every other group: then a no-op)
      const u32 nib = static_cast<u32>(s) == rs0 ? nib0 : (static_cast<u32>(s) == rs1 ? nib1 : 0u);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const u32 t = (a[j] & gaac_v3::EXP_BITS) + (((nib >> (4 * j)) & 0x000F000Fu) << 11);
        a[j] = gaac_v3::bitsel(gaac_v3::SIGN_MANT, a[j], t);
      }
    }
#endif
  }
};
#endif  // FMT4

// Pair coordinates (row, col of the low value) of register j of k-step s of this lane
__device__ __forceinline__ void pair_rc(bool is_v, int lane, int s, int j, int& row, int& col) {
  const int g = lane >> 2, t = lane & 3;
  if (!is_v) {
    row = g + 8 * (j & 1);
    col = 16 * s + 2 * t + 8 * (j >> 1);
  } else {
    row = 2 * t + 8 * (j >> 1);
    col = 16 * s + g + 8 * (j & 1);
  }
}

// Fragments of a BF16 tile in global memory (raw blocks, the tail): rows [0, 16) at `rows`, row stride D.
// V rows outside [lo - tok0, hi - tok0) read as zeros (as the twin stages them).
__device__ __forceinline__ void bf16_group(const u16* rows, bool is_v, int lane, int s, int vlo, int vhi, u32 (&a)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    int r, c;
    pair_rc(is_v, lane, s, j, r, c);
    if (!is_v) {
      a[j] = __ldg(reinterpret_cast<const u32*>(rows + r * D + c));
    } else {
      const u32 lo16 = (r >= vlo && r < vhi) ? __ldg(rows + r * D + c) : 0u;
      const u32 hi16 = (r + 1 >= vlo && r + 1 < vhi) ? __ldg(rows + (r + 1) * D + c) : 0u;
      a[j] = lo16 | (hi16 << 16);
    }
  }
}

// zero the V values of rows outside [vlo, vhi) (tiles at a split's or a sequence's edge)
__device__ __forceinline__ void mask_v(int lane, int vlo, int vhi, u32 (&a)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    int r, c;
    pair_rc(true, lane, 0, j, r, c);
    const u32 m = ((r >= vlo && r < vhi) ? 0x0000FFFFu : 0u) | ((r + 1 >= vlo && r + 1 < vhi) ? 0xFFFF0000u : 0u);
    a[j] &= m;
  }
}

struct Src {
  const unsigned char* comp;  // compressed tile, or null
  const u16* bf16;            // BF16 rows of the tile (raw block or tail) when comp is null
};
__device__ __forceinline__ Src tile_src(const unsigned char* pool, const u16* raw, const u16* tail, const int* table,
                                        int nb, int tok0) {
  const int blk = tok0 / T, r0 = tok0 % T;
  if (blk < nb) {
    const int e = __ldg(table + blk);
    if (e >= 0) return {pool + static_cast<i64>(e) * BLOCK_BYTES + (r0 / 16) * TB, nullptr};
    return {nullptr, raw + (static_cast<i64>(~e) * T + r0) * D};
  }
  return {nullptr, tail + r0 * D};
}

__device__ __forceinline__ void issue(unsigned char* slot, Src ks, Src vs, unsigned long long* bar, int lane) {
  if (lane == 0) {
    const u32 bytes = (ks.comp ? TB : 0) + (vs.comp ? TB : 0);
    mbar_arrive_expect_tx(bar, bytes);
    if (ks.comp) bulk_copy_g2s(slot, ks.comp, TB, bar);
    if (vs.comp) bulk_copy_g2s(slot + TB, vs.comp, TB, bar);
  }
}

// Attend to one warp-tile whose K and V tiles are both compressed and staged at sl (K) / sl + TB (V).
// EDGE: a tile at a split's or the sequence's edge (V rows outside [vlo, vhi) zeroed, as the twin stages them).
// Every tile kind is its own straight-line instantiation (compressed / mixed / BF16 are chosen per tile
// outside): one body with run-time branches between the kinds kept both kinds' state live and cost the
// kernel 45 registers (153 vs 108, session 17), i.e. a CTA per SM.
template <bool RAW, bool EDGE = false>
__device__ __forceinline__ void compressed_tile(attend::WarpState& st, const unsigned char* sl, const Cst* cst, int tok0,
                                                int lo, int hi, int lane, float scale_log2, int vlo = 0, int vhi = 16) {
  LaneTile<false, RAW> kl;
  LaneTile<true, RAW> vl;
  st.rows_from(
      [&](int k, u32 (&a)[4]) {
        if (k == 0) kl.load(sl, cst, lane);  // each kind's words are read when its first fragment is needed
        kl.group(k, a);
      },
      [&](int m, u32 (&a)[4]) {
        if (m == 0) vl.load(sl + TB, cst + KS * 32, lane);
        vl.group(m, a);
        if (EDGE) mask_v(lane, vlo, vhi, a);
      },
      tok0, lo, hi, lane, scale_log2);
}

// A warp-tile with at least one kind stored BF16 (a block that did not fit, or the tail): KC / VC say which
// kinds are compressed (staged in the slot); BF16 kinds are read from global memory.
template <bool KC, bool VC>
__device__ __forceinline__ void mixed_tile(attend::WarpState& st, const unsigned char* sl, const Cst* cst, Src ks, Src vs,
                                           int tok0, int lo, int hi, int vlo, int vhi, bool edge, int lane,
                                           float scale_log2) {
  LaneTile<false, true> kl;
  LaneTile<true, true> vl;
  st.rows_from(
      [&](int k, u32 (&a)[4]) {
        if (KC) {
          if (k == 0) kl.load(sl, cst, lane);
          kl.group(k, a);
        } else {
          bf16_group(ks.bf16, false, lane, k, vlo, vhi, a);
        }
      },
      [&](int m, u32 (&a)[4]) {
        if (VC) {
          if (m == 0) vl.load(sl + TB, cst + KS * 32, lane);
          vl.group(m, a);
          if (edge) mask_v(lane, vlo, vhi, a);
        } else {
          bf16_group(vs.bf16, true, lane, m, vlo, vhi, a);
        }
      },
      tok0, lo, hi, lane, scale_log2);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS, MIN_CTAS_PER_SM)
regtile_decode_split(const u16* __restrict__ q,            // [B, Hkv*G, D]
                     const unsigned char* __restrict__ k_pool, const unsigned char* __restrict__ v_pool,
                     const u16* __restrict__ k_raw, const u16* __restrict__ v_raw,  // [n, 64, D]
                     const int* __restrict__ k_table, const int* __restrict__ v_table,  // [B, Hkv, max_blocks]
                     const u16* __restrict__ k_tail, const u16* __restrict__ v_tail,    // [B, Hkv, 64, D]
                     const unsigned char* __restrict__ k_b8, const unsigned char* __restrict__ k_b16,  // [Hkv, D]
                     const unsigned char* __restrict__ v_b8, const unsigned char* __restrict__ v_b16,
                     const int* __restrict__ num_blocks, const int* __restrict__ tail_len,
                     const int* __restrict__ kv_start, float* __restrict__ part_o, float* __restrict__ part_lse,
                     u16* __restrict__ out, int* __restrict__ counters, int hkv, int max_blocks, int tokens_per_split,
                     float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem[];
  Cst* cst = reinterpret_cast<Cst*>(smem);                  // [2][KS][32]
  unsigned char* ring = smem + CONST_BYTES;                      // [W][S][2][TB]
  __shared__ __align__(8) unsigned long long bars[W * S];

  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z, splits = gridDim.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int hq0 = h * GROUP, hq_total = hkv * GROUP;
  const attend::SplitRange rg = attend::split_range(num_blocks, tail_len, kv_start, b, split, tokens_per_split, T, TILE);
  const int nb = rg.nb, lo = rg.lo, hi = rg.hi, first = rg.first, n_tiles = rg.n_tiles;
  const i64 bh = static_cast<i64>(b) * hkv + h;
  const int* kt = k_table + bh * max_blocks;
  const int* vt = v_table + bh * max_blocks;
  const u16* ktail = k_tail + bh * T * D;
  const u16* vtail = v_tail + bh * T * D;

  build_consts(cst, k_b8 + h * D, k_b16 + h * D, v_b8 + h * D, v_b16 + h * D);
  unsigned long long* wbar = bars + warp * S;
  if (lane == 0)
    for (int s = 0; s < S; ++s) mbar_init(wbar + s, 1);
  fence_proxy_async();
  __syncthreads();  // constants built, barriers initialised

  unsigned char* wring = ring + warp * S * 2 * TB;
  const int wrow = warp * 16;
  attend::WarpState st;
  st.init();
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    const int t = first + s * TILE + wrow;
    if (s < n_tiles) issue(wring + s * 2 * TB, tile_src(k_pool, k_raw, ktail, kt, nb, t), tile_src(v_pool, v_raw, vtail, vt, nb, t),
                           wbar + s, lane);
  }
  st.load_q(q + (static_cast<i64>(b) * hq_total + hq0) * D, lane);

  for (int it = 0; it < n_tiles; ++it) {
    const int slot = it % S;
    mbar_wait(wbar + slot, (it / S) & 1);
    {
      const int nx = it + S - 1;
      if (nx < n_tiles) {
        __syncwarp();  // every lane's reads of the slot refilled now are done (it finished last iteration)
        fence_proxy_async();
        const int t = first + nx * TILE + wrow;
        issue(wring + (nx % S) * 2 * TB, tile_src(k_pool, k_raw, ktail, kt, nb, t),
              tile_src(v_pool, v_raw, vtail, vt, nb, t), wbar + nx % S, lane);
      }
    }
    const int tok0 = first + it * TILE + wrow;
    const Src ks = tile_src(k_pool, k_raw, ktail, kt, nb, tok0), vs = tile_src(v_pool, v_raw, vtail, vt, nb, tok0);
    const unsigned char* sl = wring + slot * 2 * TB;
    const int vlo = lo - tok0, vhi = hi - tok0;
    const bool edge = vlo > 0 || vhi < 16;
#ifdef SASS_FAST_ONLY  // static instruction counts of one tile body (analysis builds only; wrong for other tiles)
    compressed_tile<SASS_FAST_ONLY == 2>(st, sl, cst, tok0, lo, hi, lane, scale_log2);
    if (true) {
    } else if (false) {
#else
    if (ks.comp && vs.comp && !edge) {
#endif
      // the common case: both tiles compressed; one straight-line body per tile (no branch per k-step),
      // with the raw-group fix compiled in only for tiles that list raw groups
      const u32 nraw = (*reinterpret_cast<const u32*>(sl + SIDE_OFF + NRAW_AT) |
                        *reinterpret_cast<const u32*>(sl + TB + SIDE_OFF + NRAW_AT)) & NRAW_MASK;
      if (nraw == 0) compressed_tile<false>(st, sl, cst, tok0, lo, hi, lane, scale_log2);
      else compressed_tile<true>(st, sl, cst, tok0, lo, hi, lane, scale_log2);
    } else if (ks.comp && vs.comp) {
      compressed_tile<true, true>(st, sl, cst, tok0, lo, hi, lane, scale_log2, vlo, vhi);
    } else if (ks.comp) {
      mixed_tile<true, false>(st, sl, cst, ks, vs, tok0, lo, hi, vlo, vhi, edge, lane, scale_log2);
    } else if (vs.comp) {
      mixed_tile<false, true>(st, sl, cst, ks, vs, tok0, lo, hi, vlo, vhi, edge, lane, scale_log2);
    } else {
      mixed_tile<false, false>(st, sl, cst, ks, vs, tok0, lo, hi, vlo, vhi, edge, lane, scale_log2);
    }
  }
  __syncthreads();
  attend::finish(st, smem, attend::Output{part_o, part_lse, out, counters, static_cast<i64>(b) * hq_total + hq0, bh,
                                          split, splits});
}

// Decode check: every tile of a pool (n_tiles = 4 x blocks) rebuilt by the same LaneTile code and written
// in natural layout, out bf16 [n_tiles, 16, D]. One warp per tile; is_v selects the kind's mapping.
extern "C" __global__ void __launch_bounds__(THREADS)
regtile_dump(const unsigned char* __restrict__ pool, const unsigned char* __restrict__ b8,
             const unsigned char* __restrict__ b16, int n_tiles, int is_v, u16* __restrict__ out) {
  extern __shared__ __align__(128) unsigned char smem[];
  Cst* cst = reinterpret_cast<Cst*>(smem);
  unsigned char* ring = smem + CONST_BYTES;
  __shared__ __align__(8) unsigned long long bars[W];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  build_consts(cst, b8, b16, b8, b16);
  if (lane == 0) mbar_init(bars + warp, 1);
  fence_proxy_async();
  __syncthreads();
  const int tile = blockIdx.x * W + warp;
  if (tile >= n_tiles) return;
  unsigned char* sl = ring + warp * TB;
  if (lane == 0) {
    mbar_arrive_expect_tx(bars + warp, TB);
    bulk_copy_g2s(sl, pool + static_cast<i64>(tile) * TB, TB, bars + warp);
  }
  mbar_wait(bars + warp, 0);
  u16* o = out + static_cast<i64>(tile) * 16 * D;
  auto put = [&](bool v, int s, const u32 (&a)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int r, c;
      pair_rc(v, lane, s, j, r, c);
      if (!v) {
        o[r * D + c] = a[j] & 0xFFFF;
        o[r * D + c + 1] = a[j] >> 16;
      } else {
        o[r * D + c] = a[j] & 0xFFFF;
        o[(r + 1) * D + c] = a[j] >> 16;
      }
    }
  };
  if (is_v) {
    LaneTile<true, true> lt;
    lt.load(sl, cst + KS * 32, lane);
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      u32 a[4];
      lt.group(s, a);
      put(true, s, a);
    }
  } else {
    LaneTile<false, true> lt;
    lt.load(sl, cst, lane);
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      u32 a[4];
      lt.group(s, a);
      put(false, s, a);
    }
  }
}
