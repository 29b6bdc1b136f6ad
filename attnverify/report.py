"""Certificates: the JSON contract (schema_version 1), Markdown, and the terminal table.

Each target says what its verdict covers: ``certified for: …`` (its declared layouts and axes, or
every one) and ``coverage: …`` (:mod:`attnverify.coverage`; the Markdown adds the properties that
covered something else), next to the JSON's ``certified_for`` and ``coverage``.

The report is built from results, never re-derived; files are written atomically (a temporary
file in the same directory, then ``os.replace``), so a partial file never replaces a good one.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

import attnverify
from attnverify.atomic import check_output_path, check_output_paths, write_text_atomic
from attnverify.attention.coverage import describe as describe_attention
from attnverify.certify import TargetResult
from attnverify.checks.base import Context
from attnverify.coverage import describe, describe_difference
from attnverify.errors import (
    UsageError,
    in_job,
    interrupt_exit_code,
    interrupt_signal,
    interrupt_word,
)
from attnverify.registry import builtin_ids
from attnverify.xfails import apply_xfails

SCHEMA_VERSION = 1


def certificate(targets: Iterable[TargetResult], ctx: Context) -> dict[str, Any]:
    targets = list(targets)
    shard = getattr(ctx, "shard", None)  # certify --shard K/N: a partial certificate
    isolated = bool(getattr(ctx, "isolation", False))
    return {
        "schema_version": SCHEMA_VERSION,
        "attnverify_version": attnverify.__version__,
        "torch_version": torch.__version__,
        "device": ctx.device,
        "profile": ctx.profile,
        "seed": ctx.seed,
        # "random": drawn for this run (--seed random); "fixed": given or the default
        "seed_source": getattr(ctx, "seed_source", "fixed"),
        "dtypes": [str(d).removeprefix("torch.") for d in ctx.dtypes],
        "max_examples": ctx.max_examples,
        # per-example time limit (s) and whether targets ran in a worker process (isolation.py)
        "timeout_s": getattr(ctx, "timeout_s", None),
        "isolation": isolated,
        # "process": every target ran in a worker process of its own, the checks here (the
        # checker, checker_pid); "in-process": --no-isolation, the target ran in the checker
        "isolation_mode": "process" if isolated else "in-process",
        # what the worker processes ran under (attnverify.sandbox): "landlock ABI N: …", or
        # "none: …" / "off: …" where they ran without it; each phrase once, over every target
        "sandbox": sandbox_of(targets, isolated),
        "checker_pid": os.getpid(),
        "machine": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        # whether softmax_fused ran its CPU kernel (or softmax's torch path), and which ISA, as
        # the worker that loaded the targets reports it
        "softmax_kernel": next((t.runtime.get("softmax_kernel") for t in targets
                                if t.runtime.get("softmax_kernel")), None),
        "targets": [t.to_json(partial=shard is not None) for t in targets],
        **({"shard": shard.to_json()} if shard is not None else {}),
    }


def sandbox_of(targets, isolated: bool) -> str:
    """The certificate's ``sandbox``: every phrase the targets' workers reported, once each
    (``" | "`` between them)."""
    if not isolated:
        return "none: --no-isolation (the targets ran in the checker's process)"
    seen = list(dict.fromkeys(p for t in targets for p in getattr(t, "sandbox", ()) or ()))
    return " | ".join(seen) if seen else "none: no worker process was started"


def check_writable(path: str | None, option: str = "output") -> None:
    """Fail fast (a usage error) when an output file could not, or must not, be written later:
    see :func:`attnverify.atomic.check_output_path`."""
    if path:
        check_output_path(path, option)


def check_outputs(**paths: str | None) -> None:
    """Every ``--option=path`` checked, and no two naming the same file (``json=…``)."""
    check_output_paths({f"--{name.replace('_', '-')}": p for name, p in paths.items()})


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically; unwritable destinations are usage errors."""
    check_writable(path)
    write_text_atomic(Path(path), text)


