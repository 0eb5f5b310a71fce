"""Calibration: window choice, escape statistics, the table file and its checks (and the v1 -> v2
upgrade), K/V collection, the CLI."""
import json
from pathlib import Path

import pytest
import torch

from gaac_hf.calibration import (
    CalibrationTable,
    block_tags,
    choose_windows,
    config_fingerprint,
    exponent_histogram,
)
from gaac_hf.codec import encode_blocks
from gaac_hf.format import FORMAT_VERSION, BlockGeometry

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "calibration_data" / "smollm2-135m.safetensors"

WORDS = (
    "the river ran past the old mill and the miller counted sacks of grain while rain fell on the roof "
    "children ran along the bank and a dog barked at geese that rose over the reeds into grey cloud"
).split()


# ---------------------------------------------------------------------------------------------
# choose_windows on synthetic histograms
# ---------------------------------------------------------------------------------------------
def hist_of(counts: dict[int, int]) -> torch.Tensor:
    h = torch.zeros(256, dtype=torch.int64)
    for e, c in counts.items():
        h[e] = c
    return h


@pytest.mark.parametrize(
    "counts, base8, base16",
    [
        ({130: 5}, 123, 115),  # one exponent: the first window that holds it
        ({e: 7 for e in range(100, 108)}, 100, 92),  # exactly 8 wide
        # cluster A (100-103, 40 values) vs cluster B (110-113, 60 values): the 8-window takes B, the
        # 16-window holds both and starts as low as possible
        ({100: 10, 101: 10, 102: 10, 103: 10, 110: 15, 111: 15, 112: 15, 113: 15}, 106, 98),
        ({50: 10, 200: 10}, 43, 35),  # tie: lowest start wins
        ({0: 3}, 0, 0),  # bottom edge
        ({255: 3, 254: 1}, 248, 240),  # top edge: bases stay in range
        ({}, 123, 119),  # never-seen channel: windows around exponent 127
    ],
)
def test_choose_windows_known_answers(counts, base8, base16):
    b8, b16 = choose_windows(hist_of(counts))
    assert (int(b8), int(b16)) == (base8, base16)
    assert b8.dtype == torch.uint8 and b16.dtype == torch.uint8


def test_choose_windows_batched_and_maximal():
    g = torch.Generator().manual_seed(0)
    h = torch.randint(0, 50, (2, 3, 4, 256), generator=g) * (torch.rand(2, 3, 4, 256, generator=g) < 0.1)
    b8, b16 = choose_windows(h)
    assert b8.shape == b16.shape == (2, 3, 4)
    flat = h.reshape(-1, 256)
    for i, (s8, s16) in enumerate(zip(b8.flatten().tolist(), b16.flatten().tolist())):
        best8 = max(int(flat[i, s : s + 8].sum()) for s in range(249))
        best16 = max(int(flat[i, s : s + 16].sum()) for s in range(241))
        assert int(flat[i, s8 : s8 + 8].sum()) == best8
        assert int(flat[i, s16 : s16 + 16].sum()) == best16


def test_choose_windows_rejects_bad_shape():
    with pytest.raises(ValueError, match="256"):
        choose_windows(torch.zeros(4, 255, dtype=torch.int64))


def test_exponent_histogram_counts_fields():
    x = torch.tensor([[1.0, 2.0], [1.5, -2.0], [0.0, float("inf")]], dtype=torch.bfloat16)  # [S=3, D=2]
    h = exponent_histogram(x)
    assert h.shape == (2, 256)
    assert h[0, 127] == 2 and h[0, 0] == 1
    assert h[1, 128] == 2 and h[1, 255] == 1
    with pytest.raises(TypeError, match="bfloat16"):
        exponent_histogram(x.float())


# ---------------------------------------------------------------------------------------------
# modes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", ["channel", "token"])
def test_block_tags_match_the_codec(axis):
    g = BlockGeometry(block_size=16, head_dim=64, group_axis=axis)
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(3, 16, 64, generator=gen) * torch.logspace(-3, 1, 64)).bfloat16()
    b8, b16 = choose_windows(exponent_histogram(x.reshape(-1, 64)))
    exp = (x.view(torch.int16).to(torch.int32) >> 7) & 0xFF
    tags = block_tags(exp.reshape(48, 64), b8, b16, g)  # three blocks of one sequence
    ref = encode_blocks(x, b8, b16, g).tags.reshape(3, -1)
    assert torch.equal(tags, ref)
    assert set(tags.unique().tolist()) <= {0, 1, 2}


