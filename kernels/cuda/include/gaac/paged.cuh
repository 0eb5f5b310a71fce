// gaac/paged.cuh -- where a token's K/V row lives in the paged cache (one job: addressing).
//
// The layout is the one GAACCache keeps (docs/CACHE.md):
//   table  int32 [B, Hkv, max_blocks]  e = table[b, h, i]; e < 0: block i is raw in raw[~e]
//   raw    bf16  [num_raw, T, D]       complete blocks stored uncompressed
//   tail   bf16  [B, Hkv, T, D]        the incomplete last block; token t of it is position nb*T + t
// Position p of sequence b lies in block p / T; blocks < num_blocks[b] come from the table, block
// num_blocks[b] is the tail. Compressed entries (e >= 0) are never read by the BF16 kernel.
#pragma once
#include "ptx.cuh"

namespace gaac {

template <int T, int D>
struct PagedRows {
  const u16* raw;
  const u16* tail;  // already offset to this (b, h): [T, D]
  const int* table; // already offset to this (b, h): [max_blocks]
  int nb;           // complete blocks of this sequence

  // First element of block `blk`'s [T, D] matrix (raw page or the tail).
  __device__ __forceinline__ const u16* block(int blk) const {
    if (blk < nb) {
      const int e = __ldg(table + blk);
      return raw + static_cast<i64>(~e) * (T * D);
    }
    return tail;
  }
};

}  // namespace gaac
