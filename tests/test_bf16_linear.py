"""tests/bf16_linear.py (the FP32-GEMM path for BF16 linear layers on CPUs without BF16 dot products)
computes what a BF16 GEMM computes: exactly widened operands, FP32 accumulation, one rounding."""
from __future__ import annotations

import torch

import bf16_linear


def test_fp32_path_is_one_rounding_of_the_exact_fp32_product(monkeypatch):
    monkeypatch.setitem(bf16_linear.ACTIVE, "on", True)
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(96, 40, bias=True).to(torch.bfloat16)
    x = (torch.randn(7, 96, generator=g) * 3).to(torch.bfloat16)
    with torch.no_grad():
        got = bf16_linear.forward(lin, x)
        want = torch.nn.functional.linear(x.double(), lin.weight.double(), lin.bias.double())
        stock = bf16_linear._STOCK(lin, x)
    assert got.dtype == torch.bfloat16 and got.shape == (7, 40)
    # one BF16 rounding (half an ulp: 2^-8 relative) of an FP32 sum (n 2^-24 of the sum of |terms|)
    mag = torch.nn.functional.linear(x.double().abs(), lin.weight.double().abs(), lin.bias.double().abs())
    err = (got.double() - want).abs()
    assert bool((err <= want.abs() * 2.0 ** -8 + 97 * 2.0 ** -24 * mag).all())
    # and torch's own BF16 kernel lands on the same BF16 value but where FP32 sums round differently
    assert (got.view(torch.int16) != stock.view(torch.int16)).float().mean() < 0.02
    # a weight changed in place is seen (its FP32 copy is renewed)
    with torch.no_grad():
        lin.weight.mul_(2)
        assert torch.equal(bf16_linear.forward(lin, x), torch.nn.functional.linear(
            x.float(), lin.weight.float(), lin.bias.float()).to(torch.bfloat16))


def test_off_or_other_dtypes_take_the_stock_kernel(monkeypatch):
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(2, 8)
    monkeypatch.setitem(bf16_linear.ACTIVE, "on", True)
    assert torch.equal(bf16_linear.forward(lin, x), bf16_linear._STOCK(lin, x))  # float32: untouched
    monkeypatch.setitem(bf16_linear.ACTIVE, "on", False)
    lb, xb = lin.to(torch.bfloat16), x.to(torch.bfloat16)
    assert torch.equal(bf16_linear.forward(lb, xb), bf16_linear._STOCK(lb, xb))
    assert not hasattr(lb.weight, "_gaac_test_fp32")
