"""Plan and launch the CUDA C++ split-KV decode attention (``decode_attention.cu``).

The Python side of FlashInfer's split: this module decides the launch (splits from occupancy, shared
memory, compile-time parameters) and launches; the kernel computes. Same paged addressing and the
same contract as the Triton kernels (``gaac_hf.kernels.attention``: per-sequence block tables,
``num_blocks`` / ``tail_len`` / ``kv_start`` as int32 device tensors, a BF16 tail), so the two
backends are interchangeable and compared in ``tests/test_cuda_attention.py``.

    out = bf16_decode_attention(q, kv, scale=None, launch=None, out=None)      # kv: PagedKV
    out = bf16_decode_attention_tensors(q, k_raw, v_raw, k_table, v_table, k_tail, v_tail,
                                        num_blocks, tail_len, kv_start=None, scale=None,
                                        active_blocks=None, config=None, out=None)

    q          bf16  [B, Hq, D]            Hq = G * Hkv; query head h reads kv head h // G
    k_raw/v_raw bf16 [num_raw, T, D]       complete blocks (table entries e < 0 point at raw[~e])
    k_table/v_table int32 [B, Hkv, max_blocks]
    k_tail/v_tail bf16 [B, Hkv, T, D]      incomplete last block
    num_blocks, tail_len, kv_start  int32 [B]
    -> out     bf16  [B, Hq, D]

No host synchronisation: the grid depends on host integers only (``active_blocks`` or the table's
capacity), so a call can be captured in a CUDA graph.
"""
from __future__ import annotations

import math
import numpy as np
import torch

from ..paged import LaunchConfig, PagedKV
from . import runtime

SOURCE = "decode_attention.cu"
LOG2E = 1.4426950408889634
MIN_TOKENS_PER_SPLIT = 256  # a split shorter than this costs more in setup and merge than it gains
MAX_SMEM = 227 * 1024  # dynamic shared memory one CTA may take on sm_90
SM_SMEM = 228 * 1024   # shared memory of one SM (each resident CTA also reserves 1 KB)


_LOADERS = {"cp.async": 0, "bulk": 1}


def _smem_bytes(d: int, warps: int, stages: int) -> int:
    return 2 * stages * 16 * warps * (d + 8) * 2


def merge_smem_bytes(group: int, splits: int) -> int:
    """Shared memory the last CTA's split merge needs (attend.cuh ``finish``): ``group * splits`` float
    weights (at either merge level)."""
    return 4 * group * splits


# The last CTA's merge reads every split's partial (G * D * 4 bytes each) through L2 alone: one kv head of
# Gemma3 (4 x 256 channels) at 128 splits is 512 KiB for one CTA of 128 threads. Past this many bytes the
# merge goes in two levels (attend.cuh ``finish``): chunks of MERGE_CHUNK consecutive splits merge on
# their own last CTAs in parallel, then the last of those merges the chunk results. Measured (H100, session 25,
# lab/results/y1_session25): with the merge loop at 16 loads in flight per thread, two levels time the same as
# one (Gemma3 B=1 16K 24.4 vs 24.3 us, 64K 41.0 vs 41.0); kept because it bounds the last CTA's reads as splits
# grow, costs nothing measurable, and the fused kernels and twins merge in the same order either way.
MERGE_TREE_BYTES = 128 * 1024
MERGE_TREE_CHUNK = 16


def merge_chunk(group: int, splits: int, head_dim: int, override: int | None = None) -> int:
    """Splits per first-level chunk of the in-kernel merge (0: one level). A function of the call's
    shape and splits only, so a fused kernel and its BF16 twin merge in the same order; ``override``
    (``LaunchConfig.merge_chunk``) forces it (0 = one level)."""
    if override is not None:
        if override < 0 or override == 1:
            raise ValueError(f"merge_chunk must be 0 (one level) or >= 2 splits, got {override}")
        return override if 0 < override < splits else 0
    if splits > MERGE_TREE_CHUNK and 4 * group * head_dim * splits > MERGE_TREE_BYTES:
        return MERGE_TREE_CHUNK
    return 0


def merge_counters(batch: int, kv_heads: int, splits: int, chunk: int) -> int:
    """int32 arrival counters a call needs: per (sequence, kv head) one for the final merge and, with a
    chunked merge, one per chunk (attend.cuh ``finish`` lays them out the same way)."""
    return batch * kv_heads * (1 + (math.ceil(splits / chunk) if chunk else 0))


