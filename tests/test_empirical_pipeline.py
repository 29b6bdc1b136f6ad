"""``attnverify empirical`` end to end on ``tiny-gpt2-random``, its extraction, its inputs and its
bad-input exits (each a one-line message and exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnverify.empirical import cli, extraction, models, text
from attnverify.empirical.config import EXPERIMENTS, PAPER_TABLE1_SECONDS
from attnverify.empirical.store import CheckpointStore, write_json_atomic

pytest.importorskip("transformers")

WAR_AND_PEACE = text.find_default_text()  # the excerpt shipped in attnverify/empirical/data/
QUICK = ["--model", "tiny-gpt2-random", "--quick", "--no-progress", "--threads", "1"]


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def tiny():
    return models.load_model("tiny-gpt2-random")


# ---- extraction ----------------------------------------------------------------------------


def eager_attentions(model, ids):
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model.base_model(input_ids=torch.tensor([ids]), output_attentions=True)
    finally:
        model.set_attn_implementation(extraction.CAPTURE_NAME)
    return out.attentions


def assert_matches_eager(loaded, ids):
    ex = extraction.extract(loaded, [ids])
    reference = eager_attentions(loaded.model, ids)
    for layer, att in enumerate(reference):
        mine = ex.layer_attention(0, layer)
        diff = float((mine - att[0]).abs().max())
        assert diff <= 1e-6, f"layer {layer}: softmax(logits) differs from eager by {diff:.3g}"
    return ex


def test_extraction_reproduces_the_models_eager_attention(tiny):
    ex = assert_matches_eager(tiny, list(range(40, 104)))
    assert ex.q.shape == (1, 4, 64, 16)
    logits = ex.layer_logits(0, 1)
    assert torch.isinf(logits[:, 0, 1:]).all() and torch.isfinite(logits[:, -1]).all()


def test_extraction_maps_grouped_query_heads():
    """A random Llama with 4 query and 2 key/value heads: head h reads key/value head h // 2."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    loaded = models._finish(model, "tiny-llama", "test", False, "test", models.byte_tokenize, "b")
    ex = assert_matches_eager(loaded, list(range(3, 35)))
    assert torch.equal(ex.k[0, 0], ex.k[0, 1]) and not torch.equal(ex.k[0, 1], ex.k[0, 2])


def test_hidden_and_input_embeddings_are_what_the_attention_blocks_read(tiny):
    ids = list(range(40, 72))
    ex = extraction.extract(tiny, [ids], embeddings=("value", "hidden", "input"))
    base = tiny.model.base_model
    with torch.no_grad():
        out = base(input_ids=torch.tensor([ids]), output_hidden_states=True)
        for layer, block in enumerate(base.h):
            want = block.ln_1(out.hidden_states[layer][0])
            diff = float((ex.hidden[0, layer] - want).abs().max())
            assert diff <= 1e-6, f"layer {layer}: hidden differs from ln_1's output by {diff}"
        close_inputs = (ex.inputs[0, 0] - base.wte(torch.tensor(ids))).abs().max()
    assert float(close_inputs) == 0.0, "input embeddings are the token embedding rows"
    hidden = ex.with_embeddings("hidden").values(16)
    assert hidden.shape == (ex.n_total_heads, 16, ex.hidden.shape[-1])
    assert torch.equal(hidden[slice(ex.n_heads, ex.n_heads + 1)][0], ex.hidden[0, 1, :16])


def test_embedding_choices_rerun_and_score_the_x_dependent_experiments(tmp_path, capsys):
    out = tmp_path / "emb"
    code, stdout, err = run_cli(QUICK + ["--out", str(out), "--experiments",
                                         "separability,coverage", "--embeddings",
                                         "value,hidden,input"], capsys)
    assert code == 0, err
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert doc["settings"]["embeddings"] == "value"
    assert set(doc["embedding_variants"]) == {"hidden", "input"}
    for name, variant in doc["embedding_variants"].items():
        assert set(variant["experiments"]) == {"separability", "coverage"}, name
        claims = {r["claim"] for r in variant["paper_comparison"]}
        assert claims == {r["claim"] for r in doc["paper_comparison"]}, name
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "How the verdicts move with what x_i is" in report


@pytest.mark.parametrize("extra", [[], ["--normalizers", "sparsemax", "--embeddings",
                                         "hidden,value", "--seed", "3", "--coverage-n", "8"]])
def test_report_command_reproduces_the_settings(extra, tmp_path):
    """The command at the top of report.md, parsed again, gives the same numeric settings."""
    import shlex

    from attnverify.empirical import config as cfg
    from attnverify.empirical.pipeline import command_line

    parser = cli.argparse.ArgumentParser()
    cli.add_arguments(parser)
    config = cli.config_from_args(parser.parse_args(QUICK + ["--out", str(tmp_path)] + extra))
    line = command_line(config)
    assert line.startswith("python -m attnverify.empirical --model tiny-gpt2-random"), line
    again = cli.config_from_args(parser.parse_args(shlex.split(line)[3:]))
    assert cfg.numeric_settings(again) == cfg.numeric_settings(config), line


