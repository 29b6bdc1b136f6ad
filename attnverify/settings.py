"""Environment switches (the fused softmax, the workers' sandbox), parsed in one place and without
importing torch.

- ``ATTNVERIFY_FUSED``: ``1``/``on`` (default) or ``0``/``off`` — whether the ``softmax_fused``
  target may run the fused CPU kernel (:mod:`attnverify.normalizers.fused`); off, it runs the
  built-in softmax's ``torch.softmax`` path;
- ``ATTNVERIFY_FUSED_ISA``: ``scalar``, ``avx2`` or ``avx512`` — force one instruction set (unset:
  the best the CPU has);
- ``ATTNVERIFY_SANDBOX``: ``1``/``on`` (default) or ``0``/``off`` — whether each worker process
  restricts itself before loading its target (:mod:`attnverify.sandbox`).

Each is read once, at first use, and remembered (reading the environment on every softmax call
cost more than a small softmax); after changing one in a running process call :func:`reload`.
A bad value is a :class:`UsageError` (one line, exit 2 from the command line), raised before any
command runs.
"""

from __future__ import annotations

import os

from attnverify import sandbox
from attnverify.errors import UsageError

#: Kernel instruction-set levels, as ``_fused.c`` numbers them.
ISA_LEVELS = {"scalar": 1, "avx2": 2, "avx512": 3}
_ON = ("", "1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")


_cache: dict[str, object] = {}


def reload() -> None:
    """Forget the values read so far; the next use reads the environment again."""
    _cache.clear()


def fused_enabled() -> bool:
    if "enabled" not in _cache:
        value = os.environ.get("ATTNVERIFY_FUSED", "").strip().lower()
        if value not in _ON + _OFF:
            raise UsageError(f"ATTNVERIFY_FUSED={value!r}: use 1 or 0 (on or off)")
        _cache["enabled"] = value in _ON
    return _cache["enabled"]


def fused_isa() -> int:
    """The forced instruction-set level, or 0 when none is forced."""
    if "isa" not in _cache:
        name = os.environ.get("ATTNVERIFY_FUSED_ISA", "").strip().lower()
        if name and name not in ISA_LEVELS:
            raise UsageError(
                f"ATTNVERIFY_FUSED_ISA={name!r} is not one of {', '.join(ISA_LEVELS)}"
            )
        _cache["isa"] = ISA_LEVELS.get(name, 0)
    return _cache["isa"]


def sandbox_enabled() -> bool:
    """Whether the workers sandbox themselves (``ATTNVERIFY_SANDBOX``, default on)."""
    if "sandbox" not in _cache:
        try:
            _cache["sandbox"] = sandbox.wanted()
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return _cache["sandbox"]


def check() -> None:
    """Read the ``ATTNVERIFY_*`` switches afresh; :class:`UsageError` on a bad value."""
    reload()
    fused_enabled()
    fused_isa()
    sandbox_enabled()
