"""Plan and launch the fused GAAC v4 split-KV decode attention (``decode_attention_v4.cu``), and its
standalone block decoder.

The kernel reads the cache's v4 blocks (:class:`~gaac_hf.kernels.paged.PagedTensorV4`: a byte pool, int64
block-table entries, a BF16 tail, the base16 windows) and rebuilds every lane's MMA fragments in registers
right before the BF16 kernel's own attention arithmetic (``include/gaac/attend.cuh``). For the same warps
and splits its output is bit-identical to :func:`attention.bf16_decode_attention` on the decoded K/V
(``tests/test_v4_gpu.py``); :func:`twin_config` gives the twin's launch.

    out = gaac_decode_attention_v4(q, kv, scale=None, launch=None, out=None)   # kv: PagedKV of PagedTensorV4
    x   = decode_blocks_v4_cuda(pool, entries, base16, geometry, kind)        # bf16 [N, T, D]

    q    bf16 [B, Hq, D]    Hq = G * Hkv, D in (64, 128, 256), G <= 16 (<= 8 at D = 256)
    -> out bf16 [B, Hq, D]

No host synchronisation: the grid depends on host integers only (``kv.active_blocks`` or the table's
capacity), so a call can be captured in a CUDA graph.
"""
from __future__ import annotations

import math
import numpy as np
import torch

from gaac_hf.format.v4 import KERNEL_HEAD_DIMS, GeometryV4

from ..paged import LaunchConfig, PagedKV, PagedTensorV4
from . import runtime
from .attention import LOG2E, MAX_SMEM, SM_SMEM, _sm_count, merge_chunk, merge_smem_bytes, prepare_launch

SOURCE = "decode_attention_v4.cu"
HEAD_DIMS = KERNEL_HEAD_DIMS
#: defaults measured on the H200 (lab/cuda-decode-notebook.md, call R4: F4i, 9 launch shapes x 8 cases):
#: 8 warps x 2 stages was best or within 2% everywhere; 1 CTA per SM at d = 128 (192 registers), 2 at d = 64
DEFAULT_WARPS = 8  # 4 at d = 256: 8 x 2 stages of 16 KB slots do not fit shared memory (compact slots do)
DEFAULT_STAGES = 2
DEFAULT_WAVES = 1


