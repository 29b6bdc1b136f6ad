"""Argument checks shared by the strategies: each raises
:class:`hypothesis.errors.InvalidArgument` naming the argument."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy


def _check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> None:
    """``value`` must be an int in ``[minimum, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name}={value!r} must be an integer")
    if value < minimum:
        raise InvalidArgument(f"{name}={value!r} must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise InvalidArgument(f"{name}={value!r} must be at most {maximum}")


def _check_positive(name: str, value: Any) -> None:
    """``value`` must be a finite real number > 0."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value > 0):
        raise InvalidArgument(f"{name}={value!r} must be a finite number > 0")


def _check_order(lo_name: str, lo: Any, hi_name: str, hi: Any) -> None:
    """``lo`` must not exceed ``hi``."""
    if lo > hi:
        raise InvalidArgument(f"{lo_name}={lo!r} is larger than {hi_name}={hi!r}")


def _check_member(name: str, value: Any, allowed: Sequence[Any], drawn: bool = False) -> None:
    """``value`` (given, or ``drawn`` from a strategy option) must be one of ``allowed``."""
    if not any(value is a or value == a for a in allowed):
        said = f"{name} drew {value!r}, which" if drawn else f"{name}={value!r}"
        raise InvalidArgument(f"{said} is not one of {_names(allowed)}")


def _check_choices(name: str, values: Any, allowed: Sequence[Any]) -> None:
    """A non-strategy ``values`` must be a non-empty sequence of members of ``allowed``."""
    if isinstance(values, SearchStrategy):
        return
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise InvalidArgument(
            f"{name}={values!r} must be a non-empty sequence, e.g. {name}=({allowed[0]!r},)"
        )
    for value in values:
        if not any(value is a or value == a for a in allowed):
            raise InvalidArgument(
                f"{name} contains {value!r}, which is not one of {_names(allowed)}"
            )


def _check_device(device: Any) -> None:
    """``device`` must name a device torch can allocate on."""
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, TypeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidArgument(f"device={device!r} cannot be used: {first}") from None


def _names(values: Sequence[Any]) -> str:
    return ", ".join(repr(v) for v in values)


def _static(value: Any, check: Callable[[Any], None]) -> None:
    """Validate ``value`` now unless it is a strategy (then it is validated when drawn)."""
    if value is not None and not isinstance(value, SearchStrategy):
        check(value)


def _resolve(draw: Callable, value: Any, check: Callable[[Any], None] | None = None) -> Any:
    """Draw ``value`` if it is a strategy (and validate the draw), else use it as is."""
    if isinstance(value, SearchStrategy):
        value = draw(value)
        if check is not None:
            check(value)
    return value


def _int_check(name: str, minimum: int) -> Callable[[Any], None]:
    return lambda v: _check_int(name, v, minimum)


def _drawn_member(name: str, allowed: Sequence[Any]) -> Callable[[Any], None]:
    return lambda v: _check_member(name, v, allowed, drawn=True)


def _positive_check(name: str, optional: bool = False) -> Callable[[Any], None]:
    return lambda v: None if v is None and optional else _check_positive(name, v)


def _check_length_options(min_length: Any, max_length: Any, shortest: int = 1) -> None:
    """Validate the non-strategy length bounds."""
    _static(min_length, _int_check("min_length", shortest))
    _static(max_length, _int_check("max_length", shortest))
    if not _any_strategy(min_length, max_length):
        _check_order("min_length", min_length, "max_length", max_length)


def _any_strategy(*values: Any) -> bool:
    return any(isinstance(v, SearchStrategy) for v in values)
