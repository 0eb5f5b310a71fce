// Fused GAAC decode attention over format v4 blocks (gaac_hf/format/v4.py), split-KV, on Hopper.
//
// Register tiles: one warp role. Every warp owns 16 rows of each pipeline step, as in the BF16 kernel
// (decode_attention.cu): lane 0 bulk-copies the step's compressed K and V tiles (16 tokens each) into the
// warp's own shared-memory slot (the copy engine, completing on the slot's mbarrier); each lane then reads
// its own words with vector LDS and rebuilds its m16n8k16 A fragments in registers (format v4 puts a lane's
// bytes together) and feeds them to attend::WarpState::rows_from, the arithmetic the BF16 twin runs on
// ldmatrix fragments: for the same warps and splits the output is bit-identical to the twin's
// (tests/test_v4_gpu.py). No producer warps, no decoded ring, no barrier between roles.
// Design followed: Marlin's "weights pre-shuffled offline into MMA fragment order, dequantised in registers";
// our own layout and code. The pair bit logic is gaac_v4/pair.cuh (one copy, g++-tested on the host).
// Why this shape (lab/cuda-decode-notebook.md, calls R1-R4): the v3 kernel's producer/consumer pipeline ran
// at 0.8x cuDNN, limited by per-tile latency chains; register tiles with fixed 4-bit lanes (~4.75 ALU ops per
// pair) run at 1.19x cuDNN at Qwen3-8B B=1 64K.
//
// Pool addressing (the v3 pool's): block-table entries are int64 byte offsets into one byte pool, | 1 for a
// block stored as BF16 (row-major [PAGE, D]); the incomplete last block is the BF16 tail.
// Defines: HEAD_DIM (64, 128, 256), QUERY_GROUP (1..16), PAGE (tokens per block, a multiple of 16), WARPS, STAGES
// (>= 2, copies in flight per warp + 1), MIN_CTAS_PER_SM (the register cap the planner sized the grid for), CONST_REGS.
// Analysis builds only: GAAC_SASS_TILE_ONLY = 1 / 2 compiles the loop with the compressed tile body alone
// (without / with raw groups) for static instruction counts (eval/sass_v4.py); its results are wrong.
#include "gaac_v3/core.cuh"  // first: its GROUP constant (8 channels) collides with the query-group define
#ifdef GROUP
#error "pass the query heads per kv head as QUERY_GROUP (GROUP collides with core.cuh)"
#endif
#define GROUP QUERY_GROUP
#include "gaac/ptx.cuh"
#include "gaac/attend.cuh"
#include "gaac_v4/pair.cuh"

