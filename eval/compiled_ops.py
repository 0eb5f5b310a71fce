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

With ``fuse=True`` (``--compile-ops fused``) more fusions cut a layer's kernels from ~19 to ~11, as serving engines
lay out the same model (vLLM's fused QKV and gate-up projections; the residual add in the GEMM's epilogue):
    q_proj, k_proj, v_proj -> one GEMM over the three weights stacked (each projection's weight becomes a view of
        the stacked buffer: same values, no copy kept); k_proj / v_proj return their slices of it
    q_norm, k_norm folded into the compiled rotary embedding (norm then rotate, one kernel for q and k)
    gate_proj, up_proj -> one GEMM over the two weights stacked, SiLU(gate) * up on its halves
    o_proj and down_proj with the residual add inside the GEMM (``residual.addmm_(x, W^T)``: cuBLAS adds the
        residual in its epilogue, in place, so no copy of it first; the decoder layer's forward swapped to hand
        them the residual, which it overwrites: no hidden states may be returned under ``fuse=True``)
Every cache kind runs the same fused model, so the comparison between caches stays like for like; the logits move
within BF16 rounding of the unfused model (a GEMM over stacked weights may sum in another order).

The patch is undone on exit (the forwards; the weights stay views of the stacked buffers, with the same values). It follows the Liger-Kernel pattern of swapping a model family's module forwards for
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


