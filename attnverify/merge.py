"""``attnverify merge``: partial certificates (``certify --shard K/N``) into one.

Each part lists the plan of the whole run (every unit and its shard) and holds, per property, the
whole result of each unit it ran. The merge checks that the parts belong together (one run: the
same versions, profile, seed, dtypes, device, targets, claims and plan; one part per shard), then
rebuilds each property from its units with :func:`attnverify.certify.combine`, the function an
unsharded run uses, so the merged certificate is the unsharded one, result for result. A shard
that is not given leaves its units ``not_checked``: the targets they belong to read
``not_checked``, never ``certified``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from attnverify.errors import UsageError, signal_word
from attnverify.shard import unit_id
from attnverify.xfails import check_entries, load_xfails

#: Top-level keys every part of one run shares (they describe the run).
SAME = ("schema_version", "attnverify_version", "torch_version", "device", "profile", "seed",
        "dtypes", "max_examples", "timeout_s", "isolation_mode")
#: Per-target keys every part shares.
SAME_TARGET = ("claims", "params", "reference", "reference_owner", "attention")


def load_part(path: str) -> dict[str, Any]:
    """One partial certificate, or a usage error naming ``path``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"merge: cannot read {path}: {exc.__class__.__name__}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"merge: {path} is not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("targets"), list):
        raise UsageError(f"merge: {path} is not an attnverify certificate")
    shard = data.get("shard")
    if not isinstance(shard, dict) or not isinstance(shard.get("plan"), dict):
        raise UsageError(f"merge: {path} is not a partial certificate (made without "
                         "certify --shard K/N)")
    for key in ("index", "count"):
        if not isinstance(shard.get(key), int) or isinstance(shard.get(key), bool):
            raise UsageError(f"merge: {path}: shard.{key} is not an integer")
    return data


def check_together(parts: list[tuple[str, dict]]) -> None:
    """Usage error (one line) unless the parts are shards of one run, each given once."""
    first_path, first = parts[0]
    for path, data in parts[1:]:
        for key in SAME:
            if data.get(key) != first.get(key):
                raise UsageError(f"merge: {path} and {first_path} differ in {key} "
                                 f"({_short(data.get(key))} vs {_short(first.get(key))}): "
                                 "not shards of one run")
        names = [t.get("target") for t in data["targets"]]
        first_names = [t.get("target") for t in first["targets"]]
        if names != first_names:
            raise UsageError(f"merge: {path} and {first_path} certify different targets "
                             f"({_short(names)} vs {_short(first_names)})")
        for t, u in zip(data["targets"], first["targets"]):
            for key in SAME_TARGET:
                if t.get(key) != u.get(key):
                    raise UsageError(f"merge: {path} and {first_path} differ in the {key} of "
                                     f"{t.get('target')!r} ({_short(t.get(key))} vs "
                                     f"{_short(u.get(key))})")
        if data["shard"]["count"] != first["shard"]["count"]:
            raise UsageError(f"merge: {path} is a shard of {data['shard']['count']}, "
                             f"{first_path} of {first['shard']['count']}")
        if data["shard"]["plan"] != first["shard"]["plan"]:
            raise UsageError(f"merge: {path} and {first_path} were planned differently (other "
                             "targets, claims, properties or dtypes)")
    seen: dict[int, str] = {}
    for path, data in parts:
        k, n = data["shard"]["index"], data["shard"]["count"]
        if not 1 <= k <= n:
            raise UsageError(f"merge: {path}: shard {k}/{n} is out of range")
        if k in seen:
            raise UsageError(f"merge: {path} and {seen[k]} are both shard {k}/{n} "
                             "(overlapping shards)")
        seen[k] = path
        planned = sorted(u for u, owner in data["shard"]["plan"].items() if owner == k)
        if sorted(data["shard"].get("units") or []) != planned:
            raise UsageError(f"merge: {path}: the units it lists are not those its plan gives "
                             f"shard {k}/{n}")