#ifndef MIN_CTAS_PER_SM
#define MIN_CTAS_PER_SM 1
#endif
#ifndef STAGES
#define STAGES 2
#endif
#ifndef PAGE
#define PAGE 64
#endif
// CONST_REGS: hold both kinds' base16 pair constants in registers for the whole split instead of reading them
// from shared memory in every group (d = 128: 561 -> 537 instructions and 28 -> 12 LDS per warp-tile, +40
// registers; the planner sets it where the register cap leaves room). Reading V's words early (in attend.cuh's
// after_k hook, before the softmax) was tried: ptxas already hoists them, the SASS was identical.
#ifndef CONST_REGS
#define CONST_REGS 0
#endif
// COMPACT_SLOTS: a warp's slot of each kind holds one compressed tile (TB bytes) instead of the larger of that and
// 16 BF16 rows (32 D bytes), so more warps or CTAs fit: at d = 256, 8 warps x 2 stages need 206 KB instead of
// 270 KB (too many), 2 CTAs of 4 warps 2 x 107 KB. A tile with a kind stored as BF16 (a BF16 block, the tail) then
// stages K alone at the slot pair's start (a BF16 K tile spans both slots) and copies V over it once K's fragments
// are consumed (one more copy latency on those tiles only; the twin's arithmetic and bits are unchanged).
// The planner sets it where the full slots do not fit the launch (fused_attention_v4.plan).
#ifndef COMPACT_SLOTS
#define COMPACT_SLOTS 0
#endif
namespace {
using namespace gaac;
using attend::D;
using attend::W;
using attend::THREADS;
constexpr int T = PAGE;
constexpr int S = STAGES;
constexpr int TILE = 16 * W;
constexpr gaac_v4::TileGeom GEO = gaac_v4::tile_geom(D);
constexpr int NP = GEO.NP, KS = GEO.KS, CODE_OFF = GEO.CODE_OFF, SIDE_OFF = GEO.SIDE_OFF, TB = GEO.TB;
constexpr i64 ENTRY_RAW = 1, ENTRY_ALIGN = 16;
constexpr int CONST_BYTES = 2 * KS * 32 * static_cast<int>(sizeof(uint2));
// A warp's slot holds one tile of each kind: compressed (TB bytes) or BF16 (16 rows of D, 32 D bytes: a block
// stored as BF16 or the tail, staged by the same bulk copy and read with ldmatrix).
constexpr int BF16_TILE = 32 * D;
constexpr int SLOT_KIND = COMPACT_SLOTS ? TB : (TB > BF16_TILE ? TB : BF16_TILE);
static_assert(2 * SLOT_KIND >= BF16_TILE, "a BF16 tile must fit a warp's slot pair");
static_assert(D % 64 == 0 && D <= 256, "the v4 kernel takes head_dim 64, 128, 192 or 256 (format v4 lays out multiples of 64)");
static_assert(T % 16 == 0 && T >= 16, "PAGE must be a multiple of 16");
static_assert(S >= 2, "STAGES must be >= 2");
static_assert(TB % 16 == 0, "tiles are 16-byte multiples");

// Per-lane base16 pair constants of both kinds, [2][KS][32] uint2: entry i is the channel pair of the
// lane's registers j with (K) j >> 1 == i, (V) j & 1 == i (a V register holds one channel of two tokens).
// Every byte load is issued before the first use: a loop of one entry per thread per round waited out one
// L2/DRAM latency per round (d = 256, 4 warps: 8 rounds; ncu call Y8: 10% of the kernel's stall samples at Gemma3
// B=1 64K sat on those loads; the change: Gemma3 B=1 16K 24.66 -> 23.06 us, 64K 41.71 -> 40.50 on the H100, d = 128 / 64
// unchanged, lab/results/y12_session28/consts_h100.json).
constexpr int N_CONST = 2 * KS * 32, CONST_ROUNDS = (N_CONST + THREADS - 1) / THREADS;
// The constants' bytes of one CTA, loaded (load) and turned into pair constants in shared memory (store): split so
// that EARLY_LOADS can issue the loads at the kernel's entry and store after the first copies are out.
struct ConstBytes {
  u32 b[CONST_ROUNDS][2][2];  // [round][i][low / high byte of the pair]
  __device__ __forceinline__ void load(const unsigned char* k16, const unsigned char* v16) {
#pragma unroll
    for (int r = 0; r < CONST_ROUNDS; ++r) {
      const int idx = threadIdx.x + r * THREADS;
      const int kind = idx / (KS * 32), s = (idx / 32) % KS, lane = idx % 32, g = lane >> 2, t = lane & 3;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        b[r][i][0] = b[r][i][1] = 0u;
        if (idx < N_CONST) {
          const int c = kind == 0 ? 16 * s + 2 * t + 8 * i : 16 * s + g + 8 * i;
          const unsigned char* src = kind == 0 ? k16 + c : v16 + c;
          b[r][i][0] = __ldg(src);
          b[r][i][1] = __ldg(src + (kind == 0 ? 1 : 0));  // K: the pair's two channels; V: one channel twice
        }
      }
    }
  }
  __device__ __forceinline__ void store(uint2* cst) const {
#pragma unroll
    for (int r = 0; r < CONST_ROUNDS; ++r) {
      const int idx = threadIdx.x + r * THREADS;
      if (idx < N_CONST)
        cst[idx] = make_uint2(gaac_v3::pair_const(b[r][0][0], b[r][0][1]), gaac_v3::pair_const(b[r][1][0], b[r][1][1]));
    }
  }
};

// One lane's view of a staged compressed tile: its sign/mantissa and code words in registers and, for a tile
// that lists raw groups (RAW), its one raw group of this kind (the encoder stores a tile with more as BF16).
// At head_dim > 128 a lane's words do not fit the registers beside the softmax state: there each group's words
// are read from shared memory when the group is decoded (d = 256: 175 registers with up to 8 query heads per kv
// head; 16 spill, and the launcher refuses them). 192 builds too, but the launcher takes 64, 128, 256.
constexpr bool LAZY = D > 128;
template <bool IS_V, bool RAW>
struct LaneTile {
  uint4 sm[LAZY ? 1 : NP / 8];
  uint4 cw4[LAZY ? 1 : KS / 4];
  const unsigned char* tb;  // LAZY: the staged tile
  int lane;
  u32 rs0, nib0;     // RAW: the lane's raw group (k-step, high-nibble word); k-step 0xFF when none