def test_unknown_embeddings(capsys):
    code, _, err = run_cli(QUICK + ["--embeddings", "values"], capsys)
    assert code == 2 and "--embeddings" in err and err.count("\n") == 1, err


def test_row_logits_match_layer_logits(tiny):
    ex = extraction.extract(tiny, [list(range(64))])
    rows = torch.tensor([10, 31])
    got = ex.row_logits(rows, 32)
    full = torch.cat([ex.layer_logits(0, layer) for layer in range(2)])
    assert torch.allclose(got, full[:, rows, :32])


# ---- text ----------------------------------------------------------------------------------


def test_war_and_peace_prose_starts_at_book_one():
    t = text.load_text(WAR_AND_PEACE)
    assert t.first_line == 1
    assert t.prose.startswith("BOOK ONE: 1805\n")
    assert t.prose.endswith("reunited to Kutúzov’s army.") and "BOOK THREE" not in t.prose
    assert "GUTENBERG" not in t.prose.upper()
    assert t.sha256.startswith("6e1eef1bb51f")


def test_gutenberg_stripping_and_plain_text():
    book = "\n".join(["header", "*** START OF THE PROJECT GUTENBERG EBOOK X ***", "Contents",
                      "  CHAPTER I", "  CHAPTER II", "", "CHAPTER I", "It was.", "CHAPTER II",
                      "Then.", "*** END OF THE PROJECT GUTENBERG EBOOK X ***", "license"])
    prose, first = text.gutenberg_prose(book)
    assert prose.startswith("CHAPTER I\nIt was.") and prose.endswith("Then.") and first == 7
    assert text.gutenberg_prose("just prose\nhere") == ("just prose\nhere", 1)


def test_token_windows_are_consecutive(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("abcdefghij" * 10, encoding="utf-8")
    wins = text.token_windows(text.load_text(path), models.byte_tokenize, 8, 3)
    assert [len(w) for w in wins] == [8, 8, 8] and bytes(wins[1]).decode() == "ijabcdef"


# ---- end to end ----------------------------------------------------------------------------


@pytest.mark.slow  # every experiment, twice
def test_pipeline_end_to_end_and_resume(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, _ = run_cli(QUICK + ["--out", str(out), "--normalizers", "sparsemax"], capsys)
    assert code == 0, stdout
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert list(doc["experiments"]) == list(EXPERIMENTS)
    assert doc["model"]["weights"] == "random (seeded)" and not doc["model"]["pretrained"]
    rows = doc["paper_comparison"]
    assert rows and all({"claim", "paper", "measured", "agrees"} <= set(r) for r in rows)
    assert {n["id"] for n in doc["normalizers"]} == {"softmax", "sparsemax"}
    assert doc["figures"], "matplotlib is installed: the run must write its figures"
    for name in doc["figures"].values():
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "random (seeded) weights" in report and "not GPT-2 results" in report
    assert "## Paper comparison" in report and "## Normalizers side by side" in report

    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "checkpoints").iterdir()}
    code, stdout, _ = run_cli(QUICK + ["--out", str(out), "--normalizers", "sparsemax",
                                       "--resume"], capsys)
    assert code == 0
    again = {p.name: p.stat().st_mtime_ns for p in (out / "checkpoints").iterdir()}
    assert again == stamps, "--resume recomputed a finished experiment"
    redone = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert redone["experiments"] == doc["experiments"]


@pytest.mark.slow  # two runs of the pipeline
def test_resume_redoes_only_what_is_missing(tmp_path, capsys):
    out = tmp_path / "run"
    args = QUICK + ["--out", str(out), "--experiments", "distance_vs_length,rank_collapse"]
    assert run_cli(args, capsys)[0] == 0
    (out / "checkpoints" / "rank_collapse.json").unlink()
    kept = (out / "checkpoints" / "distance_vs_length.json").stat().st_mtime_ns
    assert run_cli(args + ["--resume"], capsys)[0] == 0
    assert (out / "checkpoints" / "distance_vs_length.json").stat().st_mtime_ns == kept
    assert (out / "checkpoints" / "rank_collapse.json").exists()


