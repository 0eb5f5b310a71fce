"""BF16 linear layers through FP32 GEMM on CPUs without BF16 dot-product instructions (tests only).

On a CPU without AVX512-BF16 or AMX (this project's CI machines are at times AVX2-only EPYCs), torch 2.13's
BF16 GEMM runs at 8.3 GFLOP/s on one core against 46.5 for FP32 (512 x 576 @ 576 x 1536, measured in session
14), and a SmolLM2 forward of 512 tokens takes ~18 s: the real-model tests spend most of CI there. A BF16
GEMM widens its BF16 operands to FP32 exactly, accumulates in FP32 and rounds the result to BF16; this does
the same with torch's FP32 GEMM (operands widened exactly, FP32 accumulation, one round to nearest even at
the end), so only the order of the FP32 additions can differ from the stock kernel. Every test compares
GAAC against a BF16 baseline run through the same model code in the same process, so both sides see the
same arithmetic either way. ``GAAC_TEST_BF16_LINEAR=stock`` keeps torch's kernel, ``=fp32`` forces this path;
the default (``auto``) takes it only on a CPU-only machine whose CPU lacks those instructions. Tests that
meter tensor bytes (the FP32 copies would count) use the ``stock_bf16_linear`` fixture.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

_STOCK = torch.nn.Linear.forward
ACTIVE = {"on": False}


def cpu_has_bf16_dot() -> bool:
    """Whether this CPU has AVX512-BF16 or AMX-BF16 (Linux /proc/cpuinfo; False where it cannot tell)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def wanted() -> bool:
    mode = os.environ.get("GAAC_TEST_BF16_LINEAR", "auto")
    if mode not in ("auto", "stock", "fp32"):
        raise ValueError(f"GAAC_TEST_BF16_LINEAR must be auto, stock or fp32, got {mode!r}")
    if mode != "auto":
        return mode == "fp32"
    return not torch.cuda.is_available() and not cpu_has_bf16_dot()


def _fp32(w: torch.Tensor) -> torch.Tensor:
    """The FP32 copy kept on the weight itself (it lives and dies with it), renewed if it changed in place."""
    hit = getattr(w, "_gaac_test_fp32", None)
    if hit is None or hit[0] != w._version:
        hit = (w._version, w.detach().float())
        w._gaac_test_fp32 = hit
    return hit[1]


def forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    w = self.weight
    if (not ACTIVE["on"] or x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16 or x.device.type != "cpu"
            or torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)):
        return _STOCK(self, x)
    b = None if self.bias is None else _fp32(self.bias)
    return F.linear(x.float(), _fp32(w), b).to(torch.bfloat16)


def install() -> None:
    torch.nn.Linear.forward = forward
    ACTIVE["on"] = True


def uninstall() -> None:
    torch.nn.Linear.forward = _STOCK
    ACTIVE["on"] = False