def write_json(path: str, data: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(data, indent=2, allow_nan=False) + "\n")


def _ratio(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):  # "inf" / "nan" (attnverify.serialize.number)
        return value
    return f"{value:.3g}"


def ratio_cell(r: dict) -> str:
    """The worst ratio (observed ÷ allowed) of a result as a table shows it: only where it
    means something. A property that holds shows its worst ratio; a violation the ratio of its
    counterexample when that is a number above 1, ``inf`` or ``nan`` (a value that is not a
    number cannot be compared with its bound), else ``—``, so that no ratio below 1, which reads
    as "holds", stands next to VIOLATED; an error, a property not applicable or not run ``—``."""
    status = r["status"]
    if status == "holds":
        return _ratio(r.get("worst_ratio"))
    if status != "violated":
        return "—"
    ce = r.get("counterexample") or {}
    ratio = ce.get("ratio")
    if isinstance(ratio, str):
        return ratio
    if isinstance(ratio, (int, float)) and ratio > 1:
        worst = r.get("worst_ratio")
        return _ratio(worst if isinstance(worst, (int, float)) and worst >= ratio else ratio)
    return "—"


def _status_cell(r) -> str:
    return {"holds": "holds", "violated": "VIOLATED", "error": "ERROR",
            "not_applicable": "n/a", "not_checked": "NOT RUN"}[r["status"]]


def terminal_table(data: dict[str, Any], *, tracebacks: bool = False) -> str:
    """Readable table per target with a verdict line and, per violation, witness and repro
    (``tracebacks``: and the target's own traceback where it raised)."""
    lines = []
    for target in data["targets"]:
        lines.append(f"== {target['target']}  ({', '.join(target['claims']) or 'no claims'})")
        if target.get("execution"):
            lines.append(f"  device: {target['execution']}")
        if target.get("attention"):
            lines.extend(f"  {line}" for line in kernel_lines(target))
        elif target.get("reference"):
            lines.append(f"  reference (float64): {target['reference']}")
        rows = [("property", "claimed", "status", "examples", "worst ratio", "time")]
        for r in target["results"]:
            rows.append((r["property"], "yes" if r["claimed"] else "no", _status_cell(r),
                         str(r["examples"]), ratio_cell(r), f"{r['elapsed_s']:.2f}s"))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for i, row in enumerate(rows):
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
            if i == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
        for r in target["results"]:
            if r["status"] in ("violated", "error"):
                lines.extend(_violation_lines(r, tracebacks))
            elif r["status"] == "not_applicable" and r["claimed"]:
                lines.append(f"  note: {r['property']} not applicable: {r['message']}")
            elif r["status"] == "not_checked":
                lines.append(f"  note: {r['property']} {r['message']}")
        lines.extend(f"  {line}" for line in coverage_lines(target))
        warned = target.get("target_warnings") or []
        lines.extend(f"  the target warned: {w}" for w in warned[:3])
        if len(warned) > 3:
            lines.append(f"  the target warned {len(warned) - 3} more time(s) (all in the JSON)")
        verdict = target["verdict"].upper().replace("_", " ")
        shard = data.get("shard")
        if shard and target["verdict"] != "failed":  # a partial certificate (certify --shard)
            verdict = (f"PARTIAL (shard {shard['index']}/{shard['count']}; attnverify merge "
                       "gives the verdict)")
        lines.append(f"verdict: {target['target']}: {verdict}")
        lines.append("")
    note = isolation_note(data)
    if note:
        lines.append(f"note: {note}")
    return "\n".join(lines).rstrip() + "\n"


#: Who named an attention kernel's reference, in words.
REFERENCE_BY = {"normalizer": "its declared normalizer", "target": "the kernel's own declaration",
                "option": "--reference", "given": "the caller"}


