"""eval/bench_attention_v4.py's pool layouts (CPU, no kernel): the shuffled and the in-order pools of a case hold the
same values; in order, each head's blocks lie back to back as a GAACCache prefill writes them."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

EVAL = Path(__file__).resolve().parents[1] / "eval"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(EVAL))
    spec = importlib.util.spec_from_file_location("bench_attention_v4", EVAL / "bench_attention_v4.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_layouts_hold_the_same_values_and_in_order_is_back_to_back(bench):
    from gaac_hf.codec.v4 import decode_pool_v4

    cpu = torch.device("cpu")
    cases = {lay: bench.Case("smollm2-135m", 2, 320, cpu, layout=lay) for lay in bench.LAYOUTS}
    a, b = cases["shuffled"], cases["in_order"]
    assert torch.equal(a.k.view(torch.int16), b.k.view(torch.int16))
    for kind in ("k", "v"):
        pa, pb = getattr(a.kv, kind), getattr(b.kv, kind)
        g = b.kv.geometry
        nb = 320 // g.block_size
        for case, p in ((a, pa), (b, pb)):
            x = getattr(case, kind)
            for bb in range(2):
                for h in range(case.hkv):
                    got = decode_pool_v4(p.pool, p.table[bb, h, :nb], p.base16[h], g, kind)
                    want = x[bb, h, : nb * g.block_size].reshape(nb, g.block_size, -1)
                    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
        offs = (pb.table[:, :, :nb] & ~15).reshape(-1, nb)
        steps = offs[:, 1:] - offs[:, :-1]
        assert bool((steps > 0).all()), "in order: a head's blocks ascend"
        assert bool((steps <= g.raw_bytes).all()), "in order: back to back (a block is at most its BF16 size)"
        shuffled = (pa.table[:, :, :nb] & ~15).reshape(-1, nb)
        assert not bool((shuffled[:, 1:] > shuffled[:, :-1]).all()), "shuffled pools are not in order"
    with pytest.raises(ValueError, match="layout"):
        bench.Case("smollm2-135m", 1, 64, cpu, layout="sorted")


def test_sweep_cases_parse_and_refuse_what_the_harness_lacks(bench):
    assert bench.parse_cases(["gemma3:1:16384", "qwen3-8b:4:65536"]) == [("gemma3", 1, 16384), ("qwen3-8b", 4, 65536)]
    for bad in ("gemma3:1", "nope:1:16384", "gemma3:x:16384"):
        with pytest.raises(SystemExit, match="take SHAPE:BATCH:CONTEXT"):
            bench.parse_cases([bad])