def local_gpt2_directory(folder: Path) -> Path:
    """A tiny GPT-2 saved as safetensors with a character-level tokenizer, all offline."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tok_models
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {chr(i): i - 32 for i in range(32, 127)}
    vocab["[UNK]"] = len(vocab)
    tok = Tokenizer(tok_models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=256, vocab_size=len(vocab),
                        bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    return folder


def test_local_model_directory_with_safetensors(tmp_path, capsys):
    folder = local_gpt2_directory(tmp_path / "model")
    out = tmp_path / "run"
    code, stdout, err = run_cli(["--model", str(folder), "--quick", "--no-progress",
                                 "--experiments", "distance_vs_length", "--out", str(out)],
                                capsys)
    assert code == 0, err
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert doc["model"]["context"] == 256 and doc["model"]["heads_per_layer"] == 2
    assert "local directory" in doc["model"]["weights"]


def test_checkpoint_with_other_settings_is_not_reused(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save("gradient", "aaaa", {"x": 1})
    assert store.load("gradient", "aaaa") == {"x": 1}
    assert store.load("gradient", "bbbb") is None
    (tmp_path / "checkpoints" / "gradient.json").write_text("{truncated", encoding="utf-8")
    assert store.load("gradient", "aaaa") is None


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "results.json"
    write_json_atomic(target, {"ok": 1})
    monkeypatch.setattr("os.replace", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        write_json_atomic(target, {"ok": 2})
    assert json.loads(target.read_text()) == {"ok": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


# ---- bad input: exit 2 with one line -------------------------------------------------------


def assert_usage_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got: {err!r}"
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"


def test_unknown_experiment(capsys):
    code, _, err = run_cli(QUICK + ["--experiments", "distance,gradient"], capsys)
    assert_usage_error(code, err, "unknown experiment 'distance'", "critical_topn")


def test_missing_text(tmp_path, capsys):
    code, _, err = run_cli(QUICK + ["--text", str(tmp_path / "nope.txt")], capsys)
    assert_usage_error(code, err, "text file not found")


def test_non_utf8_text(tmp_path, capsys):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("Mot\xe9 caf\xe9 ".encode("latin-1") * 50)
    code, _, err = run_cli(QUICK + ["--text", str(bad)], capsys)
    assert_usage_error(code, err, "is not UTF-8", "offset 3")


def test_missing_hub_weights_offline(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-cache"))
    text_file = tmp_path / "t.txt"
    text_file.write_text("word " * 2000, encoding="utf-8")
    code, _, err = run_cli(QUICK + ["--text", str(text_file)] + ["--model", "gpt2"], capsys)
    assert_usage_error(code, err, "'gpt2'", "not in the Hugging Face cache", "hf download gpt2")


def test_directory_without_weights(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}", encoding="utf-8")
    (tmp_path / "model" / "pytorch_model.bin").write_bytes(b"pickle")
    text_file = tmp_path / "t.txt"
    text_file.write_text("word " * 2000, encoding="utf-8")
    code, _, err = run_cli(["--model", str(tmp_path / "model"), "--text", str(text_file),
                            "--quick", "--no-progress"], capsys)
    assert_usage_error(code, err, "no .safetensors weights", "not loaded")


def test_length_beyond_context(capsys):
    code, _, err = run_cli(QUICK + ["--max-length", "2048"], capsys)
    assert_usage_error(code, err, "L=2048 is beyond the context of tiny-gpt2-random (1024")


def test_n_not_below_length(capsys):
    code, _, err = run_cli(QUICK + ["--max-length", "64", "--topn-list", "1,5,100"], capsys)
    assert_usage_error(code, err, "N=100", "L=64")


def test_unknown_normalizer(capsys):
    code, _, err = run_cli(QUICK + ["--normalizers", "softmaxx"], capsys)
    assert_usage_error(code, err, "softmaxx")


def test_cuda_when_absent(capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    code, _, err = run_cli(QUICK + ["--device", "cuda"], capsys)
    assert_usage_error(code, err, "CUDA is not available")


# ---- docs cannot drift ---------------------------------------------------------------------


def test_docs_timing_table_names_every_paper_experiment_and_table1_figure():
    readme = Path(__file__).resolve().parents[1] / "docs" / "empirical" / "README.md"
    if not readme.exists():
        pytest.skip("docs/empirical/README.md not written yet")
    body = readme.read_text(encoding="utf-8")
    for name in PAPER_TABLE1_SECONDS:
        assert f"`{name}`" in body, f"{name} missing from docs/empirical/README.md"
    assert "17 h 4 min" in body and "python -m attnverify.empirical" in body


def test_report_command_puts_settings_without_a_flag_in_a_comment(tmp_path):
    """A setting with no flag (or a temperature grid --temperature-points cannot rebuild) goes
    into a trailing comment, never into the arguments, so the command still parses."""
    import dataclasses
    import shlex

    from attnverify.empirical import config as cfg
    from attnverify.empirical.pipeline import _NO_FLAG, command_line

    config = cfg.RunConfig(model="tiny-gpt2-random", out=tmp_path)
    config = dataclasses.replace(config, temperatures=(0.1, 1.0),
                                 **{sorted(_NO_FLAG)[0]: 7})
    line = command_line(config)
    args, _, comment = line.partition("  # ")
    assert "temperatures=(0.1, 1.0)" in comment and f"{sorted(_NO_FLAG)[0]}=7" in comment
    assert "--temperature-points" not in args and "#" not in args
    parser = cli.argparse.ArgumentParser()
    cli.add_arguments(parser)
    parser.parse_args(shlex.split(args)[3:])
    grid = dataclasses.replace(config, temperatures=cfg.log_grid(1e-3, 10.0, 5))
    assert "--temperature-points 5" in command_line(grid)