def default_ctas_per_sm(head_dim: int, group: int, warps: int) -> int:
    """Resident CTAs per SM the default launch is sized for: 16 warps per SM at d = 64 (128 registers, no
    spills), one CTA of 8 warps at d = 128 (the 255-register cap; 2 CTAs were 1-3% slower in call R4), and
    one CTA whenever the GQA group exceeds 8 (its softmax state does not fit 128 registers)."""
    if group > 8 or head_dim > 64:
        return 1
    return max(1, 16 // warps)


def const_regs_fit(head_dim: int, warps: int, ctas_per_sm: int) -> bool:
    """Whether the base16 constants live in registers (``CONST_REGS``: 24 fewer instructions per warp-tile at
    d = 128; call S3: 1.8-2.8% faster at Qwen3 128K, B=4 64K, B=16 32K) without spills: ptxas sm_90a,
    tests/test_v4_cuda_build.py: 232-250 registers at d = 128 under the 255 cap of <= 8 warps x 1 CTA (4 bytes
    of spills under a 128 cap). Not at d = 64: 2% slower there (call S3, SmolLM2 B=1 32K). Call S3's file was lost
    with session 18's try (lab notebook, session 19): `lab/experiments/v4_ab.py --define CONST_REGS` repeats it."""
    return head_dim >= 128 and 32 * warps * ctas_per_sm <= 256


def merge_batch(head_dim: int) -> int:
    """The split merge's load batching (attend.cuh ``MERGE_BATCH``): 2 (runs of 16, 8, 4, 2, 1 loads in flight) at
    d >= 128, 0 (one load per FMA group in the remainder) at d < 128. Two H100 A/Bs, every row bit-identical:
    at d = 128 / 256 it cuts the short calls, where the merge's L2 round trips are a large share (Gemma3 B=1 4K -8.6%
    / -8.7%, 16K -9.8% / -12.0%, Qwen3 B=1 4K -10.4%, 16K -4.7% / -5.6%; 64K within 0.2%), at d = 64 it costs
    up to 2.4% (SmolLM2 B=1 4K +1.4% / +2.4%, 16K -0.4% / +1.1%, 32K -4.1%): ``lab/results/merge_ab_h100_y20.json``,
    ``lab/results/merge2_ab_h100_y21.json``."""
    return 2 if head_dim >= 128 else 0


def tile_bytes(d: int) -> int:
    return 24 * d + 32


def slot_bytes(d: int, compact: bool = False) -> int:
    """Shared memory for one tile of one kind in a warp's ring: a compressed tile or 16 BF16 rows (blocks stored
    as BF16 and the tail are staged by the same bulk copies). ``compact`` (the kernel's ``COMPACT_SLOTS``): a
    compressed tile only; a tile with a kind stored as BF16 then stages K over both slots and V after it."""
    return tile_bytes(d) if compact else max(tile_bytes(d), 32 * d)


def smem_bytes(d: int, warps: int, stages: int, compact: bool = False) -> int:
    """Base16 pair constants ([2][d/16][32] uint2) + the warps' rings ([warps][stages][K, V][slot])."""
    return 2 * (d // 16) * 32 * 8 + warps * stages * 2 * slot_bytes(d, compact)


def _fits(smem: int, warps: int, per_sm: int) -> bool:
    return smem <= MAX_SMEM and (smem + 1024) * per_sm <= SM_SMEM and 32 * warps * per_sm <= 2048


def split_tokens(max_tokens: int, splits: int, tile: int, limit: int) -> int:
    """Tokens per split (whole pipeline steps of ``tile`` tokens) for about ``splits`` splits, never more than
    ``limit``: rounded down where that stays within the limit, else up. Rounding up alone halved the grid when
    ``max_tokens`` (the live blocks plus one block of tail capacity) ran a little past whole steps (SmolLM2 B=1 4K:
    4,160 tokens in 32 splits became 17 of 256)."""
    down = max(tile, max_tokens // splits // tile * tile)
    if math.ceil(max_tokens / down) <= limit:
        return down
    return math.ceil(math.ceil(max_tokens / splits) / tile) * tile


def plan(batch: int, kv_heads: int, group: int, block_size: int, head_dim: int, max_tokens: int,
         device, config: LaunchConfig) -> dict:
    """Compile-time defines, grid and shared memory for one call (host arithmetic only).

    Splits: enough CTAs to fill ``DEFAULT_WAVES`` waves of ``ctas_per_sm`` CTAs on every SM (at least
    one pipeline step of ``16 * warps`` tokens each), or ``config.num_splits``."""
    if config.loader not in (None, "bulk"):
        raise ValueError(f"the v4 kernel stages tiles with the copy engine (bulk copies), got loader={config.loader!r}")
    warps = config.num_warps or (DEFAULT_WARPS if head_dim <= 128 else 4)
    if warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {warps}")
    stages = config.num_stages or DEFAULT_STAGES
    if stages < 2:
        raise ValueError(f"num_stages must be >= 2 (copies in flight per warp + 1), got {stages}")
    tile = 16 * warps
    per_sm = config.ctas_per_sm or default_ctas_per_sm(head_dim, group, warps)
    # compact slots (COMPACT_SLOTS) only where the full ones do not fit: they cost a second copy on tiles with a
    # kind stored as BF16 (the tail, BF16 blocks)
    compact = not _fits(smem_bytes(head_dim, warps, stages), warps, per_sm)
    smem = smem_bytes(head_dim, warps, stages, compact)
    if smem > MAX_SMEM:
        raise ValueError(f"head_dim {head_dim} with {warps} warps x {stages} stages needs {smem} B of shared memory "
                         f"per CTA even with compact slots (at most {MAX_SMEM}): use fewer warps or stages")
    if not _fits(smem, warps, per_sm):
        raise ValueError(f"{per_sm} CTAs of {warps} warps x {stages} stages do not fit one SM ({smem} B of shared "
                         "memory each, with compact slots)")
    splits, limit = config.num_splits, config.num_splits
    if splits is None:
        streams = batch * kv_heads
        # at least one pipeline step per split: the BF16 kernel's 256-token floor cost SmolLM2 B=1 4K 11.5 us
        # against 8.6 us at 32 splits of 128 tokens (lab/results/v4_fixed_cost_callT4.json)
        cap = max(1, max_tokens // tile)
        limit = max(1, DEFAULT_WAVES * _sm_count(device) * per_sm // streams)
        splits = min(cap, limit)
    tps = split_tokens(max_tokens, splits, tile, limit)
    splits = max(1, math.ceil(max_tokens / tps))
    nt8 = 8 * math.ceil(group / 8)
    smem = max(smem, 4 * (2 * warps * nt8 + warps * nt8 * head_dim),
               merge_smem_bytes(group, splits))
    if smem > MAX_SMEM:
        raise ValueError(f"{splits} splits x {group} heads do not fit the merge in shared memory")
    defines = dict(HEAD_DIM=head_dim, QUERY_GROUP=group, PAGE=block_size, WARPS=warps, STAGES=stages,
                   MIN_CTAS_PER_SM=per_sm, CONST_REGS=int(const_regs_fit(head_dim, warps, per_sm)),
                   COMPACT_SLOTS=int(compact), MERGE_BATCH=merge_batch(head_dim))
    if runtime.pdl_requested():  # lab switch (runtime.pdl_requested): launched early, waits in-kernel
        defines["GAAC_PDL"] = 1
    return dict(defines=defines, smem=smem, splits=splits, tokens_per_split=tps, threads=32 * warps, warps=warps)


def twin_config(q: torch.Tensor, kv: PagedKV, launch: LaunchConfig | None = None) -> LaunchConfig:
    """The :func:`attention.bf16_decode_attention` launch whose output this kernel's matches bit for bit
    (same warps, same splits: the accumulation order depends on nothing else)."""
    B, HQ, D = q.shape
    HKV, maxb = kv.k.table.shape[1], kv.k.table.shape[2]
    blocks = maxb if kv.active_blocks is None else min(int(kv.active_blocks), maxb)
    T = kv.geometry.block_size
    p = plan(B, HKV, HQ // HKV, T, D, blocks * T + T, q.device, launch or LaunchConfig())
    cfg = launch or LaunchConfig()
    chunk = merge_chunk(HQ // HKV, p["splits"], D, cfg.merge_chunk)
    return LaunchConfig(num_warps=p["warps"], num_splits=p["splits"], merge_chunk=chunk)


def _check(q: torch.Tensor, kv: PagedKV) -> tuple[int, int, int, int, int]:
    if not isinstance(kv.k, PagedTensorV4) or not isinstance(kv.v, PagedTensorV4):
        raise TypeError("the fused v4 kernel reads PagedKV of PagedTensorV4 (format v4); a v3 cache uses "
                        "fused_attention.gaac_decode_attention_v3")
    g = kv.geometry
    if not isinstance(g, GeometryV4):
        raise TypeError(f"PagedKV.geometry must be GeometryV4, got {type(g).__name__}")
    if (kv.k.kind, kv.v.kind) != ("k", "v"):
        raise ValueError(f"PagedKV.k / .v must hold K and V tiles, got kinds {kv.k.kind!r} / {kv.v.kind!r}")
    if q.dim() != 3 or q.dtype != torch.bfloat16 or not q.is_contiguous():
        raise ValueError(f"q must be contiguous bfloat16 [B, Hq, D], got {q.dtype} {tuple(q.shape)}")
    B, HQ, D = q.shape
    if D != g.head_dim or D not in HEAD_DIMS:
        raise ValueError(f"the fused v4 kernel takes head_dim in {HEAD_DIMS} (q has {D}, the cache {g.head_dim}); "
                         "other head_dims decode first (decode_blocks_v4_cuda) and attend with the BF16 kernel")
    T = g.block_size
    HKV = kv.k.table.shape[1]
    for name, p in (("k", kv.k), ("v", kv.v)):
        if p.pool.dtype != torch.uint8 or p.pool.dim() != 1:
            raise ValueError(f"{name}.pool must be uint8 [P], got {p.pool.dtype} {tuple(p.pool.shape)}")
        if p.table.dtype != torch.int64 or p.table.dim() != 3 or p.table.shape[0] != B or not p.table.is_contiguous():
            raise ValueError(f"{name}.table must be contiguous int64 [B, Hkv, max_blocks], got {p.table.dtype} "
                             f"{tuple(p.table.shape)}")
        if p.tail.dtype != torch.bfloat16 or tuple(p.tail.shape) != (B, HKV, T, D) or not p.tail.is_contiguous():
            raise ValueError(f"{name}.tail must be contiguous bfloat16 [B, Hkv, {T}, {D}], got {tuple(p.tail.shape)}")
        if p.base16.dtype != torch.uint8 or tuple(p.base16.shape) != (HKV, D) or not p.base16.is_contiguous():
            raise ValueError(f"{name}.base16 must be contiguous uint8 [Hkv, {D}], got {p.base16.dtype} "
                             f"{tuple(p.base16.shape)}")
    if HQ % HKV or HQ // HKV > 16:
        raise ValueError(f"query heads ({HQ}) must be a multiple of kv heads ({HKV}), at most 16 per kv head")
    if D == 256 and HQ // HKV > 8:
        raise ValueError(f"head_dim 256 takes at most 8 query heads per kv head in the v4 kernel (got {HQ // HKV}): "
                         "more would spill registers")
    if kv.k.table.shape != kv.v.table.shape:
        raise ValueError("K and V block tables must have the same shape")
    for name, t in (("num_blocks", kv.num_blocks), ("tail_len", kv.tail_len), ("kv_start", kv.kv_start)):
        if t is not None and (t.dtype != torch.int32 or tuple(t.shape) != (B,)):
            raise ValueError(f"{name} must be int32 [B], got {t.dtype} {tuple(t.shape)}")
    return B, HQ, HKV, T, D


def gaac_decode_attention_v4(q: torch.Tensor, kv: PagedKV, *, scale: float | None = None,
                             launch: LaunchConfig | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention over a v4 GAAC cache, tiles decoded in registers. Shapes in the module doc."""
    B, HQ, HKV, T, D = _check(q, kv)
    max_blocks = kv.k.table.shape[2]
    p, mod, out, part_o, part_lse, scale = prepare_launch(plan, SOURCE, q, HKV, T, max_blocks, kv.active_blocks,
                                                         launch, out, scale)
    k, v = kv.k, kv.v
    runtime.launch(mod, "gaac_v4_decode_split", (p["splits"], HKV, B), (p["threads"],), p["smem"],
                   q, k.pool, v.pool, k.table, v.table, k.tail, v.tail, k.base16, v.base16,
                   kv.num_blocks, kv.tail_len, kv.kv_start, part_o, part_lse, out, p["counters"],
                   np.int32(HKV), np.int32(max_blocks), np.int32(p["tokens_per_split"]), np.float32(scale * LOG2E),
                   device=q.device)
    return out


DECODER_WARPS = 4
PACK_CHUNK = 8192  # blocks per reference-encoder call in pack_paged_v4


def decode_blocks_v4_cuda(pool: torch.Tensor, entries: torch.Tensor, base16: torch.Tensor, geometry: GeometryV4,
                          kind: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """The blocks that int64 ``entries [N]`` point at in uint8 ``pool [P]`` -> bf16 ``[N, T, D]``, bit-exact
    (BF16 blocks copied), decoded by the attention kernel's own lane code. ``base16``: uint8 ``[N, D]``
    (each entry's windows). No host sync."""
    D, T = geometry.head_dim, geometry.block_size
    if D not in HEAD_DIMS:
        raise ValueError(f"the CUDA v4 decoder takes head_dim in {HEAD_DIMS}, got {D} (the reference codec "
                         "gaac_hf.codec.v4 takes any)")
    if kind not in ("k", "v"):
        raise ValueError(f"kind must be 'k' or 'v', got {kind!r}")
    e = entries.to(torch.int64).contiguous()
    n = e.numel()
    if tuple(base16.shape) != (n, D) or base16.dtype != torch.uint8:
        raise ValueError(f"base16 must be uint8 [N={n}, {D}], got {base16.dtype} {tuple(base16.shape)}")
    out = torch.empty(n, T, D, dtype=torch.bfloat16, device=pool.device) if out is None else out
    if n == 0:
        return out
    mod = runtime.load(SOURCE, dict(HEAD_DIM=D, QUERY_GROUP=1, PAGE=T, WARPS=DECODER_WARPS, STAGES=2),
                       pool.device)
    tiles = n * (T // 16)
    smem = DECODER_WARPS * tile_bytes(D) + DECODER_WARPS * (D // 16) * 32 * 8
    runtime.launch(mod, "gaac_v4_decode_blocks", (math.ceil(tiles / DECODER_WARPS),), (32 * DECODER_WARPS,), smem,
                   pool, e, base16.contiguous(), np.int32(n), np.int32(kind == "v"), out, device=pool.device)
    return out


def pack_paged_v4(k: torch.Tensor, v: torch.Tensor, seq_lens: list[int], block_size: int, base16: torch.Tensor, *,
                  shuffle: bool = True, generator: torch.Generator | None = None, guard_fill: int = 0xA5) -> PagedKV:
    """Dense bf16 K/V ``[B, Hkv, S, D]`` (sequence b valid in ``[:seq_lens[b]]``) -> a v4 ``PagedKV`` (tests,
    benchmarks). base16: uint8 ``[2, Hkv, D]`` (K, V) windows. Every complete block is encoded with the
    reference codec and packed into one pool per kind, in a shuffled order when ``shuffle`` (the table's
    indirection is exercised); blocks that do not fit are stored as BF16 (entry | 1). The pool ends with
    ``GUARD_BYTES`` of ``guard_fill``. The rest of each sequence goes to its tail."""
    from gaac_hf.codec.v4 import encode_blocks_v4, pack_blocks_v4, stored_lengths

    B, H, S, D = k.shape
    T = block_size
    g = GeometryV4(block_size=T, head_dim=D)
    dev = k.device
    nbs = [n // T for n in seq_lens]
    maxb = max(1, max(nbs))
    n = sum(H * nb for nb in nbs)
    heads = torch.cat([torch.arange(H, device=dev).repeat_interleave(nb) for nb in nbs]) if n else None
    order = torch.randperm(n, generator=generator, device="cpu").to(dev) if shuffle and n else torch.arange(n, device=dev)
    kinds = []
    for kind, (name, x) in enumerate((("k", k), ("v", v))):
        table = torch.zeros(B, H, maxb, dtype=torch.int64, device=dev)
        if n:
            blocks = torch.cat([x[b, :, : nbs[b] * T].reshape(H * nbs[b], T, D) for b in range(B)])[order]
            hs = heads[order]
            # encoded in chunks (the reference encoder's intermediates are ~40 bytes per value), placed in
            # `order`: block order[i] at place i
            encs = [encode_blocks_v4(blocks[i: i + PACK_CHUNK], base16[kind][hs[i: i + PACK_CHUNK]], g, name)
                    for i in range(0, n, PACK_CHUNK)]
            lens = torch.cat([stored_lengths(e.fits, g) for e in encs])
            offs = torch.cumsum(lens, 0) - lens
            pool = torch.full((int(lens.sum()) + PagedTensorV4.GUARD_BYTES,), guard_fill, dtype=torch.uint8, device=dev)
            placed = torch.cat([pack_blocks_v4(e, blocks[i * PACK_CHUNK: i * PACK_CHUNK + e.fits.numel()], pool,
                                               offs[i * PACK_CHUNK: i * PACK_CHUNK + e.fits.numel()])
                                for i, e in enumerate(encs)])
            pool[-PagedTensorV4.GUARD_BYTES:] = guard_fill  # the packer's masked-off writes land in the guard
            entries = torch.empty_like(placed)
            entries[order] = placed  # block j (in (b, h, i) order) lives at entries[j]
            del encs, blocks
            j = 0
            for b in range(B):
                table[b, :, : nbs[b]] = entries[j: j + H * nbs[b]].reshape(H, nbs[b])
                j += H * nbs[b]
        else:
            pool = torch.full((PagedTensorV4.GUARD_BYTES,), guard_fill, dtype=torch.uint8, device=dev)
        tail = torch.zeros(B, H, T, D, dtype=torch.bfloat16, device=dev)
        for b in range(B):
            r = seq_lens[b] - nbs[b] * T
            tail[b, :, :r] = x[b, :, nbs[b] * T: seq_lens[b]]
        kinds.append(PagedTensorV4(pool, table, tail, base16[kind].contiguous(), name))
    i32 = dict(dtype=torch.int32, device=dev)
    return PagedKV(kinds[0], kinds[1], torch.tensor(nbs, **i32),
                   torch.tensor([s - nb * T for s, nb in zip(seq_lens, nbs)], **i32), g)


__all__ = ["gaac_decode_attention_v4", "decode_blocks_v4_cuda", "pack_paged_v4", "plan", "twin_config"]
