"""The public CLI contract of INTERFACES.md: commands, exit codes, the JSON certificate."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from attnverify import atomic, report
from attnverify.cli import main
from attnverify.errors import UsageError

FIXTURES = Path(__file__).parent / "fixtures"
PLANTED = str(FIXTURES / "planted.py")
INTERFACES_PROPERTIES = (
    "shape finite deterministic no_mutation permutation_equivariant mask_zero batch_independent "
    "simplex sub_simplex nonnegative affine_sum shift_invariant order_preserving length_aware "
    "fully_masked_row lemma1_weight_bounds cor1_softmax_weight_bounds thm1_fixed_distance "
    "thm1_random_distance thm2_separation_lower thm2_separation_upper lemma2_jacobian "
    "cor3_entrywise cor3_spectral_paper jacobian_spectral_half fd_gradient gpam_range "
    "lemma3_l1_uniform lemma3_frobenius_uniform"
).split()
INTERFACES_QUANTITIES = ("L T a max_weight min_weight sum_weight jacobian_spectral "
                         "jacobian_entry jacobian_frobenius jacobian_l1_total").split()


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_usage_error(code, err, fragment):
    assert code == 2
    assert err.startswith("attnverify: error:") and err.count("\n") == 1, err
    assert fragment in err
    assert "Traceback" not in err


def test_properties_lists_every_interface_id(capsys):
    code, out, _ = run(capsys, "properties")
    assert code == 0
    listed = re.findall(r"^  (\w+)\s", out, flags=re.M)
    assert set(INTERFACES_PROPERTIES) <= set(listed)


def test_quantities_lists_every_interface_quantity(capsys):
    code, out, _ = run(capsys, "quantities")
    listed = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert code == 0 and set(INTERFACES_QUANTITIES) <= listed


def test_certify_json_certificate(capsys, tmp_path):
    path = tmp_path / "cert.json"
    md = tmp_path / "cert.md"
    code, out, _ = run(capsys, "certify", "softmax", "--profile", "dev", "--claims",
                       "simplex,shift_invariant", "--json", str(path), "--markdown", str(md))
    assert code == 0, out
    data = json.loads(path.read_text())
    assert data["schema_version"] == 1 and data["profile"] == "dev" and data["seed"] == 0
    assert data["device"] == "cpu" and data["torch_version"] and data["attnverify_version"]
    assert data["softmax_kernel"].startswith("fused softmax: ")  # softmax_fused's kernel: live?
    (target,) = data["targets"]
    assert target["target"] == "softmax" and target["verdict"] == "certified"
    assert target["claims"] == ["simplex", "shift_invariant"]
    props = [r["property"] for r in target["results"]]
    assert props[:7] == INTERFACES_PROPERTIES[:7]
    for r in target["results"]:
        assert set(r) >= {"property", "claimed", "status", "examples", "worst_ratio",
                          "counterexample", "message"}
        assert r["status"] in ("holds", "not_applicable")
    assert "verdict: softmax: CERTIFIED" in out
    assert md.read_text().startswith("# attnverify certificate")
    assert f"softmax_fused kernel: {data['softmax_kernel']}." in md.read_text()


def test_certify_failure_is_exit_1_with_counterexample(capsys, tmp_path):
    path = tmp_path / "cert.json"
    code, out, _ = run(capsys, "certify", f"{PLANTED}:row_sum_off_softmax", "--profile", "dev",
                       "--json", str(path))
    assert code == 1
    target = json.loads(path.read_text())["targets"][0]
    assert target["verdict"] == "failed"
    (bad,) = [r for r in target["results"] if r["status"] == "violated"]
    assert bad["property"] == "simplex" and bad["worst_ratio"] > 1
    ce = bad["counterexample"]
    assert ce["repro"].startswith("attnverify repro ") and "scores" in ce
    assert "repro:" in out and "VIOLATED" in out


def test_certify_error_when_normalizer_raises(capsys, tmp_path):
    bad = tmp_path / "raises.py"
    bad.write_text("def f(scores, dim=-1):\n    raise ValueError('nope')\n")
    code, out, _ = run(capsys, "certify", f"{bad}:f", "--profile", "dev", "--claims", "")
    assert code == 1
    assert "ERROR" in out and "the normalizer raised ValueError: nope" in out


def test_xfails_gate_on_regressions_only(capsys, tmp_path):
    xf = tmp_path / "xfails.txt"
    xf.write_text("# known\nrow_sum_off_softmax::simplex  # planted\n")
    code, _, err = run(capsys, "certify", f"{PLANTED}:row_sum_off_softmax", "--profile", "dev",
                       "--xfails", str(xf))
    assert code == 0, err


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["certify", "nosuch"], "unknown target 'nosuch'"),
        (["certify", "softmax", "--claims", "bogus"], "unknown property id 'bogus'"),
        (["certify", "softmax", "--claims", "shape"], "'shape' is universal"),
        (["certify", "softmax", "--dtypes", "float8"], "unknown dtype 'float8'"),
        (["certify", "softmax", "--profile", "fast"], "invalid choice: 'fast'"),
        (["certify", "softmax", "--params", "beta=1"], "has no parameter 'beta'"),
        (["certify", "softmax", "--params", "oops"], "expected NAME=VALUE"),
        (["certify", "softmax", "--max-examples", "0"], "expected a positive integer"),
        (["certify", "softmax", "--device", "tpu"], "unknown device 'tpu'"),
        (["certify", "softmax", "--xfails", "/nonexistent/x.txt"], "cannot read xfails file"),
        (["certify", "softmax", "--json", "/nonexistent/dir/c.json", "--claims", "",
          "--max-examples", "1"], "does not exist"),
        (["falsify", "softmax", "foo <= 1"], "unknown quantity 'foo'"),
        (["falsify", "softmax", "L <= __import__('os')"], "unexpected character"),
        (["falsify", "softmax", "L + 1"], "expected a comparison"),
        (["falsify", "nosuch", "L <= 1"], "unknown target"),
    ],
)
def test_bad_input_is_exit_2_one_line(capsys, argv, fragment):
    code, _, err = run(capsys, *argv)
    assert_usage_error(code, err, fragment)


def test_falsify_corollary3_as_stated(capsys, tmp_path):
    path = tmp_path / "f.json"
    code, out, _ = run(capsys, "falsify", "softmax", "jacobian_spectral <= 1/(4*T)",
                       "--profile", "dev", "--json", str(path))
    assert code == 1, out
    data = json.loads(path.read_text())
    w = data["witness"]
    assert data["falsified"] and w["L"] == 2 and w["scores"][0] == w["scores"][1]
    assert w["ratio"] == pytest.approx(2.0, rel=1e-6)
    assert data["worst_ratio"] == pytest.approx(2.0, rel=1e-6)
    assert "minimal witness: L=2" in out and "repro: attnverify repro softmax" in out
    assert data["rerun"].startswith("attnverify falsify softmax")


def test_falsify_corrected_bound_holds(capsys):
    code, out, _ = run(capsys, "falsify", "softmax", "jacobian_spectral <= 1/(2*T)",
                       "--profile", "dev")
    assert code == 0, out
    assert out.startswith("not falsified")


def test_write_atomic_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    path.write_text("good")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "replace", broken_replace)
    with pytest.raises(OSError):
        report.write_atomic(str(path), "new")
    assert path.read_text() == "good"
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]


def test_infinite_violation_ratio_still_writes_valid_json(capsys, tmp_path):
    path = tmp_path / "cert.json"
    code, _, _ = run(capsys, "certify", f"{PLANTED}:wrong_shape", "--profile", "dev",
                     "--claims", "", "--json", str(path))
    assert code == 1
    (bad,) = [r for r in json.loads(path.read_text())["targets"][0]["results"]
              if r["property"] == "shape"]
    assert bad["status"] == "violated" and bad["counterexample"]["ratio"] == "inf"


# --------------------------------------------------------------------------------------------
# The run configuration (attnverify.runconfig): one home for profiles, contexts and settings


def test_profiles_are_defined_once_and_registered_with_hypothesis():
    from hypothesis import settings

    from attnverify import certify, commands, runconfig

    assert certify.PROFILES is runconfig.PROFILES and certify.make_context is runconfig.make_context
    assert commands.PROFILE_CHOICES == tuple(runconfig.PROFILES)
    runconfig.register_profiles()
    for name, limits in runconfig.PROFILES.items():
        registered = settings.get_profile(f"attnverify-{name}")
        assert registered.max_examples == limits["max_examples"]
        assert registered.deadline is None and registered.database is None
        ctx = runconfig.make_context(name)
        assert ctx.timeout_s == limits["timeout_s"] and ctx.max_length == limits["max_length"]
        built = runconfig.hypothesis_settings(ctx, 7)
        assert built.max_examples == 7 and built.deadline is None and not built.derandomize


def test_make_context_validates_and_overrides(monkeypatch):
    from attnverify.runconfig import make_context

    ctx = make_context("dev", max_examples=3, seed=2**64 - 1, timeout=0.25, isolation=False)
    assert (ctx.max_examples, ctx.seed, ctx.timeout_s, ctx.isolation) == (3, 2**64 - 1, 0.25, False)
    monkeypatch.setenv("ATTNVERIFY_ISOLATION", "off")
    assert make_context("dev").isolation is False
    monkeypatch.setenv("ATTNVERIFY_ISOLATION", "maybe")
    with pytest.raises(UsageError, match="ATTNVERIFY_ISOLATION"):
        make_context("dev")
    for kwargs in ({"max_examples": 100_001}, {"seed": -1}, {"timeout": float("inf")},
                   {"timeout": 0}, {"seed": True}):
        with pytest.raises(UsageError):
            make_context("dev", isolation=True, **kwargs)


def test_help_and_readme_state_the_time_limits(capsys):
    from attnverify.runconfig import PROFILES

    with pytest.raises(SystemExit):
        main(["certify", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for name, limits in PROFILES.items():
        assert f"{name} {limits['timeout_s']} s" in text
        assert re.search(rf"^\| `{name}` \|.*\| {limits['timeout_s']} s \|$", readme, flags=re.M)
    assert "--no-isolation" in text


@pytest.mark.parametrize("where", ["gc_callback", "__del__"])
def test_an_interrupt_raised_where_it_cannot_propagate_is_delivered_again(where):
    """Python runs a signal's handler at the next instruction, which may be inside a garbage
    collector's callback or a ``__del__``: the interrupt raised there is swallowed ("Exception
    ignored") and, the signal then ignored, the run went on to its end. It is delivered again
    and stops the run where it can; the hook is restored afterwards."""
    import gc
    import signal
    import sys
    import time

    from attnverify.errors import Terminated, terminating_as_interrupt

    ran = []

    def receive_it_here(*_args):
        if not ran:
            ran.append(True)
            signal.raise_signal(signal.SIGTERM)
            for _ in range(1000):  # the handler runs in here, where it cannot raise
                pass

    class Finalised:
        def __del__(self):
            receive_it_here()

    before = signal.getsignal(signal.SIGTERM), sys.unraisablehook
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(Terminated), terminating_as_interrupt():
            if where == "gc_callback":
                gc.callbacks.append(receive_it_here)
                try:
                    gc.collect()
                finally:
                    gc.callbacks.remove(receive_it_here)
            else:
                Finalised()
            assert ran
            time.sleep(5)  # delivered again: raised here
            raise AssertionError("the interrupt was lost")
        assert (signal.getsignal(signal.SIGTERM), sys.unraisablehook) == \
            (signal.SIG_DFL, before[1])
    finally:
        signal.signal(signal.SIGTERM, before[0])


def test_the_interrupt_behind_another_error_is_found_along_its_chain():
    """By hand: an error raised while an interrupt was handled (its context), one raised from
    such an error (its cause), a chain that loops back on itself, and errors with no interrupt
    behind them."""
    from attnverify.errors import Terminated, interrupt_in

    def behind(stop):
        try:
            try:
                raise stop
            except BaseException:  # noqa: BLE001 - a library's handler
                raise AssertionError  # noqa: B904 - the context, as Hypothesis's assert has it
        except AssertionError as exc:
            return exc

    first = behind(KeyboardInterrupt())
    assert isinstance(interrupt_in(first), KeyboardInterrupt) and interrupt_in(first) is \
        first.__context__
    caused = ValueError("wrapped")
    caused.__cause__ = behind(Terminated(15))
    assert isinstance(interrupt_in(caused), Terminated)
    looped = ValueError("a")
    looped.__context__ = RuntimeError("b")
    looped.__context__.__context__ = looped
    assert interrupt_in(looped) is None and interrupt_in(ValueError()) is None
    assert interrupt_in(None) is None


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_swallowed_interrupt_is_raised_again_until_the_run_ends(sig):
    """A signal's interrupt that a library swallows (``except BaseException: pass``) is raised
    again by ``raise_if_swallowed``, where the run next goes forward; it does nothing without
    a signal, and a new run (the outermost block) starts with none noted."""
    import signal

    from attnverify.errors import raise_if_swallowed, terminating_as_interrupt

    signum = getattr(signal, sig)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with terminating_as_interrupt():
            raise_if_swallowed()  # nothing came
            try:
                signal.raise_signal(signum)
                for _ in range(1000):  # the handler runs in here
                    pass
            except KeyboardInterrupt:
                pass  # swallowed
            with pytest.raises(KeyboardInterrupt) as again:
                raise_if_swallowed()
            assert getattr(again.value, "signum", signal.SIGINT) == signum
        raise_if_swallowed()  # the run is over: nothing noted for the next
        with terminating_as_interrupt():
            raise_if_swallowed()
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def test_sigterm_is_an_interrupt_unless_the_caller_chose_otherwise():
    """Inside a command, SIGTERM (and SIGHUP) at their default disposition raise
    ``Terminated`` once (exit 143), a second one during the unwinding is ignored, and a signal
    the caller ignores (``nohup``) or handles stays so; all of it is restored afterwards."""
    import os
    import signal

    from attnverify.errors import Terminated, interrupt_exit_code, terminating_as_interrupt

    def handler(*_):
        raise AssertionError("the caller's own handler")

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        with pytest.raises(Terminated) as caught, terminating_as_interrupt():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN  # nohup: left alone
            try:
                os.kill(os.getpid(), signal.SIGTERM)
            finally:
                os.kill(os.getpid(), signal.SIGTERM)  # during the unwinding: ignored
        assert interrupt_exit_code(caught.value) == 143
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        signal.signal(signal.SIGTERM, handler)
        with terminating_as_interrupt():
            assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        for sig, previous in before.items():
            signal.signal(sig, previous)
