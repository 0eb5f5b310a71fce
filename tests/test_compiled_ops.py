"""eval/compiled_ops.py (bench_e2e --compile-ops): the Qwen3 model's element-wise ops compiled for every cache kind
alike. CPU, tiny random model: the patch engages torch.compile, keeps the model's arithmetic within BF16 rounding of
the eager ops, leaves GAAC's logits bit-identical to a BF16 DynamicCache's under the same patch, and is undone."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

EVAL = Path(__file__).resolve().parents[1] / "eval"


@pytest.fixture(scope="module")
def mods():
    sys.path.insert(0, str(EVAL))
    try:
        import bench_e2e
        import compiled_ops
    finally:
        sys.path.remove(str(EVAL))
    return bench_e2e, compiled_ops


@pytest.mark.parametrize("fuse,combo", [(False, False), (True, False), (True, True)], ids=["ops", "fused", "fused-combo"])
def test_compiled_ops_engage_match_eager_and_are_undone(mods, fuse, combo):
    bench, co = mods
    from torch._dynamo.utils import counters
    from transformers import DynamicCache

    import gaac_hf
    from gaac_hf.models import cache_kwargs

    model = bench.build_model(torch.device("cpu"), tiny=True)
    table = bench.calibrate_random(model, torch.device("cpu"), tokens=256)
    g = torch.Generator().manual_seed(3)
    ids, nxt = torch.randint(0, 512, (2, 130), generator=g), torch.randint(0, 512, (2, 1), generator=g)
    pos = torch.full((2, 1), 130)

    def logits(cache):  # prefill and one decode step (two 64-token blocks encoded, a 2-token tail)
        model(ids, **cache_kwargs(model, cache))
        return model(nxt, **cache_kwargs(model, cache), position_ids=pos).logits

    def forwards():  # every module's own forward (an instance attribute shadows the class's)
        return [(mod, "forward" in vars(mod)) for mod in model.modules()]

    gaac_hf.register()
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        eager = logits(DynamicCache(config=model.config))
        graphs_before = counters["stats"]["unique_graphs"]
        before = forwards()
        with co.compiled_qwen3_ops(model, fuse=fuse, combo=combo) as names:
            fused_mods = sum(own for _, own in forwards())
            compiled = logits(DynamicCache(config=model.config))
            model.set_attn_implementation("gaac")
            compiled_gaac = logits(gaac_hf.GAACCache(model.config, calibration=table))
            model.set_attn_implementation("sdpa")
        after = logits(DynamicCache(config=model.config))
    assert len(names) == (7 if fuse else 3) + combo and counters["stats"]["unique_graphs"] > graphs_before  # compile ran
    # fused: per layer q_proj, k_proj, v_proj, q_norm, k_norm, o_proj, the MLP and the layer itself take instance forwards
    assert fused_mods == (8 * model.config.num_hidden_layers if fuse else 0)
    assert torch.equal(compiled_gaac.view(torch.int16), compiled.view(torch.int16))  # the cache stays lossless
    torch.testing.assert_close(compiled.float(), eager.float(), atol=0.05, rtol=0.05)  # BF16 rounding order only
    assert forwards() == before  # the instance forwards are gone
    assert torch.equal(after.view(torch.int16), eager.view(torch.int16))  # the patch is undone, the weights unchanged


def test_fused_projections_split_the_stacked_gemm_as_the_three_linears(mods):
    """The stacked q/k/v GEMM's slices are what each projection computes alone (up to the GEMM's summation order),
    and each weight is a view of the stacked buffer with its own values (a wrong slice offset fails here)."""
    _, co = mods
    torch.manual_seed(0)
    lins = [torch.nn.Linear(32, n, bias=False) for n in (16, 8, 8)]
    x = torch.randn(3, 32)
    alone = [lin(x) for lin in lins]
    stacked = co._stack_weights(lins)
    assert all(lin.weight.untyped_storage().data_ptr() == stacked.untyped_storage().data_ptr() for lin in lins)
    out = torch.nn.functional.linear(x, stacked)
    for got, want in zip((out[:, :16], out[:, 16:24], out[:, 24:]), alone):
        torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="bias"):
        co._stack_weights([torch.nn.Linear(4, 4, bias=True)])


def test_compiled_ops_refuse_another_model_family(mods):
    _, co = mods
    from types import SimpleNamespace

    model = SimpleNamespace(config=SimpleNamespace(model_type="llama", hidden_act="silu"))
    with pytest.raises(ValueError, match="Qwen3"):
        with co.compiled_qwen3_ops(model):
            pass


def test_pdl_needs_inductor_support(mods, monkeypatch):
    """``pdl=True`` on a torch without ``triton.enable_pdl`` fails with a clear error before anything is patched."""
    _, co = mods
    from types import SimpleNamespace

    from transformers.models.qwen3 import modeling_qwen3 as m

    before = (m.Qwen3RMSNorm.forward, m.Qwen3MLP.forward, m.apply_rotary_pos_emb)
    assert co._inductor_has_pdl() == hasattr(torch._inductor.config.triton, "enable_pdl")
    monkeypatch.setattr(co, "_inductor_has_pdl", lambda: False)
    model = SimpleNamespace(config=SimpleNamespace(model_type="qwen3", hidden_act="silu"))
    with pytest.raises(RuntimeError, match="enable_pdl"):
        with co.compiled_qwen3_ops(model, pdl=True):
            pass
    assert (m.Qwen3RMSNorm.forward, m.Qwen3MLP.forward, m.apply_rotary_pos_emb) == before