def _short(value, limit: int = 60) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def merge_parts(parts: list[tuple[str, dict]], stopped: str | None = None) -> dict[str, Any]:
    """The merged certificate of ``parts`` (``[(path, data)]``, already :func:`check_together`):
    the unsharded run's certificate, with ``merged_from`` (each part's shard, machine and checker
    pid) and ``missing_shards`` (the shards not given). ``stopped``: the signal's name where the
    run was stopped (``certify --jobs`` interrupted), or a part says it was (``interrupted``):
    the units not run did not finish, and the certificate says ``interrupted``."""
    # torch-free: on the parser's path (jobs imports merge)
    from attnverify.certify import PropertyResult, TargetResult, combine

    first = parts[0][1]
    device = first.get("device") or "cpu"
    count = first["shard"]["count"]
    plan = first["shard"]["plan"]
    by_index = {data["shard"]["index"]: data for _, data in parts}
    given = set(by_index)
    missing = sorted(set(range(1, count + 1)) - given)
    missing_text = (f"belong to shard{'s' if len(missing) > 1 else ''} "
                    f"{', '.join(f'{k}/{count}' for k in missing)}, which was not merged"
                    if missing else "")
    stopped = stopped or next((d["interrupted"] for _, d in parts
                               if isinstance(d.get("interrupted"), str)), None)
    if stopped:
        missing_text = f"did not finish: the run was {signal_word(stopped)}"
    targets = []
    for ti, head in enumerate(first["targets"]):
        name = head["target"]
        versions = [data["targets"][ti] for _, data in parts]
        target = TargetResult(target=name, claims=list(head.get("claims") or []),
                              params=dict(head.get("params") or {}),
                              reference=head.get("reference"),
                              reference_owner=head.get("reference_owner"),
                              attention=head.get("attention"),
                              execution=head.get("execution"),
                              call_cap=(head.get("coverage") or {}).get("per_call"))
        for version in versions:
            target.worker_pids += [p for p in version.get("worker_pids") or []
                                   if p not in target.worker_pids]
            for phrase in str(version.get("sandbox") or "").split(" | "):
                if phrase and phrase not in target.sandbox:
                    target.sandbox.append(phrase)
            for text in version.get("target_warnings") or []:
                if isinstance(text, str) and text not in target.target_warnings:
                    target.target_warnings.append(text)
        for ri, r in enumerate(head["results"]):
            if not r.get("units"):  # not split into units (a target that failed to load)
                target.results.append(PropertyResult.from_json(r))
                continue
            units = []
            for ui, u in enumerate(r["units"]):
                data = by_index.get(plan.get(unit_id(name, r["property"], u["dtype"], device)))
                ran = None
                if data is not None:
                    entry = data["targets"][ti]["results"][ri]["units"][ui]
                    if entry.get("dtype") == u["dtype"] and entry.get("result"):
                        ran = PropertyResult.from_json(entry["result"])
                units.append((u["dtype"], ran))
            target.results.append(combine(r["property"], bool(r.get("claimed", True)), units,
                                          missing=missing_text))
        _effects_seen_elsewhere(target, parts, ti, count, first.get("seed", 0))
        targets.append(target)
    out = dict(first)
    out.pop("shard", None)
    out["targets"] = [t.to_json() for t in targets]
    out["checker_pid"] = None
    out["merged_from"] = [{"shard": f"{d['shard']['index']}/{count}", "path": path,
                           "checker_pid": d.get("checker_pid"), "machine": d.get("machine")}
                          for path, d in sorted(parts, key=lambda p: p[1]["shard"]["index"])]
    out["missing_shards"] = [f"{k}/{count}" for k in missing]
    if stopped:
        out["interrupted"] = stopped
    return out


def _effects_seen_elsewhere(target, parts, index: int, count: int, seed) -> None:
    """``no_side_effects`` checks every call of the run, but each shard's worker saw only that
    shard's calls: a side effect any shard's worker reported (``side_effects`` of its part)
    fails the merged property even where its own units held."""

    # torch-free: on the parser's path (jobs imports merge)
    from attnverify.serialize import repro_command

    result = next((r for r in target.results if r.property == "no_side_effects"), None)
    if result is None or result.status != "holds":
        return
    for _, data in sorted(parts, key=lambda p: p[1]["shard"]["index"]):
        effects = data["targets"][index].get("side_effects") or []
        if not effects:
            continue
        event = effects[0]
        result.status = "violated"
        result.worst_ratio = math.inf
        result.message = (f"a call of the normalizer ({event.get('op')} request, call "
                          f"{event.get('call')} of shard {data['shard']['index']}/{count}) "
                          f"changed the global state: {event.get('what')} (the worker "
                          "restored it)")
        case = event.get("case")
        result.counterexample = None
        if isinstance(case, dict):
            result.counterexample = {**case, "observed": len(effects), "bound": 0,
                                     "ratio": "inf",
                                     "changes": [e.get("what") for e in effects],
                                     "repro": repro_command(target.target, case,
                                                            property="no_side_effects",
                                                            reference=None, seed=seed or 0)}
        return


def run_merge_command(args) -> int:
    """``attnverify merge``: exit 0 when every merged target is certified (or not applicable
    here), 1 when a claimed property failed (after ``--xfails``) or a shard is missing, 2 on
    parts that do not belong together (nothing is written)."""
    from attnverify import report  # torch-free: on the parser's path (jobs imports merge)

    report.check_outputs(json=args.json_path, markdown=args.markdown_path)
    xfails = load_xfails(args.xfails) if args.xfails else None
    parts = [(path, load_part(path)) for path in args.parts]
    check_together(parts)
    data = merge_parts(parts)
    if xfails is not None:
        check_entries(xfails, [f"{t['target']}::{r['property']}" for t in data["targets"]
                               for r in t["results"]])
    code = report.finish_certify(args, data, xfails)
    if data.get("interrupted"):
        print(f"merge: incomplete: a part's run was {signal_word(data['interrupted'])} before "
              "all its units finished; they are not_checked", file=sys.stderr)
        code = max(code, 1)
    if data["missing_shards"]:
        print(f"merge: incomplete: shard{'s' if len(data['missing_shards']) > 1 else ''} "
              f"{', '.join(data['missing_shards'])} missing; their units are not_checked",
              file=sys.stderr)
        return max(code, 1)
    return code
