"""Numeric helpers shared by the test modules (pytest puts this folder on ``sys.path``)."""

from __future__ import annotations

import torch

from attnverify.tolerances import Tol, tol_for

F64 = torch.float64
TOL = tol_for(F64)


def close(actual, expected, what: str, tol: Tol = TOL, rtol: float | None = None) -> None:
    """``actual ≈ expected`` in float64 within ``tol`` (``rtol`` overrides its relative part)."""
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=F64),
        torch.as_tensor(expected, dtype=F64),
        rtol=tol.rtol if rtol is None else rtol,
        atol=tol.atol,
        msg=lambda m: f"{what}: {m}",
    )
