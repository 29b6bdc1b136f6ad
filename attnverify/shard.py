"""Units of work, and their partition into shards (``certify --shard K/N``).

A certify run is a list of **units**: target × property × dtype × device, in the order the run
checks them. Each property runs once per dtype its cases take (:meth:`Property.unit_dtypes
<attnverify.checks.base.Property.unit_dtypes>`: ``--dtypes``' float32 / float64 for most, the
half types for ``dtype_agreement``, float64 alone for the gradient and paper properties), each
with its own seeded Hypothesis run; a property's result is the combination of its units
(:func:`attnverify.certify.combine`), so a run split into shards and merged
(:mod:`attnverify.merge`) gives the result an unsharded run gives.

The partition depends only on the unit list and N: units sorted by their cost (the seconds a unit
of that target, property and dtype took in the ci profile, :mod:`attnverify.shard_costs`; a
target without a measurement gets the property's median over the built-ins), then each given to
the shard with the least cost so far (longest processing time first), ties to the lowest shard.
No clock, host or random number takes part.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from attnverify.errors import UsageError
from attnverify.shard_costs import BY_PROPERTY, BY_UNIT

#: Most shards a run may be split into.
MAX_SHARDS = 10_000
#: Cost of a unit nothing is known about (seconds, ci profile).
DEFAULT_COST = 0.5

_SPEC = re.compile(r"^\s*([0-9]{1,6})\s*/\s*([0-9]{1,6})\s*$")


def parse_shard(text: str | None, option: str = "--shard") -> tuple[int, int] | None:
    """``(K, N)`` from ``"K/N"`` with 1 ≤ K ≤ N ≤ :data:`MAX_SHARDS`; ``None`` for no text;
    anything else is a usage error (exit 2)."""
    if text is None or str(text).strip() == "":
        return None
    m = _SPEC.match(str(text))
    if not m or not str(text).isascii():
        raise UsageError(f"{option}: expected K/N (shard K of N, 1 ≤ K ≤ N), got {text!r}")
    k, n = int(m.group(1)), int(m.group(2))
    if not 1 <= n <= MAX_SHARDS:
        raise UsageError(f"{option}: N must be between 1 and {MAX_SHARDS}, got {text!r}")
    if not 1 <= k <= n:
        raise UsageError(f"{option}: K must be between 1 and N, got {text!r}")
    return k, n


def check_options(text: str | None, ctx, *, xfails=None,
                  option: str = "--shard") -> tuple[int, int] | None:
    """``--shard K/N`` parsed (exit 2 on a bad one), and the options a shard cannot take: a seed
    drawn per process (every shard must search with the same seed) and ``--xfails`` (applied to
    the merged certificate, ``attnverify merge --xfails``)."""
    shard = parse_shard(text, option)
    if shard is None:
        return None
    if getattr(ctx, "seed_source", "fixed") == "random":
        raise UsageError(f"{option} with --seed random: every shard must use the same seed; "
                         "draw one for the whole run and give it to each shard (--seed S)")
    if xfails:
        raise UsageError(f"{option} with --xfails: apply the xfails to the merged certificate "
                         "(attnverify merge PART.json ... --xfails FILE)")
    return shard


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def unit_id(target: str, prop: str, dtype: str, device: str) -> str:
    return f"{target}::{prop}::{dtype}::{device}"


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` over ``plan`` (every unit id of the run, in run order, with
    the shard it belongs to)."""

    index: int
    count: int
    plan: tuple[tuple[str, int], ...]

    @property
    def units(self) -> tuple[str, ...]:
        """The unit ids this shard runs."""
        return tuple(u for u, k in self.plan if k == self.index)

    @functools.cached_property
    def owners(self) -> dict[str, int]:
        """unit id -> its shard, built once (a selector per property must not rebuild it)."""
        return dict(self.plan)

    def selector(self, target: str, prop: str, device: str):
        """``dtype name -> bool``: whether this shard runs that unit of ``target::prop``."""
        owners = self.owners
        return lambda dtype: owners.get(unit_id(target, prop, dtype, device)) == self.index

    def to_json(self) -> dict:
        return {"index": self.index, "count": self.count, "units": list(self.units),
                "plan": {u: k for u, k in self.plan}}


def cost(uid: str) -> float:
    """Seconds the unit took in the ci profile (:mod:`attnverify.shard_costs`), else the
    property's median over the built-ins at that dtype, else over every dtype, else
    :data:`DEFAULT_COST`."""

    target, prop, dtype, _device = uid.split("::")
    key = f"{target}::{prop}::{dtype}"
    if key in BY_UNIT:
        return BY_UNIT[key]
    return BY_PROPERTY.get(f"{prop}::{dtype}", BY_PROPERTY.get(prop, DEFAULT_COST))


def partition(units: list[str], count: int) -> list[int]:
    """The shard (1…``count``) of each unit, longest processing time first: a pure function of
    the unit ids (their order included) and ``count``."""
    load = [0.0] * count
    owner = [0] * len(units)
    order = sorted(range(len(units)), key=lambda i: (-cost(units[i]), i))
    for i in order:
        k = min(range(count), key=lambda j: (load[j], j))
        owner[i] = k + 1
        load[k] += cost(units[i])
    return owner


def make_shard(index: int, count: int, units: list[str]) -> Shard:
    """Shard ``index`` of ``count`` over ``units`` (duplicates are an internal error)."""
    if len(set(units)) != len(units):
        raise ValueError("unit ids must be unique")
    return Shard(index, count, tuple(zip(units, partition(units, count))))


def loads(plan: dict[str, int], count: int) -> list[float]:
    """The cost each shard of ``plan`` carries (the balance the docs cite)."""
    out = [0.0] * count
    for uid, k in plan.items():
        out[k - 1] += cost(uid)
    return out