def kernel_lines(target: dict[str, Any]) -> list[str]:
    """An attention target's ``kernel: …`` line (what it declares it computes) and ``reference
    (float64): …`` line (what it was compared with, who named it, where it ran), with a note
    when a ``--reference`` is not the declared normalizer."""

    rec = target["attention"]
    mod = f", score modification {rec['score_mod']}" if rec.get("score_mod") else ""
    ref = str(rec.get("reference") or "")
    how = "eager attention with" if ref in builtin_ids() else "the built-in attention target"
    where = "attnverify's process" if target.get("reference_owner") == "checker" else "its worker"
    if rec.get("normalizer_declared", True):
        kernel = f"kernel: declares normalizer {rec.get('normalizer')}{mod}"
    else:  # a plain function: what was assumed, and how to say otherwise
        kernel = (f"kernel: declares nothing; checked as normalizer {rec.get('normalizer')}{mod} "
                  "(SDPA's, assumed: declare another with attention_spec(fn, normalizer=...))")
    by = REFERENCE_BY.get(rec.get("reference_by"), rec.get("reference_by"))
    if rec.get("reference_by") == "normalizer" and not rec.get("normalizer_declared", True):
        by = "the assumed normalizer"
    out = [kernel, f"reference (float64): {how} {ref}, named by {by}, evaluated in {where}"]
    if ref in builtin_ids() and ref != rec.get("normalizer"):
        out.append(f"note: the reference {ref} is not the normalizer the kernel declares "
                   f"({rec.get('normalizer')})")
    return out


def isolation_note(data: dict[str, Any]) -> str:
    """A line for a run whose targets were not both isolated and sandboxed, else ``""``."""
    sandbox = str(data.get("sandbox") or "")
    if data.get("isolation") is False:
        return ("--no-isolation: the targets ran in the checker's own process, where they can "
                "reach the checks (for debugging, not a verdict to trust)")
    if data.get("isolation") and sandbox and not sandbox.startswith("landlock"):
        return f"the worker processes ran without a sandbox ({sandbox})"
    return ""


def coverage_lines(target: dict[str, Any], *, per_property: bool = False) -> list[str]:
    """``certified for: …`` (``checked for`` unless certified) and ``coverage: …`` (and, with
    ``per_property``, one line per property that covered something else)."""

    block = target.get("coverage")
    if not block:
        return []
    out = []
    if target.get("certified_for"):
        said = "certified for" if target.get("verdict") == "certified" else "checked for"
        out.append(f"{said}: {target['certified_for']}")
    out.append(f"coverage: {describe(block)}")
    if block.get("attention"):
        out.append(f"attention coverage: {describe_attention(block['attention'])}")
    if per_property:
        for prop, diff in (block.get("properties") or {}).items():
            out.append(f"  {prop}: {describe_difference(diff)}")
    return out


#: Longest scores text shown in a table; the JSON and the repro always hold the whole input.
MAX_SHOWN = 400


def counterexample_text(ce: dict[str, Any]) -> str:
    """One line: the exact input that failed (scores with their masks, the batch, dtype,
    temperature, parameters), as the JSON and the repro hold it."""
    scores = ce.get("scores")
    if isinstance(scores, list):
        text = json.dumps(scores).replace('"-inf"', "-inf").replace('"inf"', "inf")
        text = text.replace('"nan"', "nan")
        shown = text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + " …"
    else:
        shown = "(too large to show here: in the JSON and the repro)"
    parts = [f"{ce.get('dtype')}", f"shape {ce.get('shape')}"]
    layout = ce.get("layout")
    if isinstance(layout, dict) and layout.get("text") and not _plain(layout):
        parts.append(f"given as {layout['text']}")
    if ce.get("temperature") is not None:
        parts.append(f"T={ce['temperature']}")
    params = {k: v for k, v in (ce.get("params") or {}).items() if k != "temperature"}
    if params:
        parts.append(f"params {json.dumps(params)}")
    return f"scores={shown} ({', '.join(parts)})"


