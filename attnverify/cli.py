"""The ``attnverify`` command line (docs/INTERFACES.md): exit 0 ok, 1 violated, 2 bad input."""

from __future__ import annotations

import argparse
import difflib
import gc
import os
import sys
from collections.abc import Callable

import attnverify
from attnverify import settings
from attnverify.commands import COMMANDS, triton_mode
from attnverify.empirical.cli import add_parser as add_empirical
from attnverify.empirical.cli import run as run_empirical
from attnverify.errors import (
    UsageError,
    check_not_shadowed,
    in_job,
    interrupt_exit_code,
    interrupt_word,
    terminating_as_interrupt,
)
from attnverify.registry import builtins, entry_point_names, load_target

EXIT_OK, EXIT_VIOLATION, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors raised as :class:`UsageError` (one line, exit 2); an unknown
    option or command gets the closest known one suggested, and the help of the subcommand it
    was given to."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise UsageError(f"{message} (see '{self.prog} --help')")

    def parse_args(self, args=None, namespace=None):
        self._options_before_command(sys.argv[1:] if args is None else list(args))
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self._unknown(parsed, extras)
        return parsed

    def _unknown(self, parsed, extras: list[str]):
        """A usage error for the arguments no parser took: the first option-like one with the
        closest option of the subcommand it was given to (``--profle`` → ``--profile``)."""
        sub = self._subparser(getattr(parsed, "command", None))
        parser = sub or self
        option = next((e for e in extras if e.startswith("-") and e != "-"), None)
        if option is None:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        name = option.split("=", 1)[0]
        known = [o for action in parser._actions for o in action.option_strings
                 if o.startswith("--")] if name.startswith("--") else \
            [o for action in parser._actions for o in action.option_strings]
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f": did you mean {close[0]}?" if close else ""
        parser.error(f"unrecognized option {name}{hint}")

    def _options_before_command(self, argv: list[str]):
        """``attnverify --profile ci certify``: a command's option given before the command is
        named as such, with the command's closest option, instead of its value being taken for
        an unknown command."""
        subs = next((a for a in self._actions if isinstance(a, argparse._SubParsersAction)),
                    None)
        if subs is None:
            return
        top = {o for action in self._actions for o in action.option_strings}
        index = next((i for i, a in enumerate(argv) if a in subs.choices), None)
        if index is None:
            return
        early = [a for a in argv[:index] if a.startswith("-") and a != "-"
                 and a.split("=", 1)[0] not in top]
        if not early:
            return
        command, name = argv[index], early[0].split("=", 1)[0]
        sub = subs.choices[command]
        known = [o for action in sub._actions for o in action.option_strings]
        close = name if name in known else next(
            iter(difflib.get_close_matches(name, known, n=1, cutoff=0.6)), None)
        hint = f" (did you mean {close}?)" if close and close != name else ""
        where = f"; options go after the command: 'attnverify {command} {close or name} ...'" \
            if close else ""
        self.error(f"unrecognized option {name} before the command {command!r}{hint}{where}")

    def _subparser(self, command: str | None):
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and command:
                return action.choices.get(command)
        return None

    def _check_value(self, action, value):
        if action.choices is not None and value not in action.choices and \
                isinstance(action, argparse._SubParsersAction):
            close = difflib.get_close_matches(str(value), list(action.choices), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            self.error(f"unknown command {value!r}{hint} (commands: "
                       f"{', '.join(action.choices)})")
        return super()._check_value(action, value)


def _cmd_list(args) -> int:
    from attnverify.attention.kernels import list_rows  # dispatch: imports torch

    rows = [("id", "space", "parameters", "source")]
    specs = list(builtins().values())
    for name in entry_point_names():
        try:
            specs.append(load_target(name))
        except UsageError as exc:
            print(f"warning: {exc}", file=sys.stderr)
    for spec in specs:
        params = ", ".join(f"{k}={v}" for k, v in spec.params.items()) or "-"
        source = spec.citation if spec.source == "builtin" else spec.source
        rows.append((spec.id, spec.space, params, source))
    print(_table(rows))
    print("\nattention targets (certify --attention TARGET):")
    print(_table(list_rows()))
    return EXIT_OK


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _commands() -> dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable]]:
    """name -> (help, add_arguments, run). Commands from other modules register here."""
    return {
        "list": ("the normalizer registry: id, output space, parameters, source",
                 lambda p: None, _cmd_list),
        **COMMANDS,
    }


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = _Parser(prog="attnverify", description="Property-based verification and benchmarks "
                     "for attention normalizers (exit 0 ok, 1 violated or falsified, 2 bad input).")
    parser.add_argument("--version", action="version",
                        version=f"attnverify {attnverify.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands = _commands()
    for name, (help_text, add_arguments, _run) in commands.items():
        add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    add_empirical(sub)
    commands["empirical"] = ("the model check", None, run_empirical)
    return parser, commands


#: Where Hypothesis keeps its own files (its cache of source constants) for command-line runs,
#: unless ``HYPOTHESIS_STORAGE_DIRECTORY`` says: never a ``.hypothesis/`` in the working
#: directory. Example databases are only where ``--database`` puts them.
def hypothesis_home() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "attnverify", "hypothesis")


