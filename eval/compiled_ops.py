"""The Qwen3 model's small element-wise ops, compiled by torch.compile, for the end-to-end benchmark (--compile-ops).

Why: in CUDA-graph mode a decode step of the 36-layer 8B-shaped model replays ~2,300 kernels, ~60 per layer, most
of them the model's own element-wise ops (four RMSNorms of seven kernels each, rotary embedding ~10, SiLU and the
gate product). A replayed graph still spends ~1 us between kernels, so wall time per step sits 13-28% above the
kernels' busy time whatever the KV cache does (lab/cuda-decode-notebook.md, "Where the graph-mode gaps come from").
A user who replays decode steps from graphs compiles these ops; this module does the same for the benchmark, to
every cache kind alike (the BF16 baselines and GAAC run the same compiled functions), so the K/V the caches store
and the attention arithmetic are untouched: only the kernel count of the model's own code changes.

What is compiled (each once, as a free function of tensors, so the 36 layers share one compiled graph per shape):
    RMSNorm (Qwen3RMSNorm.forward: input, post-attention, q_norm, k_norm)   x [..., D] -> [..., D]
    rotary embedding (modeling_qwen3.apply_rotary_pos_emb)                  q [B, Hq, T, D], k [B, Hkv, T, D]
    SiLU(gate) * up (inside Qwen3MLP.forward; the three projections stay cuBLAS GEMMs)

The patch is undone on exit. It follows the Liger-Kernel pattern of swapping a model family's module forwards for
fused ones, with torch.compile (inductor) generating the fused kernels instead of hand-written Triton.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # the same arithmetic as Qwen3RMSNorm.forward (float32 statistics, cast back, then the weight)
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


@contextmanager
def compiled_qwen3_ops(model, dynamic: bool = False):
    """Swap Qwen3's RMSNorm, rotary embedding and SiLU-gate for torch.compile'd functions; restore them on exit.

    Yields the list of names patched (recorded in the benchmark's JSON). Compilation happens on the first call at
    each new shape: run an eager step at the decode shape before capturing a CUDA graph.
    """
    from transformers.models.qwen3 import modeling_qwen3 as m

    if model.config.model_type != "qwen3" or model.config.hidden_act != "silu":
        raise ValueError(f"compiled_qwen3_ops patches Qwen3 models with hidden_act='silu', not "
                         f"{model.config.model_type} with {model.config.hidden_act!r}")
    limit = torch._dynamo.config.cache_size_limit
    torch._dynamo.config.cache_size_limit = max(limit, 64)  # prefill chunks and decode steps: one graph per shape
    rms = torch.compile(_rms_norm, dynamic=dynamic)
    silu_mul = torch.compile(_silu_mul, dynamic=dynamic)
    orig_rope = m.apply_rotary_pos_emb
    rope = torch.compile(lambda q, k, cos, sin: orig_rope(q, k, cos, sin), dynamic=dynamic)
    orig_norm, orig_mlp = m.Qwen3RMSNorm.forward, m.Qwen3MLP.forward

    def norm_forward(self, hidden_states):
        return rms(hidden_states, self.weight, self.variance_epsilon)

    def mlp_forward(self, x):
        return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))

    m.Qwen3RMSNorm.forward, m.Qwen3MLP.forward, m.apply_rotary_pos_emb = norm_forward, mlp_forward, rope
    try:
        yield ["Qwen3RMSNorm.forward", "modeling_qwen3.apply_rotary_pos_emb", "Qwen3MLP.forward (SiLU * up)"]
    finally:
        m.Qwen3RMSNorm.forward, m.Qwen3MLP.forward, m.apply_rotary_pos_emb = orig_norm, orig_mlp, orig_rope
        torch._dynamo.config.cache_size_limit = limit