def _default_stages(d: int, warps: int) -> int:
    # measured on the H200 (eval/results/attention_bf16_h200.json "sweep"): 3 stages at one CTA per SM
    # was best or within 1% for d = 64 / 128 / 256; deeper rings never helped. One stage (no overlap, cp.async
    # only) where two do not fit: 8 warps at d = 256, the twin of the v4 kernel's compact-slot launch
    for stages in (3, 2):
        if _smem_bytes(d, warps, stages) <= MAX_SMEM:
            return stages
    return 1


def _default_warps(d: int) -> int:
    return 8 if d <= 64 else 4


def _check(q, k_raw, v_raw, k_table, v_table, k_tail, v_tail, num_blocks, tail_len, kv_start):
    if q.dim() != 3:
        raise ValueError(f"q must be [B, Hq, D], got shape {tuple(q.shape)}")
    B, HQ, D = q.shape
    if k_tail.dim() != 4 or k_tail.shape[0] != B or k_tail.shape[3] != D:
        raise ValueError(f"k_tail must be [B, Hkv, T, D] = [{B}, Hkv, T, {D}], got {tuple(k_tail.shape)}")
    HKV, T = k_tail.shape[1], k_tail.shape[2]
    if HQ % HKV:
        raise ValueError(f"query heads ({HQ}) must be a multiple of kv heads ({HKV})")
    if HQ // HKV > 16:
        raise ValueError(f"at most 16 query heads per kv head are supported, got {HQ // HKV}")
    if D % 16 or not 16 <= D <= 256:
        raise ValueError(f"head_dim must be a multiple of 16 up to 256, got {D}")
    if T % 16:
        raise ValueError(f"block size must be a multiple of 16, got {T}")
    for name, t in (("q", q), ("k_raw", k_raw), ("v_raw", v_raw), ("k_tail", k_tail), ("v_tail", v_tail)):
        if t.dtype != torch.bfloat16:
            raise TypeError(f"{name} must be bfloat16, got {t.dtype}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if v_tail.shape != k_tail.shape:
        raise ValueError(f"v_tail {tuple(v_tail.shape)} differs from k_tail {tuple(k_tail.shape)}")
    for name, t in (("k_table", k_table), ("v_table", v_table)):
        if t.dtype != torch.int32 or t.dim() != 3 or t.shape[:2] != (B, HKV) or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous int32 [B, Hkv, max_blocks], got {t.dtype} {tuple(t.shape)}")
    if k_table.shape != v_table.shape:
        raise ValueError("k_table and v_table must have the same shape")
    for name, t in (("num_blocks", num_blocks), ("tail_len", tail_len), ("kv_start", kv_start)):
        if t is not None and (t.dtype != torch.int32 or t.shape != (B,)):
            raise ValueError(f"{name} must be int32 [B], got {t.dtype} {tuple(t.shape)}")
    if k_raw.dim() != 3 or tuple(k_raw.shape[1:]) != (T, D) or tuple(v_raw.shape[1:]) != (T, D):
        raise ValueError(f"raw pools must be [num_raw, T={T}, D={D}]")
    return B, HQ, HKV, T, D


def plan(batch: int, kv_heads: int, group: int, block_size: int, head_dim: int, max_tokens: int,
         device: torch.device, config: LaunchConfig) -> dict:
    """Compile-time defines, grid and shared memory for one call (host arithmetic only)."""
    warps = config.num_warps or _default_warps(head_dim)
    stages = config.num_stages or _default_stages(head_dim, warps)
    loader = config.loader or "cp.async"
    if loader not in _LOADERS:
        raise ValueError(f"loader must be one of {sorted(_LOADERS)}, got {loader!r}")
    if stages < 1 or (stages == 1 and loader != "cp.async"):
        raise ValueError(f"num_stages must be >= 2, or 1 with the cp.async loader; got {stages} ({loader})")
    tile = 16 * warps
    smem = _smem_bytes(head_dim, warps, stages)
    if smem > MAX_SMEM:
        raise ValueError(f"head_dim {head_dim} with {warps} warps x {stages} stages needs {smem} B of shared "
                         f"memory per CTA (at most {MAX_SMEM}): use fewer warps or stages")
    splits = config.num_splits
    per_sm = config.ctas_per_sm or 1
    if splits is None:
        splits, per_sm = _choose_splits(batch * kv_heads, max_tokens, tile, smem, head_dim, device, config)
    tps = math.ceil(math.ceil(max_tokens / splits) / tile) * tile
    splits = max(1, math.ceil(max_tokens / tps))
    # the same dynamic shared memory also holds the warp merge and the split weights of the merge
    nt8 = 8 * math.ceil(group / 8)
    smem = max(smem, 4 * (2 * warps * nt8 + warps * nt8 * head_dim), merge_smem_bytes(group, splits))
    if smem > MAX_SMEM:
        raise ValueError(f"{splits} splits x {group} heads do not fit the merge in shared memory")
    defines = dict(HEAD_DIM=head_dim, GROUP=group, PAGE=block_size, WARPS=warps, STAGES=stages,
                   MIN_CTAS_PER_SM=per_sm, LOADER=_LOADERS[loader])
    return dict(defines=defines, smem=smem, splits=splits, tokens_per_split=tps, threads=32 * warps)


# registers per thread the kernel needs at each head_dim (sm_90a ptxas, tests/test_cuda_build.py):
# a CTAs-per-SM choice must leave them, or the kernel would spill
_REGS_NEEDED = {64: 96, 128: 128, 256: 208}


def _choose_splits(streams: int, max_tokens: int, tile: int, smem: int, head_dim: int, device,
                   config: LaunchConfig, regs_needed: dict | None = None,
                   threads: int | None = None) -> tuple[int, int]:
    """(splits, CTAs per SM) filling one wave as fully as possible.

    With ``streams`` = B * Hkv (sequence, kv head) pairs and ``splits`` each, the grid has
    streams * splits CTAs; one wave holds SMs * per_sm of them. One CTA per SM streams fastest
    (sweeps in eval/results/attention_bf16_h200.json), but when it leaves SMs idle (48 streams on
    132 SMs: 2 splits = 96 CTAs) more CTAs per SM fill them: the fullest wave wins, ties (within 5%)
    go to fewer CTAs per SM. Options are limited by shared memory and by the registers the kernel
    needs (64K / (threads * per_sm) per thread).
    """
    sms = _sm_count(device)
    cap = max(1, max_tokens // max(MIN_TOKENS_PER_SPLIT, tile))
    threads = threads or 2 * tile  # 32 * warps (the fused kernel adds its producer warps)
    need = next((r for d, r in sorted((regs_needed or _REGS_NEEDED).items()) if head_dim <= d), 255)
    best = None
    for per_sm in ([config.ctas_per_sm] if config.ctas_per_sm else [1, 2, 3, 4]):
        if per_sm > 1 and ((smem + 1024) * per_sm > SM_SMEM or 65536 // (threads * per_sm) < need
                           or threads * per_sm > 2048):
            continue
        slots = sms * per_sm
        splits = max(1, min(cap, slots // streams))
        ctas = streams * splits
        fill = ctas / (math.ceil(ctas / slots) * slots)  # busy fraction of the waves launched
        if best is None or fill > best[0] * 1.05:
            best = (fill, splits, per_sm)
    if best is None:
        raise ValueError(f"{config.ctas_per_sm} CTAs per SM do not fit: {smem} B of shared memory each, and the "
                         f"kernel needs {need} registers per thread")
    return best[1], best[2]


_SM_COUNT: dict = {}


def _sm_count(device: torch.device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def bf16_decode_attention(q: torch.Tensor, kv: PagedKV, *, scale: float | None = None,
                          launch: LaunchConfig | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode attention over a paged BF16 cache: ``kv`` as the cache hands it to any kernel
    (``gaac_hf.kernels.paged``); every table entry must be raw (< 0). q bf16 [B, Hq, D] -> bf16 [B, Hq, D]."""
    return bf16_decode_attention_tensors(
        q, kv.k.raw, kv.v.raw, kv.k.table, kv.v.table, kv.k.tail, kv.v.tail, kv.num_blocks, kv.tail_len,
        kv_start=kv.kv_start, scale=scale, active_blocks=kv.active_blocks, config=launch, out=out)


def bf16_decode_attention_tensors(q, k_raw, v_raw, k_table, v_table, k_tail, v_tail, num_blocks, tail_len,
                                  *, kv_start=None, scale=None, active_blocks=None, config=None, out=None):
    """The same on the tensors themselves (any head_dim multiple of 16 up to 256; the v2 ``PagedKV``
    geometry takes 64 / 128 / 256 only). Shapes in the module doc."""
    B, HQ, HKV, T, D = _check(q, k_raw, v_raw, k_table, v_table, k_tail, v_tail, num_blocks, tail_len, kv_start)
    max_blocks = k_table.shape[2]
    p, mod, out, part_o, part_lse, scale = prepare_launch(plan, SOURCE, q, HKV, T, max_blocks, active_blocks, config,
                                                         out, scale)
    splits = p["splits"]
    runtime.launch(mod, "gaac_bf16_decode_split", (splits, HKV, B), (p["threads"],), p["smem"],
                   q, k_raw, v_raw, k_table, v_table, k_tail, v_tail, num_blocks, tail_len, kv_start,
                   part_o, part_lse, out, p["counters"], np.int32(HKV), np.int32(max_blocks),
                   np.int32(p["tokens_per_split"]), np.float32(scale * LOG2E), device=q.device)
    return out


def prepare_launch(plan_fn, source: str, q: torch.Tensor, HKV: int, T: int, max_blocks: int, active_blocks,
                   config, out, scale):
    """What every split-KV decode launch of this folder needs before the launch: the plan (splits
    sized by the live blocks when ``active_blocks`` is given, else the table's capacity), the
    compiled module, the output, the split partials and the softmax scale."""
    B, HQ, D = q.shape
    blocks = max_blocks if active_blocks is None else min(int(active_blocks), max_blocks)
    config = config or LaunchConfig()
    p = plan_fn(B, HKV, HQ // HKV, T, D, blocks * T + T, q.device, config)
    p["merge_chunk"] = merge_chunk(HQ // HKV, p["splits"], D, config.merge_chunk)
    p["defines"] = dict(p["defines"], MERGE_CHUNK=p["merge_chunk"])
    p["counters"] = _counters(q.device, merge_counters(B, HKV, p["splits"], p["merge_chunk"]))
    mod = runtime.load(source, p["defines"], q.device)
    part_o, part_lse = split_partials(B, HQ, p["splits"], D, q.device)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    return p, mod, torch.empty_like(q) if out is None else out, part_o, part_lse, scale


def split_partials(B: int, HQ: int, splits: int, D: int, device) -> tuple:
    """fp32 per-split outputs ``[B, Hq, splits, D]`` and log-sum-exps ``[B, Hq, splits]`` that the
    last CTA of each (sequence, kv head) merges; (None, None) for one split (written straight out)."""
    if splits == 1:
        return None, None
    return (torch.empty(B, HQ, splits, D, device=device, dtype=torch.float32),
            torch.empty(B, HQ, splits, device=device, dtype=torch.float32))


_COUNTERS: dict = {}


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 arrival counters of the in-kernel split merge, one buffer per (device, stream).

    The kernel returns every counter it uses to zero, so the buffer is allocated (zeroed) once and
    stays valid across calls and CUDA-graph replays. One buffer per stream keeps concurrent streams
    apart. It grows (a new zeroed buffer) when a call needs more (sequence, kv head) pairs.
    """
    key = (device, torch.cuda.current_stream(device).cuda_stream)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = _COUNTERS[key] = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
    return buf


def pack_paged_bf16(x: torch.Tensor, seq_lens: list[int], block_size: int, *, shuffle: bool = True,
                    generator: torch.Generator | None = None) -> dict:
    """Dense bf16 ``[B, Hkv, S, D]`` (sequence b valid in ``[:seq_lens[b]]``) -> a paged BF16 cache.

    Every complete block goes to the raw pool (in a shuffled order when ``shuffle``, so the block
    table's indirection is exercised); the rest of each sequence to its tail. Any head_dim.
    Returns dict(raw [num_raw, T, D], table int32 [B, Hkv, max_blocks], tail [B, Hkv, T, D],
    num_blocks int32 [B], tail_len int32 [B], max_blocks).
    """
    B, H, S, D = x.shape
    T = block_size
    dev = x.device
    nbs = [n // T for n in seq_lens]
    maxb = max(1, max(nbs))
    n = sum(H * nb for nb in nbs)
    blocks = [x[b, :, : nbs[b] * T].reshape(H * nbs[b], T, D) for b in range(B)]
    raw = torch.cat(blocks) if n else x.new_zeros(0, T, D)
    order = torch.randperm(n, generator=generator, device="cpu").to(dev) if shuffle and n else torch.arange(n, device=dev)
    pool = torch.empty_like(raw)
    pool[order] = raw  # block k lives in pool row order[k]
    table = torch.zeros(B, H, maxb, dtype=torch.int32, device=dev)
    tail = torch.zeros(B, H, T, D, dtype=torch.bfloat16, device=dev)
    k = 0
    for b in range(B):
        table[b, :, : nbs[b]] = (-1 - order[k: k + H * nbs[b]]).to(torch.int32).reshape(H, nbs[b])
        k += H * nbs[b]
        r = seq_lens[b] - nbs[b] * T
        tail[b, :, :r] = x[b, :, nbs[b] * T: seq_lens[b]]
    if pool.shape[0] == 0:
        pool = x.new_zeros(1, T, D)
    return dict(raw=pool.contiguous(), table=table, tail=tail, max_blocks=maxb,
                num_blocks=torch.tensor(nbs, dtype=torch.int32, device=dev),
                tail_len=torch.tensor([s - nb * T for s, nb in zip(seq_lens, nbs)], dtype=torch.int32, device=dev))
