"""Plan and launch the fused GAAC v3 split-KV decode attention (``decode_attention_v3.cu``).

The kernel reads the cache's v3 blocks (``PagedTensorV3``: a byte pool, int64 block-table entries,
a BF16 tail, pre-shifted base pair constants) and decodes them in shared memory right before the
same MMA code the BF16 kernel runs (``include/gaac/attend.cuh``). For the same ``LaunchConfig``
(warps, splits) its output is bit-identical to :func:`attention.bf16_decode_attention` on the
decoded K/V: ``tests/test_cuda_fused.py`` checks exactly that, on real and adversarial K/V.

    out = gaac_decode_attention_v3(q, kv, scale=None, launch=None, out=None)   # kv: PagedKV of PagedTensorV3

    q    bf16 [B, Hq, D]    Hq = G * Hkv, D in (64, 128, 256), G <= 16
    -> out bf16 [B, Hq, D]

No host synchronisation: the grid depends on host integers only (``kv.active_blocks`` or the
table's capacity), so a call can be captured in a CUDA graph.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from gaac_hf.format.v3 import GeometryV3

from ..paged import LaunchConfig, PagedKV, PagedTensorV3
from . import runtime
from .attention import LOG2E, _choose_splits, merge_smem_bytes, prepare_launch
from .attention import MAX_SMEM as _MAX_DYNAMIC

MAX_SMEM = _MAX_DYNAMIC  # dynamic + static shared memory of one CTA

SOURCE = "decode_attention_v3.cu"
HEAD_DIMS = (64, 128, 256)


def segments_per_producer(d: int, pseg: int | None = None) -> int:
    """Segments of K and of V one producer warp decodes per tile (the consumer's 16 rows hold d / 64)."""
    return min(d // 64, pseg or DEFAULT_PRODUCER_SEGMENTS)


def producers_per_consumer(d: int, pseg: int | None = None, kinds: int | None = None) -> int:
    """Producer warps per consumer warp: the consumer's 16 rows (d / 64 segments) split among them,
    and with ``kinds == 1`` one producer for K and one for V of each group of segments."""
    return (d // 64) // segments_per_producer(d, pseg) * (2 if kinds == 1 else 1)


def entry_chunks(d: int, pseg: int | None = None) -> int:
    """16-byte chunks of entry list staged per (producer, kind, stage): room for 32 entries per segment
    (a quarter of its 128 groups wide; real K/V: 8-12%) plus one for alignment; longer lists are read
    from global memory. Mirrors ENTRY_CHUNKS's default in the kernel."""
    return 4 * segments_per_producer(d, pseg) + 1


def _slot_bytes(d: int, pseg: int | None = None) -> int:
    return 1408 * segments_per_producer(d, pseg) + 32 + 16 * entry_chunks(d, pseg)


def smem_bytes(d: int, warps: int, stages: int, dec_stages: int = 2, pseg: int | None = None,
               kinds: int | None = None, k_slots: int | None = None) -> int:
    """Decoded rings (K: [k_slots][warps][16 x (d + 8)] BF16, V: [dec_stages][warps][...]) + (base16 -
    base8) pairs + the compressed ring ([stages][producers][kinds per producer][slot])."""
    producers = warps * producers_per_consumer(d, pseg, kinds)
    nk = 1 if kinds == 1 else 2
    k_slots = k_slots or dec_stages
    return (k_slots + dec_stages) * warps * 16 * (d + 8) * 2 + 4 * d + stages * producers * nk * _slot_bytes(d, pseg)


def static_bytes(d: int, warps: int, stages: int, pseg: int | None = None, kinds: int | None = None,
                 dec_stages: int = 2) -> int:
    """The kernel's static shared memory: the metadata rings (3 (stages - 1) + 2 slots of two entries
    and four segment words per producer) and the mbarriers (full and empty per decoded slot, kfree; +
    slack for the compiler's own)."""
    producers = warps * producers_per_consumer(d, pseg, kinds)
    return (3 * (stages - 1) + 2) * producers * 32 + (2 * dec_stages + 1) * warps * 8 + 256


def cta_bytes(d: int, warps: int, stages: int, pseg: int | None = None, kinds: int | None = None,
              k_slots: int | None = None, dec_stages: int = 2) -> int:
    """Shared memory of one CTA, dynamic + static."""
    return (smem_bytes(d, warps, stages, dec_stages, pseg=pseg, kinds=kinds, k_slots=k_slots)
            + static_bytes(d, warps, stages, pseg, kinds, dec_stages))


def threads_of(d: int, warps: int, pseg: int | None = None, kinds: int | None = None) -> int:
    return 32 * warps * (1 + producers_per_consumer(d, pseg, kinds))


def default_stages(d: int, warps: int, pseg: int | None = None, kinds: int | None = None,
                   k_slots: int | None = None, group: int = 4, dec_stages: int = 2) -> int:
    """The deepest compressed ring (<= 8) that leaves the most CTAs per SM (4, 3, else 2, else 1) the
    registers allow (:func:`regs_needed` for ``group``): measured on the H200 (lab/cuda-decode-notebook.md,
    calls F2-F8, J1) the kernel's time falls with the number of producer warps per SM and does not
    change with ring depth beyond 2-3 stages."""
    threads, need = threads_of(d, warps, pseg, kinds), regs_needed(d, group, pseg, kinds)
    low = 2
    for ctas in (c for c in (4, 3, 2) if 65536 // (threads * c) >= need):
        # at 4 CTAs a deeper ring costs (call K1, SmolLM2 d=64 B=1 64K: 2 stages 38.0 us, 3: 38.4, 6: 42.3)
        for s in range(low if ctas == 4 else 8, low - 1, -1):
            if ctas * (cta_bytes(d, warps, s, pseg, kinds, k_slots, dec_stages) + 1024) <= 228 * 1024:
                return s
    for s in range(8, low - 1, -1):  # else one CTA per SM with the deepest ring that fits
        if cta_bytes(d, warps, s, pseg, kinds, k_slots, dec_stages) <= MAX_SMEM:
            return s
    return low


def max_ctas_per_sm(d: int, warps: int, stages: int, group: int, pseg: int | None = None,
                    kinds: int | None = None, k_slots: int | None = None, dec_stages: int = 2) -> int:
    """Most resident CTAs per SM that shared memory and the kernel's registers allow."""
    need = regs_needed(d, group, pseg, kinds)
    threads = threads_of(d, warps, pseg, kinds)
    return max([c for c in range(1, 9) if c * (cta_bytes(d, warps, stages, pseg, kinds, k_slots, dec_stages) + 1024)
                <= 228 * 1024
                and 65536 // (threads * c) >= need and threads * c <= 2048] or [1])


# registers per thread the kernel uses (sm_90a ptxas, 2 consumer warps); a CTAs-per-SM choice must
# leave them (tests/test_cuda_build.py compiles at the tightest cap the table allows: no spills)
# keys (head_dim, segments per producer, kinds per producer)
# (one producer per kind at d=64 / 128: 92-96 uncapped, and ptxas fits them in 80 under the 4-CTA cap of
# 85 without spills, which call J1 measured 4-10% faster than 3 CTAs at 96)
_REGS_NEEDED = {(64, 1, 2): 102, (128, 1, 2): 93, (128, 2, 2): 127, (256, 1, 2): 152, (256, 2, 2): 152,
                (64, 1, 1): 80, (128, 1, 1): 93, (128, 2, 1): 80, (256, 1, 1): 152, (256, 2, 1): 152}
_REGS_NEEDED_G16 = {(64, 1, 2): 136, (128, 1, 2): 160, (128, 2, 2): 160, (256, 1, 2): 200, (256, 2, 2): 200,
                    (64, 1, 1): 136, (128, 1, 1): 160, (128, 2, 1): 160, (256, 1, 1): 200, (256, 2, 1): 200}


def regs_needed(d: int, group: int, pseg: int | None = None, kinds: int | None = None) -> int:
    """Registers per thread the kernel needs for this shape (a CTAs-per-SM choice must leave them)."""
    table = _REGS_NEEDED if group <= 8 else _REGS_NEEDED_G16
    return table.get((d, segments_per_producer(d, pseg), 1 if kinds == 1 else 2), 255)
DEFAULT_WARPS = 2      # consumer warps (the BF16 twin's warps for bit identity)
DEFAULT_PRODUCER_SEGMENTS = 2
DEFAULT_PRODUCER_KINDS = 1  # kinds (K, V) per producer warp: 1 = one producer per kind (call G10: 116 -> 99 us)


def default_k_slots(d: int) -> int:
    """Slots of the decoded K ring: 1 at d <= 128, where the freed 16 (d + 8) * 2 B per consumer warp let
    a 4th CTA fit per SM (call J1: 4-10% faster, Qwen3 B=1 64K 99.1 -> 94.9 us); 2 at d = 256, which runs
    one CTA per SM either way (one slot measured 5% slower there)."""
    return 1 if d <= 128 else 2


def plan(batch: int, kv_heads: int, group: int, block_size: int, head_dim: int, max_tokens: int,
         device, config: LaunchConfig) -> dict:
    """Compile-time defines, grid and shared memory for one call (host arithmetic only).

    ``config.num_warps``: consumer warps (the producers come on top, :func:`producers_per_consumer`);
    ``config.num_stages``: depth of the compressed ring (the decoded ring has 2 slots)."""
    if config.loader not in (None, "cp.async"):
        raise ValueError(f"the fused kernel stages compressed tiles with cp.async (the copy engine measured 7% "
                         f"slower, lab/cuda-decode-notebook.md call F7), got loader={config.loader!r}")
    warps = config.num_warps or DEFAULT_WARPS
    pseg = config.producer_segments
    if pseg not in (None, 1, 2):
        raise ValueError(f"producer_segments must be 1 or 2, got {pseg}")
    kinds = config.producer_kinds or DEFAULT_PRODUCER_KINDS
    if kinds not in (1, 2):
        raise ValueError(f"producer_kinds must be 1 or 2, got {config.producer_kinds}")
    dec = config.decoded_slots or 2
    if dec not in (2, 3, 4):
        raise ValueError(f"decoded_slots must be 2, 3 or 4, got {config.decoded_slots}")
    k_slots = config.decoded_k_slots or (dec if dec != 2 else default_k_slots(head_dim))
    if k_slots not in (1, dec):
        raise ValueError(f"decoded_k_slots must be 1 or decoded_slots ({dec}), got {config.decoded_k_slots}")
    stages = config.num_stages or default_stages(head_dim, warps, pseg, kinds, k_slots, group, dec)
    tile = 16 * warps
    threads = threads_of(head_dim, warps, pseg, kinds)
    smem = smem_bytes(head_dim, warps, stages, dec, pseg=pseg, kinds=kinds, k_slots=k_slots)
    static = static_bytes(head_dim, warps, stages, pseg, kinds, dec)
    if smem + static > MAX_SMEM:
        raise ValueError(f"head_dim {head_dim} with {warps} warps x {stages} stages needs {smem} B of shared memory "
                         f"per CTA (at most {MAX_SMEM}): use fewer warps or stages")
    splits = config.num_splits
    per_sm = config.ctas_per_sm or 1
    if splits is None:
        # as many CTAs per SM as fit (time falls with producer warps per SM), splits to fill the wave
        if config.ctas_per_sm is None:
            from dataclasses import replace

            config = replace(config, ctas_per_sm=max_ctas_per_sm(head_dim, warps, stages, group, pseg, kinds, k_slots,
                                                                 dec))
        need = {head_dim: regs_needed(head_dim, group, pseg, kinds)}
        splits, per_sm = _choose_splits(batch * kv_heads, max_tokens, tile, smem + static, head_dim, device, config,
                                        regs_needed=need, threads=threads)
    tps = math.ceil(math.ceil(max_tokens / splits) / tile) * tile
    splits = max(1, math.ceil(max_tokens / tps))
    nt8 = 8 * math.ceil(group / 8)
    smem = max(smem, 4 * (2 * warps * nt8 + warps * nt8 * head_dim),
               merge_smem_bytes(group, splits))
    if smem + static > MAX_SMEM:
        raise ValueError(f"{splits} splits x {group} heads do not fit the merge in shared memory")
    defines = dict(HEAD_DIM=head_dim, QUERY_GROUP=group, PAGE=block_size, WARPS=warps, STAGES=stages,
                   DEC_STAGES=dec, DEC_K_STAGES=k_slots, MIN_CTAS_PER_SM=per_sm, ENTRY_CHUNKS=entry_chunks(head_dim, pseg),
                   PROD_SEGS=segments_per_producer(head_dim, pseg), KIND_SPLIT=int(kinds == 1))
    return dict(defines=defines, smem=smem, splits=splits, tokens_per_split=tps, threads=threads, warps=warps)


def _check(q: torch.Tensor, kv: PagedKV) -> tuple[int, int, int, int, int]:
    if not isinstance(kv.k, PagedTensorV3) or not isinstance(kv.v, PagedTensorV3):
        raise TypeError("the fused v3 kernel reads PagedKV of PagedTensorV3 (format v3); a v2 cache uses the "
                        "Triton kernels (gaac_hf.kernels.triton)")
    g = kv.geometry
    if not isinstance(g, GeometryV3):
        raise TypeError(f"PagedKV.geometry must be GeometryV3, got {type(g).__name__}")
    if q.dim() != 3 or q.dtype != torch.bfloat16 or not q.is_contiguous():
        raise ValueError(f"q must be contiguous bfloat16 [B, Hq, D], got {q.dtype} {tuple(q.shape)}")
    B, HQ, D = q.shape
    if D != g.head_dim or D not in HEAD_DIMS:
        raise ValueError(f"the fused kernel takes head_dim in {HEAD_DIMS} (q has {D}, the cache {g.head_dim}); other "
                         "head_dims decode first (kernels/cuda/codec_v3.py) and attend with the BF16 kernel")
    T = g.block_size
    for name, p in (("k", kv.k), ("v", kv.v)):
        if p.pool.dtype != torch.uint8 or p.pool.dim() != 1:
            raise ValueError(f"{name}.pool must be uint8 [P], got {p.pool.dtype} {tuple(p.pool.shape)}")
        if p.table.dtype != torch.int64 or p.table.dim() != 3 or p.table.shape[0] != B or not p.table.is_contiguous():
            raise ValueError(f"{name}.table must be contiguous int64 [B, Hkv, max_blocks], got {p.table.dtype} "
                             f"{tuple(p.table.shape)}")
        if p.tail.dtype != torch.bfloat16 or tuple(p.tail.shape[2:]) != (T, D) or p.tail.shape[0] != B:
            raise ValueError(f"{name}.tail must be bfloat16 [B, Hkv, {T}, {D}], got {tuple(p.tail.shape)}")
        for t in (p.b8p, p.dbp):
            if t.dtype != torch.int32 or tuple(t.shape) != (p.table.shape[1], D // 2) or not t.is_contiguous():
                raise ValueError(f"{name} pair constants must be int32 [Hkv, {D // 2}], got {t.dtype} {tuple(t.shape)}")
    HKV = kv.k.table.shape[1]
    if HQ % HKV or HQ // HKV > 16:
        raise ValueError(f"query heads ({HQ}) must be a multiple of kv heads ({HKV}), at most 16 per kv head")
    if D == 256 and HQ // HKV > 8:
        raise ValueError(f"head_dim 256 takes at most 8 query heads per kv head in the fused kernel (got "
                         f"{HQ // HKV}): more would spill registers")
    if kv.k.table.shape != kv.v.table.shape:
        raise ValueError("K and V block tables must have the same shape")
    return B, HQ, HKV, T, D


def gaac_decode_attention_v3(q: torch.Tensor, kv: PagedKV, *, scale: float | None = None,
                             launch: LaunchConfig | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention over a v3 GAAC cache, compressed blocks decoded on the fly. Shapes in the module doc."""
    B, HQ, HKV, T, D = _check(q, kv)
    max_blocks = kv.k.table.shape[2]
    p, mod, out, part_o, part_lse, scale = prepare_launch(plan, SOURCE, q, HKV, T, max_blocks, kv.active_blocks,
                                                         launch, out, scale)
    splits = p["splits"]
    k, v = kv.k, kv.v
    runtime.launch(mod, "gaac_v3_decode_split", (splits, HKV, B), (p["threads"],), p["smem"],
                   q, k.pool, v.pool, k.table, v.table, k.tail, v.tail, k.b8p, k.dbp, v.b8p, v.dbp,
                   kv.num_blocks, kv.tail_len, kv.kv_start, part_o, part_lse, out, p["counters"],
                   np.int32(HKV), np.int32(max_blocks), np.int32(p["tokens_per_split"]), np.float32(scale * LOG2E),
                   device=q.device)
    return out


def pack_paged_v3(k: torch.Tensor, v: torch.Tensor, seq_lens: list[int], block_size: int, bases: torch.Tensor, *,
                  shuffle: bool = True, generator: torch.Generator | None = None, encoder=None,
                  guard_fill: int = 0xA5) -> PagedKV:
    """Dense bf16 K/V ``[B, Hkv, S, D]`` (sequence b valid in ``[:seq_lens[b]]``) -> a v3 ``PagedKV``.

    bases: uint8 ``[2, 2, Hkv, D]`` = (K, V) x (base8, base16) windows per kv head. Every complete
    block is encoded (``encoder(x [N, T, D], base8 [N, D], base16 [N, D], geometry)`` -> EncodedBlocksV3;
    default: the CUDA encoder for CUDA tensors, the reference otherwise) and packed into one pool per
    kind, in a shuffled order when ``shuffle`` (the block table's indirection is exercised); blocks
    that do not fit are stored as BF16 (entry | 1). The pool ends with ``GUARD_BYTES`` of
    ``guard_fill`` (bytes a kernel may load but must never use). The rest of each sequence goes to its tail.
    """
    from gaac_hf.codec.v3 import EncodedBlocksV3, encode_blocks_v3, pack_blocks

    B, H, S, D = k.shape
    T = block_size
    g = GeometryV3(block_size=T, head_dim=D)
    dev = k.device
    if encoder is None:
        if dev.type == "cuda":
            from .codec_v3 import encode_blocks_cuda as encoder
        else:
            encoder = encode_blocks_v3
    nbs = [n // T for n in seq_lens]
    maxb = max(1, max(nbs))
    n = sum(H * nb for nb in nbs)
    heads = torch.cat([torch.arange(H, device=dev).repeat_interleave(nb) for nb in nbs]) if n else None
    order = torch.randperm(n, generator=generator, device="cpu").to(dev) if shuffle and n else torch.arange(n, device=dev)
    kinds = []
    for kind, x in enumerate((k, v)):
        blocks = torch.cat([x[b, :, : nbs[b] * T].reshape(H * nbs[b], T, D) for b in range(B)]) if n else None
        table = torch.zeros(B, H, maxb, dtype=torch.int64, device=dev)
        if n:
            b8, b16 = bases[kind, 0][heads], bases[kind, 1][heads]
            enc = encoder(blocks, b8, b16, g)
            sel = lambda t: t[order] if t.numel() else t  # noqa: E731
            pool, ent_sorted = pack_blocks(EncodedBlocksV3(enc.data[order], enc.nbytes[order], enc.fits[order],
                                                           sel(enc.modes)), blocks[order])
            entries = torch.empty_like(ent_sorted)
            entries[order] = ent_sorted  # block j (in (b, h, i) order) lives at entries[j]
            j = 0
            for b in range(B):
                table[b, :, : nbs[b]] = entries[j: j + H * nbs[b]].reshape(H, nbs[b])
                j += H * nbs[b]
        else:
            pool = torch.zeros(0, dtype=torch.uint8, device=dev)
        pool = torch.cat([pool, torch.full((PagedTensorV3.GUARD_BYTES,), guard_fill, dtype=torch.uint8, device=dev)])
        tail = torch.zeros(B, H, T, D, dtype=torch.bfloat16, device=dev)
        for b in range(B):
            r = seq_lens[b] - nbs[b] * T
            tail[b, :, :r] = x[b, :, nbs[b] * T: seq_lens[b]]
        kinds.append(PagedTensorV3.from_bases(pool, table, tail, bases[kind, 0], bases[kind, 1]))
    i32 = dict(dtype=torch.int32, device=dev)
    return PagedKV(kinds[0], kinds[1], torch.tensor(nbs, **i32),
                   torch.tensor([s - nb * T for s, nb in zip(seq_lens, nbs)], **i32), g)
