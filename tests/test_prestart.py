"""The zygote a command starts before its own imports (attnverify.prestart): what it preloads.

A normalizer run's zygote leaves torch's compiler out (it is about as long to import as torch, and
the checker would wait for it); a run of attention kernels, or one whose targets are not known
(the library's own start), has it. A normalizer that compiles still certifies: it imports the
compiler in its own worker.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap

import pytest

from attnverify import commands, prestart, remote, wire, worker


def _hello(monkeypatch, **kwargs) -> dict:
    sent = []
    real = wire.send

    def capture(sock, message, fds=()):
        sent.append(message)
        return real(sock, message, fds)

    monkeypatch.setattr(prestart.wire, "send", capture)
    proc, sock = prestart.spawn(**kwargs)
    try:
        reply = remote._receive(sock, __import__("time").monotonic() + 300)
        assert reply.get("ok") is True
    finally:
        sock.close()
        proc.kill()
        proc.wait()
    return sent[0]


def test_a_normalizer_zygote_preloads_no_compiler(monkeypatch):
    hello = _hello(monkeypatch, compiler=False)
    assert hello["preload"] == list(worker.PRELOAD)
    assert "torch._dynamo" not in hello["preload"] and "torch" in hello["preload"]


def test_by_default_and_for_attention_the_compiler_is_preloaded(monkeypatch):
    hello = _hello(monkeypatch)
    assert hello["preload"] == list(worker.PRELOAD_COMPILER)
    assert "torch._dynamo" in hello["preload"]


@pytest.mark.parametrize("args, compiler", [
    (argparse.Namespace(targets=["softmax"], attention=None), False),  # certify
    (argparse.Namespace(targets=[], attention="sdpa"), True),  # certify --attention
    (argparse.Namespace(attention=False), False),  # repro (a flag)
    (argparse.Namespace(attention=True), True),  # repro --attention
    (argparse.Namespace(), False),  # falsify
])
def test_each_command_chooses(monkeypatch, args, compiler):
    chosen = []
    monkeypatch.setattr(prestart, "early", lambda compiler=True: chosen.append(compiler))
    monkeypatch.setattr(commands, "isolation_default", lambda: True)
    commands._early_zygote(args)
    assert chosen == [compiler]


# softmax, unless the worker loaded it with torch's compiler already imported (then the scores
# come back as they are, which no property lets pass); on its first call it compiles a function
COMPILES = textwrap.dedent("""
    import sys

    import torch

    PRELOADED = "torch._dynamo" in sys.modules
    _compiled = []


    def fn(scores, dim=-1):
        if PRELOADED:
            return scores.clone()
        if not _compiled:
            _compiled.append(torch.compile(lambda s, d: torch.softmax(s, d), backend="eager",
                                           dynamic=True))
        return _compiled[0](scores, dim)
""")


@pytest.mark.slow  # a whole certify run from the command line (its own zygote)
def test_a_normalizer_that_compiles_certifies_without_the_compiler_preloaded(tmp_path):
    target = tmp_path / "compiles.py"
    target.write_text(COMPILES)
    done = subprocess.run([sys.executable, "-m", "attnverify", "certify", f"{target}:fn",
                           "--profile", "dev", "--quiet"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CERTIFIED" in done.stdout