# ---------------------------------------------------------------------------------------------
# the table file
# ---------------------------------------------------------------------------------------------
def tiny_config(**kw):
    from transformers import LlamaConfig

    base = dict(
        vocab_size=len(set(WORDS)) + 4, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
    )
    return LlamaConfig(**(base | kw))


def random_table(config, axis="channel") -> CalibrationTable:
    from gaac_hf.calibration import model_kv_shape

    s = model_kv_shape(config)
    gen = torch.Generator().manual_seed(2)
    shape = (s["num_layers"], 2, s["num_kv_heads"], s["head_dim"])
    b8 = torch.randint(100, 140, shape, generator=gen, dtype=torch.uint8)
    meta = {"model_name": "tiny", "fingerprint": config_fingerprint(config), "kv_shape": s, "context": 128, "list": [1, 2]}
    return CalibrationTable(b8, b8 - 4, BlockGeometry(64, s["head_dim"], axis), meta)


def test_table_round_trip(tmp_path):
    cfg = tiny_config()
    t = random_table(cfg, "token")
    p = t.save(tmp_path / "sub" / "t.safetensors")
    u = CalibrationTable.load(p)
    assert torch.equal(u.base8, t.base8) and torch.equal(u.base16, t.base16)
    assert u.geometry == t.geometry and u.meta == t.meta
    u.check_model(cfg)


def test_table_format_version_mismatch(tmp_path):
    from safetensors.torch import save_file

    t = random_table(tiny_config())
    header = {"format_version": FORMAT_VERSION + 1, "geometry": t.geometry.to_dict(), "meta": t.meta}
    p = tmp_path / "future.safetensors"
    save_file({"base8": t.base8, "base16": t.base16}, str(p), metadata={"gaac": json.dumps(header)})
    with pytest.raises(ValueError, match="format version"):
        CalibrationTable.load(p)


def test_v1_table_is_refused_then_upgraded_keeping_the_windows(tmp_path):
    from safetensors.torch import save_file

    from gaac_hf.calibration import upgrade_table_file

    t = random_table(tiny_config())
    v1_geometry = {"block_size": 64, "head_dim": 64, "escape_capacity": 112, "group_axis": "channel", "format_version": 1}
    header = {"format_version": 1, "geometry": v1_geometry, "meta": t.meta | {"escape_capacity": {"bytes": 112}}}
    p = tmp_path / "v1.safetensors"
    save_file({"base8": t.base8, "base16": t.base16}, str(p), metadata={"gaac": json.dumps(header)})
    with pytest.raises(ValueError, match="upgrade_table_file"):
        CalibrationTable.load(p)
    out = upgrade_table_file(p, tmp_path / "v2.safetensors")
    u = CalibrationTable.load(out)
    assert torch.equal(u.base8, t.base8) and torch.equal(u.base16, t.base16)  # windows bit for bit
    assert u.geometry == BlockGeometry(64, 64) and u.meta["upgraded_from"] == {"format_version": 1, "escape_capacity": 112}
    assert "escape_capacity" not in u.meta
    assert upgrade_table_file(out) == out  # a v2 file is left alone
    u.check_model(tiny_config())


def test_not_a_table(tmp_path):
    p = tmp_path / "junk.safetensors"
    p.write_bytes(b"not safetensors at all")
    with pytest.raises(ValueError, match="not a GAAC calibration table"):
        CalibrationTable.load(p)
    with pytest.raises(FileNotFoundError):
        CalibrationTable.load(tmp_path / "missing.safetensors")


@pytest.mark.parametrize(
    "other, what",
    [
        (dict(num_hidden_layers=3), "layers"),
        (dict(head_dim=128, hidden_size=256), "head_dim"),
        (dict(num_key_value_heads=2), "num_kv_heads"),
        (dict(rope_theta=1234.0), "fingerprint"),
    ],
)
def test_table_for_another_model_is_an_error(other, what):
    t = random_table(tiny_config())
    with pytest.raises(ValueError, match=what):
        t.check_model(tiny_config(**other))