#: Set for a command-line run (and its subprocesses) unless the environment sets it: no
#: Hypothesis plugin (the ``hypothesis`` entry points of installed packages: trio's, which
#: imports pytest, HypoFuzz's) is loaded when Hypothesis is imported. A run draws its cases from
#: attnverify's own strategies and uses no plugin; loading them is start-up time for nothing.
NO_PLUGINS = "HYPOTHESIS_NO_PLUGINS"


def main(argv: list[str] | None = None, *, raise_usage: bool = False) -> int:
    """Run the command ``argv`` (``sys.argv[1:]`` if ``None``) and return its exit code; a
    usage error is printed as one line (exit 2), or raised where ``raise_usage`` (a job of
    ``certify --jobs``, whose parent prints it once for all jobs)."""
    mine = {"HYPOTHESIS_STORAGE_DIRECTORY": hypothesis_home(), NO_PLUGINS: "1"}
    mine = {key: value for key, value in mine.items() if key not in os.environ}
    os.environ.update(mine)  # for this run (and its subprocesses) only
    try:
        with terminating_as_interrupt():
            return _main(argv, raise_usage)
    finally:
        for key in mine:
            os.environ.pop(key, None)


def _main(argv: list[str] | None, raise_usage: bool = False) -> int:
    try:
        check_not_shadowed()  # a folder named attnverify imported in place of the package
        parser, commands = build_parser()
        args = parser.parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)  # certify --jobs runs it again
        args.own_process = argv is None  # the process's own command line (jobs may fork it)
        if not args.command:
            parser.print_help()
            return EXIT_USAGE
        settings.check()
        with triton_mode(args):
            code = int(commands[args.command][2](args))
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
        return code
    except UsageError as exc:
        if raise_usage:
            raise
        print(f"attnverify: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:  # Ctrl-C, or a terminating signal (Terminated)
        if not in_job():  # a job's parent prints the line once for all its jobs
            print(f"attnverify: {interrupt_word(exc)}", file=sys.stderr)
        return interrupt_exit_code(exc)
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """The reader of the output went away (``attnverify list | head -2``): not the user's error
    and nothing to report. What is still buffered for the closed pipe goes to ``/dev/null`` (so
    that the interpreter's last flush raises nothing either) and the exit is 0: whatever the
    command writes to files it wrote before it printed."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return EXIT_OK


def entry() -> None:
    """The ``attnverify`` command (and ``python -m attnverify``): :func:`main` on the process's
    own command line, then its exit. What is still alive is frozen first (``gc.freeze``): the
    interpreter's last collections would otherwise walk every object of torch, sympy and
    Hypothesis only to find them still referenced, a cost paid after the results are out but
    before the shell gets its exit code (``docs/attention/cpu-report.md``). Everything else of
    the exit (the exit handlers, the flush of open files) runs as before."""
    _discarded_streams()
    code = main()
    gc.freeze()
    sys.exit(code)


def _discarded_streams() -> None:
    """Standard output or error closed when the command began (``attnverify … >&-``): Python
    leaves ``sys.stdout`` or ``sys.stderr`` ``None``, and the command's first print raised (a
    traceback, whatever the command). Each is opened on ``/dev/null`` instead, on its own
    descriptor where that is still free, so the command runs as with that output discarded."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if getattr(sys, name) is not None:
            continue
        opened = os.open(os.devnull, os.O_WRONLY)
        if opened != fd and not _is_open(fd):
            os.dup2(opened, fd)
            os.close(opened)
            opened = fd
        setattr(sys, name, open(opened, "w", encoding="utf-8", errors="backslashreplace"))


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


if __name__ == "__main__":  # pragma: no cover
    entry()
