// One decode step's K and V rows written into a GAAC layer's BF16 tails, in one launch.
//
// Why: a decode step (GAACLayer.update; graph mode: gaac_hf/cache/graphs.py) wrote its token with two
// copies per layer (K, then V): 72 tiny kernels per step of a 36-layer model, each ~2 us of kernel
// and, in a replayed graph, ~2 us of gap. This kernel writes both in one launch and reads the tail
// position from device memory, so a captured graph replays it at every position.
//
// Shapes (elements): k_src, v_src [B, H, 1, D] bf16 with any batch / head strides (views of the
// model's projections), the channel dimension dense; k_tail, v_tail [B, H, T, D] bf16 contiguous;
// pos int64 [1]: the tail position written (0 <= pos < T). Rows move as 16-byte vectors: the
// launcher (tail.py) checks every row start is 16-byte aligned, so strides are given in vectors.
// Grid: one CTA per (b, h) row, blockIdx.x = b * H + h; 2 * D / 8 lanes (K's vectors, then V's).
// The copy is bit-exact by construction (no arithmetic); the GPU test compares it with index_copy_.

#include "gaac/ptx.cuh"  // pdl_wait / pdl_launch_dependents (GAAC_PDL, off by default)

typedef unsigned long long u64;

struct alignas(16) Vec16 {
    unsigned int x, y, z, w;
};

extern "C" __global__ void gaac_tail_append(u64 k_src, u64 v_src, long long k_sb, long long k_sh,
                                            long long v_sb, long long v_sh, Vec16* __restrict__ k_tail,
                                            Vec16* __restrict__ v_tail, int heads, int tail_tokens,
                                            int vecs, const long long* __restrict__ pos) {
    gaac::pdl_wait();                // GAAC_PDL: the K/V rows come from the kernel before this one
    gaac::pdl_launch_dependents();   // the attention kernel that reads these tails may launch now (it waits for us)
    const int row = blockIdx.x;
    const int b = row / heads, h = row - (row / heads) * heads;
    const long long p = *pos;
    if (p < 0 || p >= tail_tokens) __trap();  // as index_copy_'s bounds assert: never write outside the tail
    for (int i = threadIdx.x; i < 2 * vecs; i += blockDim.x) {
        const bool is_v = i >= vecs;
        const int j = is_v ? i - vecs : i;
        const Vec16* src = reinterpret_cast<const Vec16*>(is_v ? v_src : k_src) +
                           (is_v ? b * v_sb + h * v_sh : b * k_sb + h * k_sh);
        Vec16* dst = (is_v ? v_tail : k_tail) + ((long long)row * tail_tokens + p) * vecs;
        dst[j] = src[j];
    }
}