  __device__ __forceinline__ void load(const unsigned char* tb_, int lane_) {
    lane = lane_;
    tb = tb_;
    if (!LAZY) {
#pragma unroll
      for (int u = 0; u < NP / 8; ++u) sm[u] = *reinterpret_cast<const uint4*>(tb + u * 512 + lane * 16);
#pragma unroll
      for (int u = 0; u < KS / 4; ++u) cw4[u] = *reinterpret_cast<const uint4*>(tb + CODE_OFF + u * 512 + lane * 16);
    }
    rs0 = 0xFFu;
    nib0 = 0u;
    if (RAW) {  // all record slots, unconditionally (8-byte aligned loads); at most one per lane
      const unsigned char* side = tb + SIDE_OFF;
      const u32 n_raw = side[0];
#pragma unroll
      for (u32 r = 0; r < gaac_v4::MAX_RAW_TILE; ++r) {
        const uint2 rec = *reinterpret_cast<const uint2*>(side + gaac_v4::RAW_AT + 8 * r);
        const bool hit = r < n_raw && (rec.y & 0xFFu) == static_cast<u32>(lane);
        rs0 = hit ? (rec.y >> 8) & 0xFFu : rs0;
        nib0 = hit ? rec.x : nib0;
      }
    }
  }

  __device__ __forceinline__ u32 smw(int q) const {  // the word holding pair q
    const uint4 v = sm[q >> 3];
    const int k = (q >> 1) & 3;
    return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
  }

  // the four A-fragment registers of k-step (K) / m-tile (V) s, with its base16 pair constants c4
  __device__ __forceinline__ void group(int s, u32 (&a)[4], uint2 c4) const {
    u32 w;
    uint2 smg;  // LAZY: the group's two sign/mantissa words (pairs 4s..4s+3)
    if (LAZY) {
      w = *reinterpret_cast<const u32*>(tb + CODE_OFF + (s >> 2) * 512 + lane * 16 + (s & 3) * 4);
      smg = *reinterpret_cast<const uint2*>(tb + (s >> 1) * 512 + lane * 16 + (s & 1) * 8);
    } else {
      const uint4 wv = cw4[s >> 2];
      w = (s & 3) == 0 ? wv.x : (s & 3) == 1 ? wv.y : (s & 3) == 2 ? wv.z : wv.w;
    }
    const u32 hw = RAW && static_cast<u32>(s) == rs0 ? nib0 : 0u;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int q = 4 * s + j;
      const u32 x = gaac_v4::sm_bits(LAZY ? ((j >> 1) ? smg.y : smg.x) : smw(q), q);
      const int i = IS_V ? (j & 1) : (j >> 1);
      a[j] = gaac_v4::pair<RAW>(x, w, hw, i ? c4.y : c4.x, j);
    }
  }
};

// Fragments of a BF16 tile staged in the slot (row-major, row stride D, as the bulk copy lays it): K as the A
// operand, V^T through ldmatrix.trans, with the twin's lane addressing (attend::WarpState::rows); the values are
// the twin's, so the MMAs see the same fragments. Rows at stride 2 D bytes share banks (8-way conflicts): these
// tiles are the rare ones (blocks stored as BF16, the tail).
__device__ __forceinline__ void bf16_group(const unsigned char* tile, bool is_v, int lane, int s, u32 (&a)[4]) {
  const u16* rows = reinterpret_cast<const u16*>(tile);
  if (!is_v) {
    const int row = (lane & 7) + ((lane >> 3) & 1) * 8, col = (lane >> 4) * 8;
    ldmatrix_x4(a, rows + row * D + 16 * s + col);
  } else {
    const int row = (lane & 7) + (lane >> 4) * 8, col = ((lane >> 3) & 1) * 8;
    ldmatrix_x4_trans(a, rows + row * D + 16 * s + col);
  }
}

// zero the V values of rows outside [vlo, vhi) (tiles at a split's or a sequence's edge)
__device__ __forceinline__ void mask_v(int lane, int vlo, int vhi, u32 (&a)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    int r, c;
    gaac_v4::pair_rc(true, lane, 0, j, r, c);
    const u32 m = ((r >= vlo && r < vhi) ? 0x0000FFFFu : 0u) | ((r + 1 >= vlo && r + 1 < vhi) ? 0xFFFF0000u : 0u);
    a[j] &= m;
  }
}