def _silu_mul_halves(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _linear_add(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``residual += x @ weight^T`` in place, as one GEMM with the add in its epilogue (beta = 1 on the residual's own
    buffer); returns ``residual``. x [..., K], weight [N, K], residual [..., N] contiguous.

    In place because the out-of-place ``torch.addmm(residual, ...)`` first copies the residual into its result: a
    device-to-device memcpy per GEMM, 72 per step of the 36-layer model (call Y29's kernel tables). The residuals
    overwritten are the decoder layer's input and its attention half's output, which nothing reads afterwards when
    no hidden states are returned (the decode steps this module serves)."""
    residual.view(-1, residual.shape[-1]).addmm_(x.reshape(-1, x.shape[-1]), weight.t())
    return residual


def _stack_weights(linears) -> torch.Tensor:
    """One buffer holding the linears' weights stacked on the output dimension; each weight becomes a view of it."""
    if any(lin.bias is not None for lin in linears):
        raise ValueError("fused projections take bias-free linears (Qwen3 without attention_bias)")
    stacked = torch.cat([lin.weight.data for lin in linears], 0)
    at = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight.data = stacked[at: at + n]
        at += n
    return stacked


def _qk_norm_rope(q, k, cos, sin, wq, wk, eps: float, rope):
    # Qwen3Attention's q_norm / k_norm (RMSNorm over head_dim: the transpose before the rotation does not move it),
    # then the rotary embedding, in one compiled function
    return rope(_rms_norm(q, wq, eps), _rms_norm(k, wk, eps), cos, sin)


@contextmanager
def _fused_layers(model, norms: dict, compile_):
    """The fusions of ``fuse=True`` on every Qwen3 decoder layer of ``model``, as instance forwards (removed on exit).
    ``norms`` receives the q_norm / k_norm weights of the attention in flight; the rotary wrapper applies them.
    ``compile_``: torch.compile with the caller's settings (dynamic, inductor options)."""
    from transformers.models.qwen3 import modeling_qwen3 as m

    silu_halves = compile_(_silu_mul_halves)
    patched = []
    pending: dict = {}  # what the stacked q/k/v GEMM left for k_proj and v_proj; the residuals of the layer in flight

    def setf(mod, fn):
        mod.forward = fn
        patched.append(mod)

    def q_proj(x, qkv, nq, nk):
        out = F.linear(x, qkv)
        pending["k"], pending["v"] = out[..., nq: nq + nk], out[..., nq + nk:]
        return out[..., :nq]

    def record(key, norm, x):
        norms[key], norms["eps"] = norm.weight, norm.variance_epsilon
        return x

    def layer_forward(hidden_states, layer, **kwargs):
        # Qwen3DecoderLayer.forward with the two residual adds moved into o_proj's and down_proj's GEMMs
        pending["residual"] = hidden_states
        s, _ = layer.self_attn(hidden_states=layer.input_layernorm(hidden_states), **kwargs)  # residual + attention
        pending["residual"] = s
        return layer.mlp(layer.post_attention_layernorm(s))  # s + MLP

    for layer in [mod for mod in model.modules() if isinstance(mod, m.Qwen3DecoderLayer)]:
        attn, mlp = layer.self_attn, layer.mlp
        nq, nk = attn.q_proj.weight.shape[0], attn.k_proj.weight.shape[0]
        qkv = _stack_weights([attn.q_proj, attn.k_proj, attn.v_proj])
        gate_up = _stack_weights([mlp.gate_proj, mlp.up_proj])
        setf(attn.q_proj, lambda x, qkv=qkv, nq=nq, nk=nk: q_proj(x, qkv, nq, nk))
        setf(attn.k_proj, lambda x: pending.pop("k"))
        setf(attn.v_proj, lambda x: pending.pop("v"))
        setf(attn.q_norm, lambda x, n=attn.q_norm: record("wq", n, x))
        setf(attn.k_norm, lambda x, n=attn.k_norm: record("wk", n, x))
        setf(attn.o_proj, lambda x, w=attn.o_proj.weight: _linear_add(x, w, pending.pop("residual")))
        setf(mlp, lambda x, mlp=mlp, gate_up=gate_up: _linear_add(silu_halves(F.linear(x, gate_up)), mlp.down_proj.weight,
                                                                   pending.pop("residual")))
        setf(layer, lambda hidden_states, layer=layer, **kw: layer_forward(hidden_states, layer, **kw))
    try:
        yield ["q/k/v projections stacked", "q_norm / k_norm in the rotary embedding", "gate / up projections stacked",
               "residual adds in the o_proj / down_proj GEMMs"]
    finally:
        for mod in patched:
            del mod.forward
        pending.clear()
        norms.clear()


def _inductor_has_pdl() -> bool:
    import torch._inductor.config as inductor_config

    return hasattr(inductor_config.triton, "enable_pdl")


@contextmanager
def compiled_qwen3_ops(model, dynamic: bool = False, fuse: bool = False, combo: bool = False, pdl: bool = False):
    """Swap Qwen3's RMSNorm, rotary embedding and SiLU-gate for torch.compile'd functions; restore them on exit.
    ``fuse``: also the fusions of the module docstring (fewer kernels per layer). ``combo``: inductor's horizontal
    fusion (``combo_kernels``) in every compiled function, so kernels without a data dependence share a launch (the
    q and k halves of the normed rotary embedding were two kernels per layer in call Y29's tables; GPU only).
    ``pdl``: inductor's programmatic dependent launch (``triton.enable_pdl``, sm_90+): each compiled kernel is launched
    while its predecessor finishes and waits in-kernel (``gdc_wait``) before reading its inputs, so under a CUDA graph
    the launch latency between kernels can overlap the previous kernel's tail (the graph gaps of calls Y29/Y32).

    Yields the list of names patched (recorded in the benchmark's JSON). Compilation happens on the first call at
    each new shape: run an eager step at the decode shape before capturing a CUDA graph.
    """
    from transformers.models.qwen3 import modeling_qwen3 as m

    if model.config.model_type != "qwen3" or model.config.hidden_act != "silu":
        raise ValueError(f"compiled_qwen3_ops patches Qwen3 models with hidden_act='silu', not "
                         f"{model.config.model_type} with {model.config.hidden_act!r}")
    limit = torch._dynamo.config.cache_size_limit
    torch._dynamo.config.cache_size_limit = max(limit, 64)  # prefill chunks and decode steps: one graph per shape
    options = {}
    if combo:
        options["combo_kernels"] = True
    if pdl:
        if not _inductor_has_pdl():
            raise RuntimeError(f"torch {torch.__version__} has no torch._inductor.config.triton.enable_pdl: "
                               "programmatic dependent launch needs a newer torch")
        options["triton.enable_pdl"] = True
    options = options or None
    compile_ = lambda fn: torch.compile(fn, dynamic=dynamic, options=options)  # noqa: E731
    rms = compile_(_rms_norm)
    silu_mul = compile_(_silu_mul)
    orig_rope = m.apply_rotary_pos_emb
    rope = compile_(lambda q, k, cos, sin: orig_rope(q, k, cos, sin))
    orig_norm, orig_mlp = m.Qwen3RMSNorm.forward, m.Qwen3MLP.forward

    def norm_forward(self, hidden_states):
        return rms(hidden_states, self.weight, self.variance_epsilon)

    def mlp_forward(self, x):
        return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))

    norms: dict = {}  # fuse: the q_norm / k_norm weights of the attention in flight
    qk_rope = compile_(lambda q, k, cos, sin, wq, wk, eps: _qk_norm_rope(q, k, cos, sin, wq, wk, eps, orig_rope))

    def rope_forward(q, k, cos, sin, *args, **kwargs):
        if norms and not args and not kwargs:
            wq, wk, eps = norms.pop("wq"), norms.pop("wk"), norms.pop("eps")
            return qk_rope(q, k, cos, sin, wq, wk, eps)
        return rope(q, k, cos, sin, *args, **kwargs)

    m.Qwen3RMSNorm.forward, m.Qwen3MLP.forward, m.apply_rotary_pos_emb = norm_forward, mlp_forward, rope_forward
    try:
        names = ["Qwen3RMSNorm.forward", "modeling_qwen3.apply_rotary_pos_emb", "Qwen3MLP.forward (SiLU * up)"]
        if combo:
            names.append("combo_kernels (inductor's horizontal fusion)")
        if pdl:
            names.append("triton.enable_pdl (programmatic dependent launch)")
        if fuse:
            with _fused_layers(model, norms, compile_) as fused:
                yield names + fused
        else:
            yield names
    finally:
        m.Qwen3RMSNorm.forward, m.Qwen3MLP.forward, m.apply_rotary_pos_emb = orig_norm, orig_mlp, orig_rope
        torch._dynamo.config.cache_size_limit = limit
