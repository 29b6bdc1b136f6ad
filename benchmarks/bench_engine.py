"""The suite's own engines, so that they cannot quietly get slower.

- ``SpectralNorm``: :func:`attnverify.jacobian.spectral_norm` of the softmax Jacobian of one
  float64 row, against L (matrix-free, so it should grow about linearly in L).
- ``ModelCheck``: each model-check experiment of ``attnverify empirical`` at its ``--quick``
  sizes on ``tiny-gpt2-random`` (seeded random weights, no download), in-process, writing into a
  temporary directory.

A commit without the engine skips (``NotImplementedError`` in ``setup``). The scripts
``bench_jacobian.py`` and ``bench_empirical.py`` give the full-size tables; these are the
regression guards asv can run on every commit.
"""

from __future__ import annotations

import functools
import importlib.util
import shutil
import tempfile
from pathlib import Path

from . import devices

EXPERIMENTS = (
    "distance_vs_length",
    "distance_vs_topn",
    "critical_topn",
    "separability",
    "gradient",
    "rank_collapse",
)

#: Text the model check reads: deterministic, made in setup (no data file needed).
_TEXT = "It was the best of times, it was the worst of times, it was the age of wisdom. " * 400


class SpectralNorm:
    """``‖J‖₂`` of softmax at one N(0, 1) float64 row of length L (Lanczos, default settings)."""

    params = [[1024, 4096, 16384]]
    param_names = ["L"]
    timeout = 300

    def setup(self, L):
        try:
            from attnverify.jacobian import spectral_norm
        except ImportError as exc:
            raise NotImplementedError(f"attnverify.jacobian is missing: {exc}") from exc
        import torch

        devices.configure_threads()
        gen = torch.Generator().manual_seed(0)
        self.z = torch.randn(L, generator=gen, dtype=torch.float64)
        self.run = functools.partial(spectral_norm, functools.partial(torch.softmax, dim=-1))
        self.run(self.z)

    def time_spectral_norm(self, L):
        self.run(self.z)


class ModelCheck:
    """Seconds for one model-check experiment (``--quick`` sizes, ``tiny-gpt2-random``)."""

    params = [list(EXPERIMENTS)]
    param_names = ["experiment"]
    timeout = 600
    number = 1
    repeat = (1, 3, 60.0)
    warmup_time = 0.0

    def setup(self, experiment):
        missing = [m for m in ("transformers", "tqdm") if importlib.util.find_spec(m) is None]
        if missing:  # the "models" extra
            raise NotImplementedError(f"the model check needs {', '.join(missing)}")
        try:
            from attnverify.empirical.cli import main
        except ImportError as exc:
            raise NotImplementedError(f"attnverify.empirical is missing: {exc}") from exc
        self.tmp = Path(tempfile.mkdtemp(prefix="attnverify-bench-"))
        text = self.tmp / "text.txt"
        text.write_text(_TEXT, encoding="utf-8")
        self.argv = [
            "--model", "tiny-gpt2-random", "--quick", "--experiments", experiment,
            "--text", str(text), "--out", str(self.tmp / "out"), "--no-progress",
        ]  # fmt: skip
        self.main = main
        self.run()  # imports, model construction caches: not what is timed

    def run(self):
        shutil.rmtree(self.tmp / "out", ignore_errors=True)
        code = self.main(list(self.argv))
        if code != 0:
            raise RuntimeError(f"attnverify empirical {' '.join(self.argv)} exited {code}")

    def teardown(self, experiment):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def time_experiment(self, experiment):
        self.run()
