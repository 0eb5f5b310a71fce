"""Peak bytes of the tensors a block of code creates, on any device (the CPU has no allocator stats).

:class:`TensorBytesMeter` watches every tensor an aten op returns inside it (a ``TorchDispatchMode``)
and adds up the storages alive at each moment: a storage counts from the first op that returns it
until the last tensor object seen on it is freed. Tensors created before the block (weights, inputs)
are not counted, nor views of them; views of a counted storage keep it alive. Reservations
(:mod:`gaac_hf.cache.reserve`: CPU pools that grow in place) are not storages an op returns: their
pages in use (:func:`~gaac_hf.cache.reserve.committed_bytes`, change since the block began) are added. It is how ``eval/memory_report.py`` and
``tests/test_cache_memory.py`` compare ``generate()`` with GAACCache and with DynamicCache on the CPU
(on CUDA use ``torch.cuda.max_memory_allocated``).
"""
from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from . import reserve


class TensorBytesMeter(TorchDispatchMode):
    """``with TensorBytesMeter() as m: ...``; then ``m.peak_bytes`` (and ``m.live_bytes``)."""

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self._storages: dict[int, list] = {}  # storage key -> [nbytes, live tensor count]
        self._reserved0 = reserve.committed_bytes()

    def _peak(self) -> None:
        self.peak_bytes = max(self.peak_bytes, self.live_bytes + reserve.committed_bytes() - self._reserved0)

    def _track(self, t: torch.Tensor, aliased: bool) -> None:
        st = t.untyped_storage()
        key = (st.data_ptr(), st.device.type, st.device.index)
        entry = self._storages.get(key)
        if entry is None:
            if aliased:  # a view of (or in-place op on) a storage from before the block: not counted
                return
            entry = self._storages[key] = [st.nbytes(), 0]
            self.live_bytes += entry[0]
        entry[1] += 1
        weakref.finalize(t, self._release, key, entry)

    def _release(self, key, entry) -> None:
        entry[1] -= 1
        if entry[1] == 0 and self._storages.get(key) is entry:
            del self._storages[key]
            self.live_bytes -= entry[0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        aliased = any(r.alias_info is not None for r in func._schema.returns)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
                self._track(t, aliased)
        self._peak()
        return out


def dynamic_cache_bytes(kv: list[tuple[torch.Tensor, torch.Tensor]], tokens: int) -> int:
    """Bytes a DynamicCache holds for the first ``tokens`` positions of ``kv`` (its tensors are
    exactly that long: it grows by concatenation)."""
    return sum((k[:, :, :tokens].numel() + v[:, :, :tokens].numel()) * k.element_size() for k, v in kv)


def walk_allocation(cache, kv: list[tuple[torch.Tensor, torch.Tensor]], prefill: int, stop: int) -> list[dict]:
    """Feed K/V into ``cache``'s first ``len(kv)`` layers: ``prefill`` tokens at once, then one token per
    step up to ``stop``, reading ``cache.stats()`` after the prefill and after every step. ``kv``: per
    layer (keys, values) bf16 ``[B, Hkv, >= stop, D]``. Returns one row per length:
    ``{tokens, allocated_bytes, resident_bytes, dynamic_bytes}`` (``dynamic_bytes``: what a DynamicCache
    holds for the same layers and tokens)."""
    rows = []
    n = 0
    while n < stop:
        q = prefill if n == 0 else 1
        for layer, (k, v) in zip(cache.layers, kv):
            layer.append(k[:, :, n : n + q], v[:, :, n : n + q])
        n += q
        st = cache.stats()
        rows.append({"tokens": n, "allocated_bytes": st["allocated_bytes"], "resident_bytes": st["resident_bytes"],
                     "dynamic_bytes": dynamic_cache_bytes(kv, n)})
    return rows