// Where a group's base16 pair constants come from: shared memory ([2][KS][32] uint2), or registers loaded from
// there once per split (CONST_REGS).
struct Consts {
  const uint2* smem;
  uint2 reg[CONST_REGS ? 2 : 1][CONST_REGS ? KS : 1];
  __device__ __forceinline__ void init(const uint2* cst, int lane) {
    smem = cst;
    if (CONST_REGS) {
#pragma unroll
      for (int kind = 0; kind < 2; ++kind)
#pragma unroll
        for (int s = 0; s < KS; ++s) reg[CONST_REGS ? kind : 0][CONST_REGS ? s : 0] = cst[(kind * KS + s) * 32 + lane];
    }
  }
  __device__ __forceinline__ uint2 get(int kind, int s, int lane) const {
    return CONST_REGS ? reg[CONST_REGS ? kind : 0][CONST_REGS ? s : 0] : smem[(kind * KS + s) * 32 + lane];
  }
};

struct Src {
  const unsigned char* comp;  // the compressed 16-token tile, or null
  const u16* bf16;            // the tile's BF16 rows (a BF16 block or the tail) when comp is null
};
// hint_blk / hint: an entry of `table` read ahead (SpecEntries), used where the tile lands on that block
__device__ __forceinline__ Src tile_src(const unsigned char* pool, const u16* tail, const i64* table, int nb, int tok0,
                                       int hint_blk = -1, i64 hint = 0) {
  const int blk = tok0 / T, r0 = tok0 % T;
  if (blk < nb) {
    const i64 e = blk == hint_blk ? hint : __ldg(table + blk);
    const unsigned char* at = pool + (e & ~(ENTRY_ALIGN - 1));
    if (e & ENTRY_RAW) return {nullptr, reinterpret_cast<const u16*>(at) + r0 * D};
    return {at + (r0 / 16) * TB, nullptr};
  }
  return {nullptr, tail + r0 * D};
}

#ifndef EARLY_LOADS
#define EARLY_LOADS 1  // on since call Y19 (H100 A/B with SPEC_TABLE, lab/results/v4_ab_h100_y19.json); 0: later
#endif
// EARLY_LOADS=1: the prologue's chains (stamps, lab/results/stamps_buffered_y14_h100.json, Gemma3 B=1 4K: the prologue
// 4.0 us and the first tile staged at 4.1) are lengths -> table entries -> tile copy and lengths -> table entries ->
// copies issued -> Q / constants' loads -> constants stored; both are three DRAM trips. SPEC_TABLE overlaps the
// entries with the lengths, which shortens the first chain only; with EARLY_LOADS the Q / constants' loads go out at
// entry too, so both chains are two trips. Costs registers in the prologue only (the bytes wait in registers until the
// first copies are issued; d = 256 at 4 warps: 32).
#ifndef SPEC_TABLE
#define SPEC_TABLE 1  // on since call Y19 (with EARLY_LOADS: -4% at 16K, +-0.2% at 64K, bit-identical); 0: plain
#endif
// The first window's table entries, read at the split's nominal start (split * tokens_per_split) before the sequence's
// lengths are known: without them the first lookup waits on num_blocks / kv_start and then on the table, two
// dependent DRAM trips before the first copy can be issued. A lane keeps the K and V entries of the block its first
// tile would land on if the split starts where nominal (no left padding past it); fill uses them where the tile does
// land there and reads the table as before where not (tail tiles read no entry at all). Any entry of the row
// [0, max_blocks) may be read; only entries below num_blocks are used. SPEC_TABLE=1 (the default since call Y19) builds
// it; 0 is the plain lookup the GPU tests ran before (its cubins are unchanged by this code, checked by SASS hash).
struct SpecEntries {
  int blk = -1;  // the block the entries belong to; -1: none read
  i64 k = 0, v = 0;
  __device__ __forceinline__ void read(const i64* kt, const i64* vt, int max_blocks, int tok0) {
    if (SPEC_TABLE && tok0 / T < max_blocks) {
      blk = tok0 / T;
      k = __ldg(kt + blk);
      v = __ldg(vt + blk);
    }
  }
};