# ---------------------------------------------------------------------------------------------
# collection and calibration on a tiny random-init model (offline, fast)
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A random-init Llama (2 layers, 1 kv-head, head_dim 64) with a word-level tokenizer, on disk."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("tiny_llama")
    vocab = {w: i for i, w in enumerate(["[UNK]", "[PAD]", "<s>", "</s>", *sorted(set(WORDS))])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(d)
    torch.manual_seed(0)
    LlamaForCausalLM(tiny_config()).to(torch.bfloat16).save_pretrained(d)
    text = " ".join(WORDS * 12)  # 444 tokens
    (d / "text.txt").write_text(text)
    return d


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from gaac_hf.models import load_model

    return load_model(str(tiny_model_dir))


def test_collect_histograms_and_position_ranges(tiny, tiny_model_dir):
    from gaac_hf.calibration.collect import collect_kv_stats

    model, tok = tiny
    text = (tiny_model_dir / "text.txt").read_text()
    st = collect_kv_stats(model, tok, text, context=128, position_ranges=[(0, 64), (64, 128)], keep_tokens=128, progress=False)
    assert st.chunks == 3 and st.tokens == 384
    assert st.hist.shape == (2, 2, 1, 64, 256)
    assert int(st.hist[0, 0, 0, 0].sum()) == 384  # every token counted once per channel
    assert torch.equal(st.range_hist.sum(0), st.hist)  # ranges cover the context exactly
    assert len(st.exponents) == 1 and st.exponents[0].shape == (2, 2, 1, 128, 64)


def test_calibrate_tiny_model(tiny, tiny_model_dir):
    from gaac_hf.calibration import calibrate

    model, tok = tiny
    text = (tiny_model_dir / "text.txt").read_text()
    t = calibrate(model, tok, text, context=128, block_size=64, text_name="tiny.txt", progress=False)
    t.check_model(model.config)
    assert t.base8.shape == (2, 2, 1, 64) and t.geometry == BlockGeometry(64, 64)
    esc = t.meta["escapes"]
    assert esc["escape_limit"] == t.geometry.escape_limit and esc["blocks"] == 3 * 2 * 2 * 1 * 2  # chunks, L, K/V, H, blocks per chunk
    assert 1.0 < esc["ratio_estimate"] <= 8192 / 5760
    m = t.meta
    assert m["text"]["name"] == "tiny.txt" and len(m["text"]["sha256"]) == 64 and m["tokens"] == 384
    assert m["kv_shape"]["head_dim"] == 64 and m["context"] == 128 and m["date"]
    shares = m["mode_shares"]["K"]
    assert abs(sum(shares.values()) - 1) < 1e-5
    assert [r["range"] for r in m["mode_shares"]["by_position"]] == ["0-128"]


def test_non_bf16_model_is_an_error(tiny_model_dir):
    from gaac_hf.calibration import calibrate
    from gaac_hf.models import load_model

    model, tok = load_model(str(tiny_model_dir), dtype=torch.float32)
    with pytest.raises(TypeError, match="bfloat16"):
        calibrate(model, tok, "the river ran", context=64, progress=False)


@pytest.mark.parametrize("text, match", [("", "empty"), ("   \n ", "empty"), ("the river ran past the mill", "one context needs 128")])
def test_empty_or_short_text_is_an_error(tiny, text, match):
    from gaac_hf.calibration import calibrate

    model, tok = tiny
    with pytest.raises(ValueError, match=match):
        calibrate(model, tok, text, context=128, progress=False)


def test_context_must_hold_whole_blocks(tiny, tiny_model_dir):
    from gaac_hf.calibration import calibrate

    model, tok = tiny
    with pytest.raises(ValueError, match="multiple of block_size"):
        calibrate(model, tok, (tiny_model_dir / "text.txt").read_text(), context=100, progress=False)


def test_gaac_calibrate_cli(tiny_model_dir, tmp_path, capsys):
    from gaac_hf.calibration.cli import main

    out = tmp_path / "t.safetensors"
    rc = main(["--model", str(tiny_model_dir), "--text", str(tiny_model_dir / "text.txt"), "--context", "128",
               "--group-axis", "token", "--max-tokens", "256", "--out", str(out), "--quiet"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "mode shares by position" in printed and "0-128" in printed
    t = CalibrationTable.load(out)
    assert t.geometry.group_axis == "token" and t.meta["tokens"] == 256
    assert t.meta["command"].startswith("gaac-calibrate --model")


def test_cli_missing_text_is_a_clear_error(tmp_path):
    from gaac_hf.calibration.cli import main

    with pytest.raises(SystemExit, match="not found"):
        main(["--text", str(tmp_path / "nope.txt")])


class CharTokenizer:
    """Enough of a tokenizer for collect: one id per character."""

    def __call__(self, text, return_tensors=None, verbose=False):
        from types import SimpleNamespace

        return SimpleNamespace(input_ids=torch.tensor([[ord(c) % 64 for c in text]]))


def test_sliding_window_layers_hybrid_cache():
    """Gemma3-style hybrid cache: sliding layers hold only their last tokens; they are histogrammed
    at their true positions and left out of mode statistics unless full_cache=True."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from gaac_hf.calibration import calibrate
    from gaac_hf.calibration.collect import collect_kv_stats

    cfg = Gemma3TextConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, sliding_window=32, max_position_embeddings=512,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    )
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg).to(torch.bfloat16).eval()
    text = "abcdefghij" * 40  # 400 tokens -> 3 contexts of 128
    st = collect_kv_stats(model, CharTokenizer(), text, context=128, position_ranges=[(0, 64), (64, 128)], keep_tokens=128, progress=False)
    held = st.layer_lengths[0]
    assert held < 128 and st.layer_lengths[2] == 128
    assert int(st.hist[0, 0, 0, 0].sum()) == 3 * held and int(st.hist[2, 0, 0, 0].sum()) == 3 * 128
    assert int(st.range_hist[0, 0].sum()) == 0  # the sliding layer holds no position < 64
    t = calibrate(model, CharTokenizer(), text, context=128, progress=False)
    t.check_model(model.config)
    per_layer = t.meta["mode_shares"]["per_layer"]
    assert sum(per_layer[0]["K"].values()) == 0 and abs(sum(per_layer[2]["K"].values()) - 1) < 1e-5
    full = calibrate(model, CharTokenizer(), text, context=128, progress=False, full_cache=True)
    assert abs(sum(full.meta["mode_shares"]["per_layer"][0]["K"].values()) - 1) < 1e-5


# ---------------------------------------------------------------------------------------------
# the shipped table
# ---------------------------------------------------------------------------------------------
def test_shipped_table_loads():
    t = CalibrationTable.load(SHIPPED)
    assert t.base8.shape == (30, 2, 3, 64)
    assert t.geometry.block_size == 64 and t.geometry.group_axis == "channel"
    assert t.meta["model_name"] == "SmolLM2-135M-Instruct" and t.meta["context"] >= 4096
    assert t.meta["text"]["name"] == "wikitext-2-v1/valid.txt"


@pytest.mark.slow
def test_shipped_table_fits_smollm2_and_demo_runs(smollm2, capsys):
    from gaac_hf.demo import main

    model, _ = smollm2
    CalibrationTable.load(SHIPPED).check_model(model.config)
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "bit-exact round trip: yes" in out and "compression ratio" in out


def test_shipped_tables_are_found_by_name_from_any_directory(tmp_path, monkeypatch):
    from gaac_hf.calibration import find_table, shipped_tables

    monkeypatch.chdir(tmp_path)
    assert "smollm2-135m" in shipped_tables()
    p = find_table("smollm2-135m")
    assert p == find_table("smollm2-135m.safetensors") == find_table("calibration_data/smollm2-135m.safetensors")
    assert p.read_bytes() == SHIPPED.read_bytes()
    own = CalibrationTable.load(SHIPPED).save(tmp_path / "mine.safetensors")
    assert find_table("mine.safetensors") == Path("mine.safetensors") and find_table(str(own)) == own  # paths win
    with pytest.raises(FileNotFoundError, match="not a shipped name; shipped: 'smollm2-135m-fp8_e4m3', 'smollm2-135m-fp8_e5m2', 'smollm2-135m'"):
        find_table("no-such-model")


def test_real_text_lookup_order(tmp_path, monkeypatch):
    """$GAAC_HF_DATA first, then ../shared/data beside the checkout; a miss names every place searched."""
    from gaac_hf import data

    (tmp_path / "wikitext-2-raw-v1").mkdir()
    (tmp_path / "wikitext-2-raw-v1" / "wiki.test.raw").write_text("mine")
    monkeypatch.setenv(data.ENV, str(tmp_path))
    assert data.wikitext("test") == ("mine", str(tmp_path / "wikitext-2-raw-v1" / "wiki.test.raw"))
    monkeypatch.setattr(data, "CHECKOUT", tmp_path / "nowhere" / "repo")
    with pytest.raises(data.DataNotFound, match="looked in .*nowhere"):
        data.data_file("piqa/valid.jsonl")


def test_cli_too_little_text_is_one_line_with_the_tokens_needed(tiny_model_dir, tmp_path, capsys):
    from gaac_hf.calibration.cli import main

    short = tmp_path / "short.txt"
    short.write_text("the river ran past the mill " * 4)
    with pytest.raises(SystemExit) as e:
        main(["--model", str(tiny_model_dir), "--text", str(short), "--context", "128", "--quiet",
              "--out", str(tmp_path / "t.safetensors")])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("gaac-calibrate: ")
    assert "has 24 tokens" in msg and "one context needs 128" in msg and "at least 128 tokens" in msg
    assert not (tmp_path / "t.safetensors").exists()


def test_cli_refuses_a_degenerate_table(tiny_model_dir, tmp_path, monkeypatch):
    import gaac_hf.calibration.fit as fit
    from gaac_hf.calibration.cli import degenerate, main

    b8 = torch.full((2, 2, 1, 64), 120, dtype=torch.uint8)
    b8[0, 0, 0, 0] = 119  # windows that differ somewhere
    good = CalibrationTable(b8, b8 - 4, BlockGeometry(64, 64), {"escapes": {"ratio_estimate": 1.40, "raw_fallback_share": 0.001}})
    assert degenerate(good) == []
    zero = CalibrationTable(torch.zeros(2, 2, 1, 64, dtype=torch.uint8), torch.zeros(2, 2, 1, 64, dtype=torch.uint8),
                            BlockGeometry(64, 64), {"escapes": {"ratio_estimate": 0.9995, "raw_fallback_share": 0.2}})
    reasons = degenerate(zero)
    assert len(reasons) == 3 and "exponent 0" in reasons[0] and "0.999" in reasons[1] and "20.0%" in reasons[2]
    monkeypatch.setattr(fit, "calibrate", lambda *a, **k: zero)
    out = tmp_path / "z.safetensors"
    argv = ["--model", str(tiny_model_dir), "--text", str(tiny_model_dir / "text.txt"), "--context", "128", "--quiet",
            "--out", str(out)]
    with pytest.raises(SystemExit, match="refusing to write a degenerate table"):
        main(argv)
    assert not out.exists()


def test_table_header_that_is_not_json_names_file_and_field(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "bad.safetensors"
    save_file({"base8": torch.zeros(1, 2, 1, 64, dtype=torch.uint8), "base16": torch.zeros(1, 2, 1, 64, dtype=torch.uint8)},
              str(path), metadata={"gaac": "{format_version: 2"})
    with pytest.raises(ValueError) as e:
        CalibrationTable.load(path)
    msg = str(e.value)
    assert str(path) in msg and "header field 'gaac' is not valid JSON" in msg and "gaac-calibrate" in msg


def test_model_mismatch_lists_only_the_fields_that_differ():
    from transformers import LlamaConfig

    from gaac_hf.calibration import model_kv_shape

    def cfg(layers, kv_heads=1):
        return LlamaConfig(num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=kv_heads, head_dim=64,
                           hidden_size=128, vocab_size=32)

    shape = (30, 2, 1, 64)
    t = CalibrationTable(torch.full(shape, 120, dtype=torch.uint8), torch.full(shape, 116, dtype=torch.uint8),
                         BlockGeometry(64, 64), {"model_name": "thirty", "kv_shape": model_kv_shape(cfg(30))})
    t.check_model(cfg(30))
    with pytest.raises(ValueError) as e:
        t.check_model(cfg(12))
    msg = str(e.value)
    assert "num_layers: table 30 vs model 12" in msg and "layer_types: table 30 entries vs model 12" in msg
    assert msg.count("num_layers") == 1 and "head_dim" not in msg and "full_attention" not in msg
    assert "num_kv_heads" not in msg and "gaac-calibrate" in msg
    with pytest.raises(ValueError) as e:
        t.check_model(cfg(30, kv_heads=2))
    assert str(e.value).count(";") == 0 and "num_kv_heads: table 1 vs model 2" in str(e.value)
