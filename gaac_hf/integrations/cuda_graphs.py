"""Decode steps replayed from CUDA graphs: :class:`DecodeGraphs` (a step function) and
:func:`cuda_graphs` (``model.generate`` with its decode steps replayed).

Eager decode steps of an 8B model spend more time in Python than on the GPU (36 layers of module calls,
mask construction, kernel launches: 28-128 ms of wall time per step for 9-36 ms of GPU time on the H200,
``eval/results/e2e_h200_graphs_64k.json``). A captured graph replays the whole step's kernels with one launch.

:class:`DecodeGraphs` captures the model's forward over static input buffers (token ids ``[B, 1]``,
position ids ``[B, 1]``, ``cache_position`` ``[1]``, no attention mask) and replays it. Over a
:class:`~gaac_hf.cache.GAACCache` the cache runs in graph mode (:mod:`gaac_hf.cache.graphs`): two graphs,
one for steps whose token goes to the tail and one for steps that close a block, chosen per step from
the host counts. Each kind's first step runs eagerly (on a side stream: it warms up the libraries and
compiles the kernels), its second is captured and replayed, later ones replay. Over a cache that is
graph-safe by itself (``StaticCache``: ``is_compileable``) there is one graph.

The design follows the capture-and-replay pattern of ``torch.cuda.graphs`` (static inputs, warm-up on a
side stream, one private memory pool per graph) and the way serving engines size a graph for a decode
horizon; what is GAAC's own is the split of a step into the two kinds and the counts on the device.

Outputs: logits ``[B, 1, V]`` in the graph's static buffer, valid until the next step (:func:`cuda_graphs`
hands ``generate`` a copy). Tokens and logits of graph steps are bit-identical to the same steps run
eagerly in graph mode (``capture=False``; ``tests/test_cuda_graphs*.py``); against ordinary eager GAAC
steps the attention differs only in its split-KV grid (sized for the reserved blocks), i.e. in the
order of the fp32 split merge.

Not covered: beam search (reordered tables move: each reorder costs a re-capture), sliding-window or
hybrid caches (eager steps), ``output_attentions`` / ``output_hidden_states`` (eager steps).
"""
from __future__ import annotations

import contextlib

import torch

from ..cache.graphs import APPEND, DecodeGraphState


def _is_gaac(cache) -> bool:
    from ..cache.layer import GAACLayer

    return any(isinstance(layer, GAACLayer) for layer in getattr(cache, "layers", ()))


class DecodeGraphs:
    """Decode steps of ``model`` over a prefilled ``cache``, replayed from CUDA graphs.

    Args:
        model: a causal LM (``model(input_ids=..., position_ids=..., cache_position=..., past_key_values=...)``).
        cache: a prefilled GAACCache (every layer a GAAC layer, format v3 with the fused kernel) or a
            graph-safe cache (``StaticCache``).
        horizon: decode steps to reserve room for (GAAC); more steps reserve and capture again.
        kv_start: int32 ``[B]`` left-padding positions per row, or None (positions then start at the
            cache's length in every row).
        capture: False runs every step eagerly through the same code (CPU tests, and the reference the
            GPU tests compare graph replays with).
        seq_length: tokens per row the cache holds; needed for a StaticCache (which cannot say so without
            a host sync), read from a GAACCache.
        forward: what runs the model (default ``model`` itself; :func:`cuda_graphs` passes the forward it
            replaced).
    """

    def __init__(self, model, cache, horizon: int = 256, *, kv_start: torch.Tensor | None = None,
                 capture: bool = True, seq_length: int | None = None, forward=None) -> None:
        self.model, self.cache, self.horizon, self.capture = model, cache, horizon, capture
        self._forward = forward if forward is not None else model
        self._cache_name, self._takes_cache_position = _names(model)
        dev = model.device
        if capture and dev.type != "cuda":
            raise ValueError(f"CUDA-graph capture needs a CUDA model, this one is on {dev}: pass capture=False")
        self.gaac = DecodeGraphState(cache, horizon, kv_start) if _is_gaac(cache) else None
        if self.gaac is None and not getattr(cache, "is_compileable", False):
            raise ValueError(f"{type(cache).__name__} is neither a GAACCache nor graph-safe (is_compileable): "
                             "use StaticCache for BF16 graph replays")
        b = self.gaac.batch if self.gaac is not None else cache.layers[0].keys.shape[0]
        if seq_length is None:
            if self.gaac is None:
                raise ValueError("pass seq_length for a StaticCache (its length is not known without a host sync)")
            seq_length = cache.get_seq_length()
        seq = seq_length
        self.ids = torch.zeros(b, 1, dtype=torch.long, device=dev)
        self.cache_position = torch.full((1,), seq, dtype=torch.long, device=dev)
        start = torch.zeros(b, dtype=torch.long, device=dev) if kv_start is None else kv_start.to(dev, torch.long)
        self.position_ids = (seq - start).view(b, 1)
        self.graphs: dict = {}
        self.logits: dict = {}
        self._warm: set = set()
        self._pools: dict = {}
        self.replays = 0
        self.eager_steps = 0

    def _run(self, kind: str) -> torch.Tensor:
        if self.gaac is not None:
            self.gaac.pre(kind)
        kw = {self._cache_name: self.cache}
        if self._takes_cache_position:
            kw["cache_position"] = self.cache_position
        out = self._forward(input_ids=self.ids, position_ids=self.position_ids, use_cache=True, **kw)
        if self.gaac is not None:
            self.gaac.post(kind)
        self.cache_position.add_(1)
        self.position_ids.add_(1)
        return out.logits

    def _reserve_again(self) -> None:
        # the cache moved (beam reorder, crop, a prefill) or the horizon is used up: reserve, capture anew
        self.gaac.reserve(self.horizon)
        self.graphs.clear()
        self.logits.clear()
        self._warm.clear()

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
             cache_position: torch.Tensor | None = None) -> torch.Tensor:
        """One decode step: ``input_ids`` int64 ``[B, 1]`` (device tensors: copied without a host sync);
        ``position_ids`` ``[B, 1]`` / ``cache_position`` ``[1]`` when the caller tracks them (else this
        object advances its own). Returns logits ``[B, 1, V]``, valid until the next step."""
        kind = APPEND
        if self.gaac is not None:
            if not self.gaac.valid():
                self._reserve_again()
            kind = self.gaac.kind()
        self.ids.copy_(input_ids)
        if position_ids is not None:
            self.position_ids.copy_(position_ids)
        if cache_position is not None:
            self.cache_position.copy_(cache_position)
        if not self.capture:
            logits = self._run(kind)
            self.eager_steps += 1
        elif kind in self.graphs:
            self.graphs[kind].replay()
            logits = self.logits[kind]
            self.replays += 1
        elif kind not in self._warm:
            side = torch.cuda.Stream(self.ids.device)
            side.wait_stream(torch.cuda.current_stream(self.ids.device))
            with torch.cuda.stream(side):
                logits = self._run(kind)
            torch.cuda.current_stream(self.ids.device).wait_stream(side)
            self._warm.add(kind)
            self.eager_steps += 1
        else:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pools.setdefault(kind, torch.cuda.graph_pool_handle())):
                self.logits[kind] = self._run(kind)
            self.graphs[kind] = graph
            graph.replay()
            logits = self.logits[kind]
            self.replays += 1
        if self.gaac is not None:
            self.gaac.advance_host(kind)
        return logits

    def close(self) -> None:
        """Leave graph mode (the cache takes eager steps again) and free the graphs."""
        if self.gaac is not None:
            self.gaac.detach()
        self.graphs.clear()
        self.logits.clear()