// This warp's tile sources, a window of 32 tiles at a time: lane j looks up tile base + j once (one coalesced
// table read per 32 tiles instead of a dependent global load per tile on the loop's path: 3-7% faster, call T1
// of lab/cuda-decode-notebook.md session 19) and issues that tile's copies itself when its turn comes; ballots give
// every lane each tile's kinds. Design followed: FlashInfer's paged decode prefetches page indices a step ahead;
// here a lane per tile.
struct Window {
  int base;                       // first tile index of the window (warp-uniform)
  const void* k_src; const void* v_src;  // lane j: tile base + j's staged sources
  u32 k_bytes, v_bytes;
  u32 kc, vc;                     // ballots: tiles of the window whose K / V are compressed
  __device__ __forceinline__ void fill(int base_, const unsigned char* kp, const unsigned char* vp, const u16* ktl,
                                       const u16* vtl, const i64* kt, const i64* vt, int nb, int first, int wrow,
                                       int n_tiles, int lane, const SpecEntries& sp = SpecEntries{}) {
    base = base_;
    const int idx = base + lane;
    Src ks{nullptr, ktl}, vs{nullptr, vtl};
    if (idx < n_tiles) {
      const int t = first + idx * TILE + wrow;
      ks = tile_src(kp, ktl, kt, nb, t, sp.blk, sp.k);
      vs = tile_src(vp, vtl, vt, nb, t, sp.blk, sp.v);
    }
    k_src = ks.comp ? static_cast<const void*>(ks.comp) : ks.bf16;
    v_src = vs.comp ? static_cast<const void*>(vs.comp) : vs.bf16;
    k_bytes = ks.comp ? TB : BF16_TILE;
    v_bytes = vs.comp ? TB : BF16_TILE;
    kc = __ballot_sync(0xFFFFFFFFu, ks.comp != nullptr);
    vc = __ballot_sync(0xFFFFFFFFu, vs.comp != nullptr);
  }
  // tile base + j's copies into `slot`, by lane j (COMPACT_SLOTS: K alone unless both kinds are compressed;
  // V follows in the tile, DeferredV)
  __device__ __forceinline__ void issue(int j, unsigned char* slot, unsigned long long* bar, int lane) const {
    if (lane == j) {
      const bool v_now = !COMPACT_SLOTS || (k_bytes == TB && v_bytes == TB);
      mbar_arrive_expect_tx(bar, k_bytes + (v_now ? v_bytes : 0u));
      bulk_copy_g2s(slot, k_src, k_bytes, bar);
      if (v_now) bulk_copy_g2s(slot + SLOT_KIND, v_src, v_bytes, bar);
    }
  }
};

// COMPACT_SLOTS: the V tile of a warp-tile with a kind stored as BF16, copied over the slot pair once K's fragments
// are consumed (rows_from reads every K fragment before the first V one), on the warp's own barrier.
struct DeferredV {
  unsigned long long* bar;
  u32 phase;
  __device__ __forceinline__ void fetch(unsigned char* sl, const Src& src, int lane) {
    __syncwarp();         // every lane's reads of K in the slot pair are done
    fence_proxy_async();  // ... and ordered before the copy engine's writes
    if (lane == 0) {
      const u32 bytes = src.comp ? TB : BF16_TILE;
      mbar_arrive_expect_tx(bar, bytes);
      bulk_copy_g2s(sl, src.comp ? static_cast<const void*>(src.comp) : static_cast<const void*>(src.bf16), bytes,
                    bar);
    }
    mbar_wait(bar, phase);
    phase ^= 1u;
  }
};

// A warp-tile whose K and V tiles are both compressed, staged at sl (K) / sl + SLOT_KIND (V). EDGE: a tile at a
// split's or the sequence's edge (V rows outside [vlo, vhi) zeroed, as the twin stages them). Every tile kind
// is its own straight-line instantiation, chosen per tile outside: one body with run-time branches between
// kinds kept both kinds' state live (153 registers instead of 108 at d=128, lab notebook session 17).
template <bool RAW, bool EDGE = false>
__device__ __forceinline__ void compressed_tile(attend::WarpState& st, const unsigned char* sl, const Consts& cst, int tok0,
                                                int lo, int hi, int lane, float scale_log2, int vlo = 0, int vhi = 16) {
  LaneTile<false, RAW> kl;
  LaneTile<true, RAW> vl;
  st.rows_from(
      [&](int k, u32 (&a)[4]) {
        if (k == 0) kl.load(sl, lane);  // each kind's words are read when its first fragment is needed
        kl.group(k, a, cst.get(0, k, lane));
      },
      [&](int m, u32 (&a)[4]) {
        if (m == 0) vl.load(sl + SLOT_KIND, lane);
        vl.group(m, a, cst.get(1, m, lane));
        if (EDGE) mask_v(lane, vlo, vhi, a);
      },
      tok0, lo, hi, lane, scale_log2);
}

