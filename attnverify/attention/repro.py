"""Re-check one attention property on the exact case of a recipe (the repro of certify)::

    python -m attnverify.attention.repro TARGET PROPERTY '{"b": 1, …, "seed": 5}' \
        [--reference R] [--params JSON]

Exit 1 with the violation while the kernel fails there (or raises), 0 once it holds, 2 for bad
input (one line, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys

from attnverify import remote
from attnverify.attention import cases
from attnverify.attention.properties import ATTENTION_PROPERTIES
from attnverify.certify import make_context
from attnverify.checks.base import NormalizerError, Violation
from attnverify.errors import UsageError, WorkerFailed
from attnverify.repro import attention_spec
from attnverify.runconfig import PROFILES


def recheck(target: str, prop_id: str, recipe: dict, reference: str = "",
            params: dict | None = None) -> int:

    if prop_id not in ATTENTION_PROPERTIES:
        known = ", ".join(ATTENTION_PROPERTIES)
        raise UsageError(f"unknown attention property {prop_id!r} ({known})")
    try:
        case = cases.build({**cases.recipe(), **recipe})
    except (KeyError, ValueError, TypeError) as exc:
        raise UsageError(f"bad recipe: {exc}") from None
    ctx = make_context("dev", timeout=PROFILES["ci"]["timeout_s"])
    try:
        spec = attention_spec(target, params or {}, ctx, reference)  # in its own worker
        ratio = ATTENTION_PROPERTIES[prop_id].check(spec, case, ctx)
    except Violation as exc:
        print(f"{target}::{prop_id} violated: {exc.message}")
        return 1
    except NormalizerError as exc:
        print(f"{target}::{prop_id}: the kernel raised {exc}")
        return 1
    except (WorkerFailed, remote.TargetRaised) as exc:
        what = getattr(exc, "reason", None) or f"raised {exc.remote_type}: {exc}"
        print(f"{target}::{prop_id}: the kernel {what}")
        return 1
    finally:
        remote.shutdown()
    print(f"{target}::{prop_id} holds on this case (worst ratio {ratio:.3g})")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m attnverify.attention.repro")
    p.add_argument("target")
    p.add_argument("property")
    p.add_argument("recipe", help="the counterexample's recipe, as JSON")
    p.add_argument("--reference", default="")
    p.add_argument("--params", default="{}", help="the kernel's parameters, as JSON")
    args = p.parse_args(argv)
    try:
        recipe, params = json.loads(args.recipe), json.loads(args.params)
        if not isinstance(recipe, dict) or not isinstance(params, dict):
            raise UsageError("the recipe and --params must be JSON objects")
        return recheck(args.target, args.property, recipe, args.reference, params)
    except json.JSONDecodeError as exc:
        print(f"attnverify: error: the recipe or --params is not JSON ({exc})", file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"attnverify: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