_EAGER_KWARGS = ("inputs_embeds", "output_attentions", "output_hidden_states", "pixel_values")


def _names(model) -> tuple[str, bool]:
    """The cache argument's name of ``model.forward`` (``cache`` from transformers 5.23 on,
    ``past_key_values`` before) and whether it takes ``cache_position`` (5.17 does, 5.24 does not)."""
    import inspect

    from ..models import cache_keyword

    return cache_keyword(model.forward), "cache_position" in inspect.signature(model.forward).parameters


@contextlib.contextmanager
def cuda_graphs(model, cache, horizon: int = 256, *, capture: bool = True):
    """Inside the block, ``model``'s decode steps over ``cache`` (one token per row, ``cache`` the call's
    cache) replay CUDA graphs (:class:`DecodeGraphs`); every other call (the prefill, other caches,
    hidden states or attentions asked for) runs the model's own forward. Yields a namespace whose
    ``runner`` is the current :class:`DecodeGraphs` (None before the first decode step); on exit the
    model's forward is restored and the cache leaves graph mode. Left padding is taken from the first
    decode step's 2D ``attention_mask`` (its leading zeros; later masks only append ones, as in
    ``generate``).

        with cuda_graphs(model, cache, horizon=max_new_tokens):
            out = model.generate(**inputs, cache=cache, max_new_tokens=max_new_tokens)  # past_key_values= before 5.24
    """
    import dataclasses
    import inspect
    from types import SimpleNamespace

    from transformers.modeling_outputs import CausalLMOutputWithPast

    if "forward" in vars(model):
        raise RuntimeError("model.forward is already replaced on this instance (nested cuda_graphs?)")
    original = model.forward
    cache_name, _ = _names(model)
    out_field = "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"
    session = SimpleNamespace(runner=None)  # the DecodeGraphs of the current decode run, if any

    def forward(*args, **kwargs):
        ids = kwargs.get("input_ids")
        decode = (not args and kwargs.get(cache_name, kwargs.get("past_key_values")) is cache and ids is not None
                  and ids.shape[1] == 1 and cache.get_seq_length() > 0 and not any(kwargs.get(k) for k in _EAGER_KWARGS))
        if not decode:
            if session.runner is not None:  # a prefill or another call: the cache takes it eagerly
                session.runner.close()
                session.runner = None
            return original(*args, **kwargs)
        if session.runner is None:
            mask, kv_start = kwargs.get("attention_mask"), None
            if mask is not None and mask.dim() == 2:
                kv_start = (mask == 0).sum(-1, dtype=torch.int32)
            session.runner = DecodeGraphs(model, cache, horizon, kv_start=kv_start, capture=capture, forward=original)
        logits = session.runner.step(ids, kwargs.get("position_ids"), kwargs.get("cache_position"))
        return CausalLMOutputWithPast(logits=logits.clone(), **{out_field: cache})

    forward.__signature__ = inspect.signature(original)  # generate() reads which inputs forward takes
    model.forward = forward
    try:
        yield session
    finally:
        del model.forward
        if session.runner is not None:
            session.runner.close()