// A warp-tile with at least one kind stored BF16: KC / VC say which kinds are compressed; both are staged in
// the slot. A BF16 V tile's rows outside [vlo, vhi) are zeroed after the load (the twin zeroes them in staging).
// COMPACT_SLOTS: V is copied to the slot pair's start when its first fragment is needed (dv, vsrc).
template <bool KC, bool VC>
__device__ __forceinline__ void mixed_tile(attend::WarpState& st, unsigned char* sl, const Consts& cst,
                                           int tok0, int lo, int hi, int vlo, int vhi, bool edge, int lane,
                                           float scale_log2, DeferredV& dv, const Src& vsrc) {
  LaneTile<false, true> kl;
  LaneTile<true, true> vl;
  unsigned char* vsl = COMPACT_SLOTS ? sl : sl + SLOT_KIND;
  st.rows_from(
      [&](int k, u32 (&a)[4]) {
        if (KC) {
          if (k == 0) kl.load(sl, lane);
          kl.group(k, a, cst.get(0, k, lane));
        } else {
          bf16_group(sl, false, lane, k, a);
        }
      },
      [&](int m, u32 (&a)[4]) {
        if (COMPACT_SLOTS && m == 0) dv.fetch(sl, vsrc, lane);
        if (VC) {
          if (m == 0) vl.load(vsl, lane);
          vl.group(m, a, cst.get(1, m, lane));
          if (edge) mask_v(lane, vlo, vhi, a);
        } else {
          bf16_group(vsl, true, lane, m, a);
          mask_v(lane, vlo, vhi, a);
        }
      },
      tok0, lo, hi, lane, scale_log2);
}

}  // namespace

