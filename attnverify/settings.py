"""Environment switches of the fused softmax, parsed in one place and without importing torch.

- ``ATTNVERIFY_FUSED``: ``1``/``on`` (default) or ``0``/``off`` — whether the built-in softmax
  may run the fused CPU kernel (:mod:`attnverify.normalizers.fused`);
- ``ATTNVERIFY_FUSED_ISA``: ``scalar``, ``avx2`` or ``avx512`` — force one instruction set (unset:
  the best the CPU has).

A bad value is a :class:`UsageError` (one line, exit 2 from the command line), raised before any
command runs.
"""

from __future__ import annotations

import os

from attnverify.errors import UsageError

#: Kernel instruction-set levels, as ``_fused.c`` numbers them.
ISA_LEVELS = {"scalar": 1, "avx2": 2, "avx512": 3}
_ON = ("", "1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")


def fused_enabled() -> bool:
    value = os.environ.get("ATTNVERIFY_FUSED", "").strip().lower()
    if value in _OFF:
        return False
    if value in _ON:
        return True
    raise UsageError(f"ATTNVERIFY_FUSED={value!r}: use 1 or 0 (on or off)")


def fused_isa() -> int:
    """The forced instruction-set level, or 0 when none is forced."""
    name = os.environ.get("ATTNVERIFY_FUSED_ISA", "").strip().lower()
    if not name:
        return 0
    if name not in ISA_LEVELS:
        raise UsageError(f"ATTNVERIFY_FUSED_ISA={name!r} is not one of {', '.join(ISA_LEVELS)}")
    return ISA_LEVELS[name]


def check() -> None:
    """Raise :class:`UsageError` if an ``ATTNVERIFY_FUSED*`` variable has a bad value."""
    fused_enabled()
    fused_isa()
