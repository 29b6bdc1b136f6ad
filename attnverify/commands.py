"""Subcommands of ``attnverify`` beyond ``list``: certify, properties, falsify, quantities, claims.

Each entry of :data:`COMMANDS` is ``name -> (help, add_arguments, run)``; ``run`` returns the
exit code (0 ok, 1 violated / falsified, 2 usage, raised as :class:`UsageError`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re

from attnverify import heap, triton_runtime
from attnverify.errors import UsageError
from attnverify.jobs import check_jobs
from attnverify.runconfig import (
    FALSIFY_BUDGETS,
    MAX_EXAMPLES_LIMIT,
    PROFILE_NAMES,
    PROFILES,
    RANDOM_SEED,
    check_budget,
    check_max_examples,
    check_max_length,
    check_seed,
    check_timeout,
    check_workers,
    isolation_default,
)

PROFILE_CHOICES = PROFILE_NAMES
_TIMEOUTS = ", ".join(f"{name} {limits['timeout_s']} s" for name, limits in PROFILES.items())
_FALSIFY_EVALUATIONS = ", ".join(f"{name} {b['evaluations']:g}"
                                 for name, b in FALSIFY_BUDGETS.items())
_FALSIFY_SECONDS = ", ".join(f"{name} {b['seconds']:g} s" for name, b in FALSIFY_BUDGETS.items())


def _argument_type(check):
    """An argparse ``type`` from a :mod:`attnverify.runconfig` checker (its message kept)."""

    def parse(text: str):
        try:
            return check(text)
        except UsageError as exc:
            # argparse names the option already: "argument --seed: expects an integer, …"
            raise argparse.ArgumentTypeError(re.sub(r"^--[\w-]+ ", "", str(exc))) from None

    parse.__name__ = check.__name__.removeprefix("check_")
    return parse


def _positive_int(text: str) -> int:
    try:
        value = int(text) if text.strip().lstrip("+-").isdigit() and text.isascii() else None
    except ValueError:
        value = None
    if value is None:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text[:40]!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return _argument_type(check_max_examples)(value)


def _seed(text: str):
    """``--seed``: an integer 0…2**64−1, or ``random`` (a fresh seed drawn for this run)."""
    if text.strip().lower() == RANDOM_SEED:
        return RANDOM_SEED
    return _argument_type(check_seed)(text)


def _timeout(text: str) -> float:
    return _argument_type(check_timeout)(text)


def _budget(text: str) -> float:
    return _argument_type(check_budget)(text)


def _jobs(text: str) -> int:
    return _argument_type(check_jobs)(text)


def _max_length(text: str) -> int:
    return _argument_type(check_max_length)(text)


#: What certify's --max-examples bounds, in its help (and docs/USAGE.md): the search, not the
#: fixed battery of edge cases every property checks first.
CERTIFY_EXAMPLES = ("examples Hypothesis draws per property, shared among its dtypes (default "
                    "per profile: " + ", ".join(f"{k} {v['max_examples']}" for k, v in
                                               PROFILES.items()) +
                    "); each property first checks a fixed battery of edge cases (tens of "
                    "inputs) that this does not bound, so the 'examples' a table counts are "
                    "more")


def _add_search_options(p: argparse.ArgumentParser,
                        examples: str = CERTIFY_EXAMPLES) -> None:
    p.add_argument("--params", default=None, help="normalizer parameters, k=v,k=v")
    p.add_argument("--profile", choices=PROFILE_CHOICES, default=None,
                   help="search budget (default: $ATTNVERIFY_PROFILE or ci)")
    p.add_argument("--max-examples", type=_positive_int, default=None,
                   help=f"{examples}; 1 to {MAX_EXAMPLES_LIMIT} (overrides the profile)")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the search, 0 to 2**64-1 "
                   "(default 0), or 'random': a fresh seed, recorded in the results and in every "
                   "repro line")
    p.add_argument("--timeout", type=_timeout, default=None, metavar="SECONDS",
                   help="per-example time limit of the worker process (default per profile: "
                   f"{_TIMEOUTS}); an example that runs longer fails its property")
    p.add_argument("--no-isolation", action="store_true",
                   help="load the target in this process (debugging: no process boundary, no "
                   "time limit, and a target that exits ends the run; also "
                   "ATTNVERIFY_ISOLATION=0); the certificate records it")
    _add_triton_option(p)


def _add_triton_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--triton-interpret", action="store_true",
                   help="run the targets' Triton kernels in Triton's interpreter even where a "
                   "GPU is visible (where none is, they always run there); needs "
                   "attnverify[triton]")


@contextlib.contextmanager
def triton_mode(args):
    """For the run of one command: where Triton kernels run in the workers it starts
    (:mod:`attnverify.triton_runtime`). ``--triton-interpret`` (without triton: a usage error
    naming the extra) and ``--device cpu`` ask for the interpreter (CPU tensors are what it
    runs: a compiled kernel cannot take them, even where a GPU is visible); without either a
    worker runs compiled kernels where it sees a GPU, the interpreter elsewhere."""
    forced = bool(getattr(args, "triton_interpret", False))
    if forced and not triton_runtime.installed():
        raise UsageError(triton_runtime.MISSING)
    if not forced and str(getattr(args, "device", "")).strip() != "cpu":
        yield
        return
    before = os.environ.get(triton_runtime.ENV)
    os.environ[triton_runtime.ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(triton_runtime.ENV, None)
        else:
            os.environ[triton_runtime.ENV] = before


# --------------------------------------------------------------------------------------------
# certify


def _certify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("targets", nargs="*", metavar="TARGET",
                   help="built-in id, module:attr, file.py:attr or entry point (default: all "
                   "built-ins)")
    p.add_argument("--claims", default=None,
                   help="comma-separated claims replacing the target's own ('' = none)")
    _add_search_options(p)
    p.add_argument("--dtypes", default=None, help="default float32,float64")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--json", dest="json_path", default=None, help="write the JSON certificate")
    p.add_argument("--markdown", dest="markdown_path", default=None,
                   help="write a Markdown certificate")
    p.add_argument("--xfails", default=None,
                   help="file of TARGET::PROPERTY patterns (* ? [] allowed; # comments) expected "
                   "to fail; an entry that matches nothing, or every id, is an error")
    p.add_argument("--quiet", action="store_true", help="print only the verdict lines")
    p.add_argument("--traceback", action="store_true",
                   help="where a target raised, print its traceback (its own frames; the JSON "
                   "certificate always holds it)")
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="run shard K of N (units of target x property x dtype x device, "
                   "partitioned by their ci cost) and write a partial certificate for "
                   "'attnverify merge'")
    p.add_argument("--jobs", type=_jobs, default=None, metavar="N",
                   help="checker processes that run the units at once, 1 to 256 (default: "
                   "$ATTNVERIFY_JOBS, else the cores); the certificate "
                   "is the serial run's (--jobs 1) apart from seconds and process ids")
    p.add_argument("--database", default=None, metavar="DIR|redis://HOST:PORT/DB",
                   help="an example database (e.g. one a HypoFuzz campaign filled): every "
                   "property's search replays what it holds for this target first, and files "
                   "its own failures there (default: none)")
    p.add_argument("--reference", default=None, metavar="REF",
                   help="compare every target with REF (a target string: built-in id, "
                   "module:attr, file.py:attr; with --attention an attention target), evaluated "
                   "in float64: adds the claim matches_reference")
    _add_attention_options(p)


def _add_attention_options(p: argparse.ArgumentParser) -> None:
    """``--attention`` (:mod:`attnverify.attention.command`), and ``--reference`` where no one
    else added it."""
    p.add_argument("--attention", default=None, metavar="TARGET[,TARGET]",
                   help="certify attention kernels with SDPA's signature f(q, k, v, attn_mask, "
                   "is_causal, scale): built-in ids (attnverify list), module:attr, file.py:attr")
    if "--reference" not in p._option_string_actions:
        p.add_argument("--reference", default=None, metavar="REF",
                       help="compare with REF: a normalizer id, or (with --attention) an "
                       "attention target")


def _early_zygote(args, defer: bool = False) -> None:
    """Start the worker processes' zygote now, before this process imports the checks
    (:mod:`attnverify.prestart`; ``defer``: as its ``spawn``'s): from the command
    line, forked from this process once it has imported torch (sharing that import's pages);
    called in another program's process, spawned, its import beside this process's. Not for a
    run in this process."""
    from attnverify import prestart  # dispatch: on a run only (wire, its arena), not --help

    if not getattr(args, "no_isolation", False) and isolation_default():
        if getattr(args, "own_process", False):  # the command line's: nothing held yet
            prestart.forked(defer)
        else:  # a caller's process (a test's, a job's): its objects stay out of the workers
            prestart.early(defer)


def _run_certify(args) -> int:
    # with --jobs, each job's zygote is a clone of it. One normalizer: torch._dynamo deferred
    # (each process forks one worker, whose target may never import it: a backward pass does
    # not, nor softmax's forward mode), so the zygote is ready when this process is; several
    # targets, or attention kernels (whose forward mode through torch's decompositions imports
    # it), have it imported once in the zygote instead of once in every worker
    if args.attention is not None and getattr(args, "own_process", False):
        heap.map_large_blocks()  # before the zygote and the jobs fork: they keep it
    _early_zygote(args, defer=args.attention is None and len(args.targets or ()) == 1)
    if getattr(args, "attention", None) is not None:
        if args.database is not None:
            raise UsageError("--database applies to normalizer certification, not --attention")
        from attnverify.attention.command import run_certify  # dispatch: imports torch

        return run_certify(args)
    from attnverify.certify_command import run_certify  # dispatch: imports torch, Hypothesis

    return run_certify(args)


# --------------------------------------------------------------------------------------------
# properties / quantities


def _run_properties(args) -> int:
    from attnverify.attention.properties import ATTENTION_PROPERTIES  # dispatch: imports torch
    from attnverify.checks import PROPERTIES  # dispatch: imports torch, Hypothesis

    width = max(len(p) for p in PROPERTIES)
    for kind, universal in (("universal (always checked)", True), ("claimable", False)):
        print(f"{kind}:")
        for prop in PROPERTIES.values():
            if prop.universal == universal:
                print(f"  {prop.id.ljust(width)}  {prop.statement}")
    print("attention (certify --attention; claimable: attn_convex_hull, attn_fully_masked_row):")
    for prop in ATTENTION_PROPERTIES.values():
        print(f"  {prop.id.ljust(max(width, 27))}  {prop.statement}")
    return 0


def _run_quantities(args) -> int:
    from attnverify.quantities import describe  # dispatch: imports torch

    rows = describe()
    width = max(len(name) for name, _ in rows)
    for name, description in rows:
        print(f"{name.ljust(width)}  {description}")
    return 0


# --------------------------------------------------------------------------------------------
# falsify


def _falsify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="TARGET")
    p.add_argument("inequality", metavar="INEQUALITY", help='e.g. "jacobian_spectral <= 1/(4*T)"')
    _add_search_options(p, examples="evaluations of the inequality the search may spend, its "
                        "extremal battery included (default per profile: "
                        f"{_FALSIFY_EVALUATIONS})")
    p.add_argument("--budget", type=_budget, default=None, metavar="SECONDS",
                   help="time cap of the search (default per profile: "
                   f"{_FALSIFY_SECONDS}); the evaluations cap binds first on a normal run")
    p.add_argument("--max-length", type=_max_length, default=None, metavar="N",
                   help="longest row the search draws, masked keys included (default per "
                   "profile: " + ", ".join(f"{k} {v['max_length']}" for k, v in PROFILES.items())
                   + ")")
    p.add_argument("--database", default=None, metavar="DIR|redis://HOST:PORT/DB",
                   help="an example database shared with other runs, workers and machines (a "
                   "directory, or a Redis server: pip install 'attnverify[fuzz]'): its witnesses "
                   "for this target, bound and version are replayed first, and what this search "
                   "finds is kept there (default: none)")
    p.add_argument("--workers", type=_workers, default=1, metavar="N",
                   help="search processes on this machine, worker i on seed SEED+i, sharing the "
                   "database (a temporary one without --database); the first shrunk witness stops "
                   "them all (default 1)")
    p.add_argument("--json", dest="json_path", default=None, help="write the result as JSON")
    p.add_argument("--traceback", action="store_true",
                   help="where the target raised and stopped the search, print its traceback "
                   "(its own frames)")


def _workers(text: str) -> int:
    return _argument_type(check_workers)(text)


def _run_falsify(args) -> int:
    if (getattr(args, "workers", None) or 1) <= 1:  # --workers N: each has a zygote of its own
        # one search, one worker: torch._dynamo deferred unless the inequality has a Jacobian,
        # whose forward mode through torch's decompositions imports it (softmax's, say): then
        # the zygote's import overlaps this process's instead of holding up the first request
        _early_zygote(args, defer="jacobian" not in str(args.inequality).lower())
    from attnverify import falsify, isolation  # dispatch: import torch, Hypothesis

    if getattr(args, "own_process", False):
        heap.freeze_imports()  # the modules' objects: no full collection walks them again
    return falsify.run_falsify_command(args, isolated=isolation.falsify_in_worker)


# --------------------------------------------------------------------------------------------
# claims


def _claims_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", choices=PROFILE_CHOICES, default=None)
    p.add_argument("--seed", type=_seed, default=0, help="0 to 2**64-1 (default 0)")
    p.add_argument("--json", dest="json_path", default=None, help="write the audit as JSON")
    p.add_argument("--markdown", dest="markdown_path", default=None)


def _run_claims(args) -> int:
    from attnverify.claims import run_claims_command  # dispatch: imports torch, Hypothesis

    return run_claims_command(args)


# --------------------------------------------------------------------------------------------
# repro


def _repro_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="TARGET")
    p.add_argument("--property", default=None, metavar="ID", help="the property to re-check")
    p.add_argument("--inequality", default=None, metavar="INEQUALITY",
                   help="a falsify inequality to re-evaluate instead of a property")
    p.add_argument("--attention", action="store_true",
                   help="TARGET is an attention kernel (as certify --attention runs it)")
    p.add_argument("--case", required=True, metavar="JSON_OR_FILE",
                   help="the case as printed in a repro line (inline JSON or a JSON file)")
    p.add_argument("--params", default=None, help="normalizer parameters, k=v,k=v (override "
                   "the case's)")
    p.add_argument("--reference", default=None, metavar="REF",
                   help="the reference target of matches_reference, as certify was given it")
    p.add_argument("--seed", type=_seed, default=0, help="the seed of the run that printed the "
                   "repro line (as certify was given it)")
    p.add_argument("--timeout", type=_timeout, default=None, metavar="SECONDS",
                   help="time limit of the worker process (default: the ci profile's)")
    p.add_argument("--no-isolation", action="store_true",
                   help="load the target in this process (debugging)")
    _add_triton_option(p)


def _run_repro(args) -> int:
    _early_zygote(args)
    from attnverify.repro import run_repro_command  # dispatch: imports torch

    return run_repro_command(args)


def _none(p: argparse.ArgumentParser) -> None:
    return None


def _merge_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("parts", nargs="+", metavar="PART.json",
                   help="partial certificates written by certify --shard K/N --json")
    p.add_argument("--json", dest="json_path", default=None, help="write the merged certificate")
    p.add_argument("--markdown", dest="markdown_path", default=None,
                   help="write the merged certificate as Markdown")
    p.add_argument("--xfails", default=None,
                   help="file of TARGET::PROPERTY patterns expected to fail, applied to the "
                   "merged results (strict, as certify --xfails)")
    p.add_argument("--quiet", action="store_true", help="print only the verdict lines")


def _run_merge(args) -> int:
    from attnverify.merge import run_merge_command  # dispatch

    return run_merge_command(args)


COMMANDS = {
    "properties": ("property ids with a one-line statement each", _none, _run_properties),
    "quantities": ("quantities usable in a falsify inequality", _none, _run_quantities),
    "certify": ("check a normalizer's universal properties and claims", _certify_args,
                _run_certify),
    "falsify": ("search for the smallest input that breaks an inequality", _falsify_args,
                _run_falsify),
    "claims": ("the audit of the papers' claims (docs/THEORY.md §7)", _claims_args, _run_claims),
    "repro": ("re-check one property (or inequality) on one exact case; exit 1 while it fails",
              _repro_args, _run_repro),
    "merge": ("combine the partial certificates of certify --shard K/N into one", _merge_args,
              _run_merge),
}