def _word(value: Any) -> str:
    """A value as the console shows it: a number in ``%g``, text as it is, anything else as
    JSON (never a Python repr)."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (int, str)):
        return str(value)
    return json.dumps(value, default=str)


def _plain(layout: dict[str, Any]) -> bool:
    """The contiguous ``[R, L]`` block with ``dim=-1`` (nothing to say about the layout)."""
    return (len(layout.get("sizes") or []) == 2 and layout.get("dim") == -1
            and layout.get("kinds") == ["contiguous"])


def sequence_text(steps: list) -> str:
    """The earlier calls a counterexample needs, in words: runs of the same property on cases of
    the same shape counted (``40 × simplex on [1, 1]``; an attention case by the shape of its
    scores, ``[b, h, l_q, l_k]``)."""
    runs: list[list] = []
    for step in steps:
        case = step.get("case") if isinstance(step, dict) else None
        recipe = step.get("recipe") if isinstance(step, dict) else None
        shape = ((case or {}).get("shape") or () if not isinstance(recipe, dict) else
                 [recipe.get(k, "?") for k in ("b", "h", "l_q", "l_k")])
        what = (step.get("property") if isinstance(step, dict) else "?", tuple(shape))
        if runs and runs[-1][0] == what:
            runs[-1][1] += 1
        else:
            runs.append([what, 1])
    parts = [f"{'' if n == 1 else f'{n} × '}{prop} on {list(shape)}" for (prop, shape), n in runs]
    if len(parts) > 6:
        parts = parts[:6] + [f"… ({len(runs) - 6} more)"]
    count = len(steps)
    return (f"needs {count} earlier call{'s' if count > 1 else ''} in the same worker, oldest "
            f"first: {', '.join(parts)} (the repro replays them)")


def with_traceback(line: str, traceback: list[str] | None, show: bool, indent: str) -> list[str]:
    """``line`` and, where the target raised, its own traceback below it (``show``, under a
    header at ``indent``), or ``line`` with a pointer to ``--traceback``: as certify and falsify
    print one."""
    if not traceback:
        return [line]
    if not show:
        return [line + " (--traceback shows where in its code)"]
    return [line, f"{indent}traceback (the target's own frames, most recent call last):",
            *(f"{indent}  {entry}" for entry in traceback)]


def _violation_lines(r: dict[str, Any], tracebacks: bool = False) -> list[str]:
    out = with_traceback(f"  {r['property']}: {r['message']}", r.get("traceback"), tracebacks,
                         "    ")
    ce = r.get("counterexample") or {}
    if ce:
        if "scores" in ce:
            out.append(f"    minimal counterexample: {counterexample_text(ce)}")
        extras = {k: ce[k] for k in ("a", "eps", "kind", "seed") if k in ce}
        if "scores" not in ce and ce.get("temperature") is not None:
            extras["temperature"] = ce["temperature"]
        if extras:
            out.append(f"    case: {', '.join(f'{k} {_word(v)}' for k, v in extras.items())}")
        if ce.get("sequence"):
            out.append(f"    {sequence_text(ce['sequence'])}")
        if ce.get("reproduces") is False:
            out.append("    note: re-checking this case alone did not fail again (flaky)")
        if ce.get("shrink_stopped_after") is not None:
            out.append(f"    note: Hypothesis's shrink stopped after {ce['shrink_stopped_after']} "
                       "draws (its budget); attnverify's shrinker went on from its smallest case")
        if "repro" in ce:
            out.append(f"    repro: {ce['repro']}")
    return out


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# attnverify certificate",
        "",
        f"attnverify {data['attnverify_version']}, torch {data['torch_version']}, "
        f"device {data['device']}, profile `{data['profile']}`, seed {data['seed']}, "
        f"dtypes {', '.join(data.get('dtypes', []))}.",
        "",
    ]
    if data.get("isolation") is not None:
        where = ("each target in a worker process of its own (checker pid "
                 f"{data.get('checker_pid')}); sandbox: {data.get('sandbox')}"
                 if data.get("isolation") else isolation_note(data))
        lines += [f"Isolation: {where}.", ""]
    if data.get("softmax_kernel"):
        lines += [f"softmax_fused kernel: {data['softmax_kernel']}.", ""]
    for target in data["targets"]:
        lines += [f"## `{target['target']}` — {target['verdict']}", ""]
        if target.get("execution"):
            lines += [f"Device: {target['execution']}.", ""]
        if target.get("attention"):
            lines += [f"- {line}" for line in kernel_lines(target)] + [""]
        elif target.get("reference"):
            lines += [f"Reference (float64): `{target['reference']}`.", ""]
        cover = coverage_lines(target, per_property=True)
        if cover:
            lines += [f"- {line.strip()}" if not line.startswith("  ") else f"  - {line.strip()}"
                      for line in cover] + [""]
        lines += ["| property | claimed | status | examples | worst ratio | message |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in target["results"]:
            msg = r["message"].replace("|", "\\|")
            lines.append(f"| `{r['property']}` | {'yes' if r['claimed'] else 'no'} | "
                         f"{_status_cell(r)} | {r['examples']} | {ratio_cell(r)} | "
                         f"{msg} |")
        for r in target["results"]:
            ce = r.get("counterexample")
            if ce and "repro" in ce:
                lines += ["", f"**{r['property']}** counterexample: "
                          + (counterexample_text(ce).replace("|", "\\|") if "scores" in ce
                             else ""), "", "```", ce["repro"], "```"]
        lines.append("")
    return "\n".join(lines)


def finish_interrupted(args, data: dict, xfails, exc: KeyboardInterrupt) -> int:
    """Write and print the certificate of a certify run stopped by Ctrl-C or a terminating
    signal (``exc``): what finished, every property that did not ``not_checked``, and
    ``interrupted`` (the signal's name); one line saying so (none in a job of ``--jobs``,
    whose parent says it once); the exit code 128 + the signal."""
    data["interrupted"] = signal.Signals(interrupt_signal(exc)).name
    try:
        finish_certify(args, data, xfails)
    except UsageError:  # "nothing could be checked": the line below says what happened
        pass
    if not in_job():
        results = [r for t in data["targets"] for r in t["results"]]
        done = sum(r["status"] != "not_checked" for r in results)
        outputs = [path for path in (args.json_path, args.markdown_path) if path]
        where = f"; written to {' and '.join(outputs)}" if outputs else ""
        print(f"attnverify: {interrupt_word(exc)}: {done} of {len(results)} properties "
              f"finished, the others are not_checked{where}", file=sys.stderr)
    return interrupt_exit_code(exc)


def finish_certify(args, data: dict, xfails) -> int:
    """Write and print a certify run's certificate; return its exit code: 1 when a claimed
    property failed (after xfails), 2 when no target could be checked at all (every property of
    every target not applicable here: nothing was certified), else 0."""
    exit_code = 1 if any(t["verdict"] == "failed" for t in data["targets"]) else 0
    if xfails is not None:
        exit_code = apply_xfails(data, xfails)
    if args.json_path:
        write_json(args.json_path, data)
    if args.markdown_path:
        write_atomic(args.markdown_path, markdown(data))
    text = terminal_table(data, tracebacks=bool(getattr(args, "traceback", False)))
    if args.quiet:
        text = "\n".join(line for line in text.splitlines()
                         if line.startswith(("verdict:", "note:")))
    print(text)
    unchecked = [t["target"] for t in data["targets"] if t["verdict"] == "not_checked"
                 and all(r["status"] != "not_checked" for r in t["results"])]
    if unchecked and len(unchecked) == len(data["targets"]):
        raise UsageError(f"nothing could be checked here: no property applies to "
                         f"{', '.join(unchecked)} (the reasons are in the table)")
    return exit_code