// One CTA per (split, kv head, sequence): W warps, each attending to 16 rows per step for every query head
// of the GQA group. Arguments as gaac_hf/kernels/cuda/fused_attention_v4.py documents them.
extern "C" __global__ void __launch_bounds__(THREADS, MIN_CTAS_PER_SM)
gaac_v4_decode_split(const u16* __restrict__ q,                                              // [B, Hkv*G, D]
                     const unsigned char* __restrict__ k_pool, const unsigned char* __restrict__ v_pool,  // [P]
                     const i64* __restrict__ k_table, const i64* __restrict__ v_table,     // [B, Hkv, max_blocks]
                     const u16* __restrict__ k_tail, const u16* __restrict__ v_tail,       // [B, Hkv, T, D]
                     const unsigned char* __restrict__ k_b16, const unsigned char* __restrict__ v_b16,  // [Hkv, D]
                     const int* __restrict__ num_blocks, const int* __restrict__ tail_len,
                     const int* __restrict__ kv_start, float* __restrict__ part_o, float* __restrict__ part_lse,
                     u16* __restrict__ out, int* __restrict__ counters, int hkv, int max_blocks, int tokens_per_split,
                     float scale_log2) {
  pdl_wait();  // GAAC_PDL: q, the tails and the lengths come from the kernels before this one
  extern __shared__ __align__(128) unsigned char smem[];
  uint2* cst = reinterpret_cast<uint2*>(smem);  // [2][KS][32]
  unsigned char* ring = smem + CONST_BYTES;      // [W][S][2][SLOT_KIND]
  __shared__ __align__(8) unsigned long long bars[W * S + (COMPACT_SLOTS ? W : 0)];

  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z, splits = gridDim.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int hq0 = h * GROUP, hq_total = hkv * GROUP;
  const i64 bh = static_cast<i64>(b) * hkv + h;
  const i64* kt = k_table + bh * max_blocks;
  const i64* vt = v_table + bh * max_blocks;
#if EARLY_LOADS  // Q's fragments and the constants' bytes first: nothing they need waits on a load
  attend::WarpState st;
  ConstBytes cb;
  st.load_q(q + (static_cast<i64>(b) * hq_total + hq0) * D, lane);
  cb.load(k_b16 + h * D, v_b16 + h * D);
#endif
  SpecEntries sp;  // issued before the lengths below: the two loads overlap (SpecEntries says why)
  sp.read(kt, vt, max_blocks, split * tokens_per_split + lane * TILE + warp * 16);
  const attend::SplitRange rg = attend::split_range(num_blocks, tail_len, kv_start, b, split, tokens_per_split, T, TILE);
  const int nb = rg.nb, lo = rg.lo, hi = rg.hi, first = rg.first, n_tiles = rg.n_tiles;
  const u16* ktail = k_tail + bh * T * D;
  const u16* vtail = v_tail + bh * T * D;

  stamps::reset();
  stamps::mark(0);
  unsigned long long* wbar = bars + warp * S;
  unsigned char* wring = ring + warp * S * 2 * SLOT_KIND;
  const int wrow = warp * 16;
  // the warp's barriers first, then its first copies, then the CTA's constants: the copies' latency overlaps
  // the constants (each warp's barriers and slots are its own, so a __syncwarp orders them)
  if (lane == 0) {
    for (int s = 0; s < S; ++s) mbar_init(wbar + s, 1);
    if (COMPACT_SLOTS) mbar_init(bars + W * S + warp, 1);
  }
  fence_proxy_async();
  __syncwarp();
  Window win;
  win.fill(0, k_pool, v_pool, ktail, vtail, kt, vt, nb, first, wrow, n_tiles, lane, sp);
  u32 prev_kc = 0u, prev_vc = 0u;  // the previous window's kinds (the current tile lags the issued one by S - 1)
#pragma unroll
  for (int s = 0; s < S - 1; ++s)
    if (s < n_tiles) win.issue(s, wring + s * 2 * SLOT_KIND, wbar + s, lane);
  // Q's fragments, then the constants: both are read-only global loads on the way to the first tile, issued
  // together (ptxas hoisted Q's above the barrier below already; written here, the order does not rest on that)
#if !EARLY_LOADS
  attend::WarpState st;
  st.load_q(q + (static_cast<i64>(b) * hq_total + hq0) * D, lane);
  ConstBytes cb;
  cb.load(k_b16 + h * D, v_b16 + h * D);
#endif
  cb.store(cst);
  __syncthreads();  // constants built
  stamps::mark(1);
  Consts cs;
  cs.init(cst, lane);
  DeferredV dv{bars + W * S + (COMPACT_SLOTS ? warp : 0), 0u};
  // COMPACT_SLOTS: a deferred V tile's source, looked up again (no table read for the tail; one for a BF16 block)
  auto v_again = [&](int tok0) { return COMPACT_SLOTS ? tile_src(v_pool, vtail, vt, nb, tok0) : Src{nullptr, nullptr}; };
  st.init();

  // outer loop: windows of issued tiles (tile it + S - 1 is issued in iteration it); the window's lookup sits
  // outside the per-tile loop, so that loop's body is the per-tile path alone
  int it = 0;
  for (int wb = 0; it < n_tiles; wb += 32) {
    if (wb > 0 && wb < n_tiles) {
      prev_kc = win.kc;
      prev_vc = win.vc;
      win.fill(wb, k_pool, v_pool, ktail, vtail, kt, vt, nb, first, wrow, n_tiles, lane);
    }
    const int it_end = min(n_tiles, wb + 32 - (S - 1));
    for (; it < it_end; ++it) {
      const int slot = it % S;
      const int nx = it + S - 1;
      mbar_wait(wbar + slot, (it / S) & 1);
      if (it == 0) stamps::mark(2);  // GAAC_STAMPS builds only: the first tile staged
      // the refill goes out after this tile's wait (refilling before it, two tiles in flight per warp, was within
      // +-1% on the H100 in two A/Bs of call Y14: lab/results/arrive_release_h100.json)
      if (nx < n_tiles) {
        __syncwarp();  // every lane's reads of the slot refilled now are done (they finished last iteration)
        fence_proxy_async();
        win.issue(nx - win.base, wring + (nx % S) * 2 * SLOT_KIND, wbar + nx % S, lane);
      }
      const int j = it - win.base;  // in (-32, 32): negative in the previous window
      const u32 kc_bits = j >= 0 ? win.kc : prev_kc, vc_bits = j >= 0 ? win.vc : prev_vc;
      const bool k_comp = (kc_bits >> (j & 31)) & 1u, v_comp = (vc_bits >> (j & 31)) & 1u;
      const int tok0 = first + it * TILE + wrow;
      unsigned char* const sl = wring + slot * 2 * SLOT_KIND;
      const int vlo = lo - tok0, vhi = hi - tok0;
      const bool edge = vlo > 0 || vhi < 16;
#ifdef GAAC_SASS_TILE_ONLY
      compressed_tile<GAAC_SASS_TILE_ONLY == 2>(st, sl, cs, tok0, lo, hi, lane, scale_log2);
      if (true) {
      } else if (false) {
#else
      if (k_comp && v_comp && !edge) {
#endif
        // the common case: both tiles compressed, one straight-line body per tile, the raw-group fix compiled
        // in only for tiles that list raw groups (n_raw is the first byte of each side area)
        const u32 nraw = (sl[SIDE_OFF] | sl[SLOT_KIND + SIDE_OFF]);
        if (nraw == 0) compressed_tile<false>(st, sl, cs, tok0, lo, hi, lane, scale_log2);
        else compressed_tile<true>(st, sl, cs, tok0, lo, hi, lane, scale_log2);
      } else if (k_comp && v_comp) {
        compressed_tile<true, true>(st, sl, cs, tok0, lo, hi, lane, scale_log2, vlo, vhi);
      } else if (k_comp) {
        mixed_tile<true, false>(st, sl, cs, tok0, lo, hi, vlo, vhi, edge, lane, scale_log2, dv, v_again(tok0));
      } else if (v_comp) {
        mixed_tile<false, true>(st, sl, cs, tok0, lo, hi, vlo, vhi, edge, lane, scale_log2, dv, v_again(tok0));
      } else {
        mixed_tile<false, false>(st, sl, cs, tok0, lo, hi, vlo, vhi, edge, lane, scale_log2, dv, v_again(tok0));
      }
    }
  }
  stamps::mark(3);
  __syncthreads();
  attend::finish(st, smem, attend::Output{part_o, part_lse, out, counters, static_cast<i64>(b) * hq_total + hq0, bh,
                                          split, splits});
}

// Standalone decoder: the blocks that table `entries` point at, rebuilt by the kernel's own LaneTile code and
// written row-major, out bf16 [N, T, D] (BF16 blocks copied). One warp per 16-token tile; grid
// (ceil(N * T / 16 / W)); base16 uint8 [N, D] per entry. is_v selects the kind's lane mapping.
extern "C" __global__ void __launch_bounds__(THREADS)
gaac_v4_decode_blocks(const unsigned char* __restrict__ pool, const i64* __restrict__ entries,
                      const unsigned char* __restrict__ b16, int n_blocks, int is_v, u16* __restrict__ out) {
  pdl_wait();  // GAAC_PDL (every kernel of a source built with it launches early)
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* ring = smem;                          // [W][TB]
  uint2* cst_all = reinterpret_cast<uint2*>(smem + W * TB);  // [W][KS][32]
  __shared__ __align__(8) unsigned long long bars[W];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int tile = blockIdx.x * W + warp, per_block = T / 16;
  const bool live = tile < n_blocks * per_block;
  const int blk = live ? tile / per_block : 0, r0 = (tile % per_block) * 16;
  const i64 e = live ? entries[blk] : 0;
  const unsigned char* at = pool + (e & ~(ENTRY_ALIGN - 1));
  u16* o = out + (static_cast<i64>(blk) * T + r0) * D;
  if (lane == 0) mbar_init(bars + warp, 1);
  fence_proxy_async();
  __syncwarp();
  if (!live) return;
  if (e & ENTRY_RAW) {  // a block stored as BF16: copy its 16 rows
    const u16* src = reinterpret_cast<const u16*>(at) + r0 * D;
    for (int i = lane; i < 16 * D / 2; i += 32) reinterpret_cast<u32*>(o)[i] = __ldg(reinterpret_cast<const u32*>(src) + i);
    return;
  }
  uint2* cst = cst_all + warp * KS * 32;
  const unsigned char* bb = b16 + static_cast<i64>(blk) * D;
  for (int idx = lane; idx < KS * 32; idx += 32) {
    const int s = idx / 32, l = idx % 32, g = l >> 2, t = l & 3;
    u32 r[2];
    for (int i = 0; i < 2; ++i) {
      const int c = is_v ? 16 * s + g + 8 * i : 16 * s + 2 * t + 8 * i;
      r[i] = gaac_v3::pair_const(bb[c], bb[is_v ? c : c + 1]);
    }
    cst[idx] = make_uint2(r[0], r[1]);
  }
  unsigned char* sl = ring + warp * TB;
  if (lane == 0) {
    mbar_arrive_expect_tx(bars + warp, TB);
    bulk_copy_g2s(sl, at + (r0 / 16) * TB, TB, bars + warp);
  }
  mbar_wait(bars + warp, 0);
  __syncwarp();  // the constants
  auto put = [&](bool v, int s, const u32 (&a)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int r, c;
      gaac_v4::pair_rc(v, lane, s, j, r, c);
      o[r * D + c] = a[j] & 0xFFFF;
      if (!v) o[r * D + c + 1] = a[j] >> 16;
      else o[(r + 1) * D + c] = a[j] >> 16;
    }
  };
  if (is_v) {
    LaneTile<true, true> lt;
    lt.load(sl, lane);
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      u32 a[4];
      lt.group(s, a, cst[s * 32 + lane]);
      put(true, s, a);
    }
  } else {
    LaneTile<false, true> lt;
    lt.load(sl, lane);
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      u32 a[4];
      lt.group(s, a, cst[s * 32 + lane]);
      put(false, s, a);
    }
  }
}
