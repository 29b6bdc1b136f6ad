"""The one per-dtype tolerance table (the rule: no literal ``1e-6`` inside a property or bound).

The values are those of ``torch.testing.assert_close``'s defaults, so a failure here means the
same thing as a failure there. Callers compare ``|actual − expected| ≤ atol + rtol·|expected|``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Tol(NamedTuple):
    """Relative and absolute tolerance for one dtype."""

    rtol: float
    atol: float


TOLERANCES: dict[torch.dtype, Tol] = {
    torch.float64: Tol(rtol=1e-7, atol=1e-7),
    torch.float32: Tol(rtol=1.3e-6, atol=1e-5),
    torch.float16: Tol(rtol=1e-3, atol=1e-5),
    torch.bfloat16: Tol(rtol=1.6e-2, atol=1e-5),
}


def tol_for(dtype: torch.dtype) -> Tol:
    """The tolerance of ``dtype``; a dtype without an entry is a ``KeyError`` naming the table."""
    try:
        return TOLERANCES[dtype]
    except KeyError:
        known = ", ".join(str(d).removeprefix("torch.") for d in TOLERANCES)
        raise KeyError(f"no tolerance for dtype {dtype} (table has {known})") from None
