"""Triton kernels under test: the interpreter where no GPU runs them, and what ran, said plainly.

A ``@triton.jit`` kernel decides at decoration time (when the target's module is imported)
whether it compiles for a GPU or runs in Triton's interpreter: ``triton.jit`` reads
``triton.knobs.runtime.interpret`` (the environment variable ``TRITON_INTERPRET``, read on every
access unless a knob was set in the process) and returns an ``InterpretedFunction`` when it is
on. The interpreter runs each program instance of a launch in Python on CPU tensors, with the
kernel's own pointer arithmetic, masks, strides and block loops: what a verifier needs to catch
stride, mask, block-tail and accumulator bugs on a machine without a GPU.

:func:`prepare` is called by the worker (:meth:`attnverify.worker.Server.load`) before it
imports the target, whatever torch, the zygote (whose ``torch._dynamo`` imports triton) or
anything else imported first: it chooses the interpreter where no GPU is visible or where
``ATTNVERIFY_TRITON_INTERPRET=1`` (``certify --triton-interpret``) asks for it, sets the variable
and the knob, and points Triton's caches, dumps and overrides (``TRITON_CACHE_DIR``,
``TRITON_DUMP_DIR``, ``TRITON_OVERRIDE_DIR``, ``TRITON_HOME``) beneath the
worker's private ``TMPDIR`` (:mod:`attnverify.sandbox` lets it write nowhere else). After the
load :func:`kernels_in` finds the Triton kernels the target's import brought in (objects of
Triton's ``KernelInterface`` in the globals of the modules it imported, and of the target's own
module), so a Triton target is recognised without declaring anything; the worker reports both
in its description (``runtime``: ``triton``, ``triton_kernels``), and the checker, for a kernel
run by the interpreter, keeps each call to a few program instances (:data:`MAX_ROWS` rows,
:data:`MAX_PROGRAMS` heads × query blocks of attention) and says so in the certificate.

This module imports nothing of attnverify and imports triton only when it is installed and
only inside these functions (an optional dependency: ``pip install 'attnverify[triton]'``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile

#: ``1``: run Triton kernels in the interpreter even where a GPU is visible (set by ``certify
#: --triton-interpret`` for the workers it starts; read by :func:`prepare` in the worker).
ENV = "ATTNVERIFY_TRITON_INTERPRET"
#: What the description's ``runtime["triton"]`` says when the interpreter ran the kernels.
INTERPRETER = "interpreter"
COMPILED = "compiled"
#: Rows per call of a normalizer whose Triton kernel runs in the interpreter (each row is at
#: least one program instance, each program instance runs in Python).
MAX_ROWS = 8
#: Batch elements × query heads per call of an interpreted attention kernel (GQA groups up to
#: 4 fit), and queries per call (two query blocks of 16, one of 32 or more).
MAX_PROGRAMS = 4
MAX_QUERIES = 17
#: An interpreted Triton target's per-example time limit is the profile's (or ``--timeout``)
#: times this: a slow interpreter is not a hung kernel.
TIME_FACTOR = 3.0
#: The line a missing triton gets (exit 2).
MISSING = "--triton-interpret needs triton: pip install 'attnverify[triton]'"


def installed() -> bool:
    """Whether ``import triton`` can succeed here (without importing it)."""
    if "triton" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def wants_interpreter(environ) -> bool:
    """Whether ``ATTNVERIFY_TRITON_INTERPRET`` forces the interpreter (``ValueError`` on a value
    that is neither on nor off)."""
    value = (environ.get(ENV) or "").strip().lower()
    if value in ("", "0", "off", "false", "no"):
        return False
    if value in ("1", "on", "true", "yes"):
        return True
    raise ValueError(f"{ENV}={value!r}: use 1 or 0")


def _gpu_visible() -> bool:
    """Whether torch sees a GPU Triton could compile for (CUDA or ROCm); checked without
    initialising it."""
    torch = sys.modules.get("torch")
    if torch is None:
        import torch  # torch-free: on the parser's path
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken driver: nothing to compile for
        return False


def prepare(environ=None) -> str | None:
    """Before the target is imported: choose how Triton kernels run here and set it up;
    :data:`INTERPRETER`, :data:`COMPILED`, or ``None`` where triton is not installed.

    The interpreter where no GPU is visible or :data:`ENV` asks for it: ``TRITON_INTERPRET=1``
    in ``environ`` (``os.environ``) and, when triton is already imported (torch's compiler
    imports it), its knob set too, so a value pinned in the process cannot win. Caches, dumps,
    overrides and Triton's home go beneath the temporary directory (the worker's private
    ``TMPDIR``) either way (:func:`variables`)."""
    environ = os.environ if environ is None else environ
    if not installed():
        return None
    interpret = wants_interpreter(environ) or not _gpu_visible()
    for name, value in variables(interpret, tempfile.gettempdir()).items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    if _built_for(not interpret):
        _forget_triton()
    knobs = getattr(sys.modules.get("triton"), "knobs", None)
    if knobs is not None:
        # a knob set in the process (an instance value) wins over the environment: drop them
        for owner, name in ((knobs.cache, "home_dir"), (knobs.cache, "dir"),
                            (knobs.cache, "dump_dir"), (knobs.cache, "override_dir"),
                            (knobs.runtime, "interpret")):
            owner.__dict__.pop(name, None)
        knobs.runtime.interpret = interpret
    return INTERPRETER if interpret else COMPILED


def variables(interpret: bool, tmp: str) -> dict[str, str | None]:
    """The environment Triton reads, for kernels run by the interpreter or compiled, with every
    directory it writes (its cache, where :func:`attnverify.sandbox.private_caches` puts it,
    dumps, overrides, its home) beneath ``tmp`` (the worker's private ``TMPDIR``; Triton makes
    each when it first writes there); ``None``: unset."""
    return {"TRITON_INTERPRET": "1" if interpret else None,
            "TRITON_HOME": os.path.join(tmp, "triton-home"),
            "TRITON_CACHE_DIR": os.path.join(tmp, "triton"),
            "TRITON_DUMP_DIR": os.path.join(tmp, "triton-dump"),
            "TRITON_OVERRIDE_DIR": os.path.join(tmp, "triton-override")}


def _built_for(interpret: bool) -> bool:
    """Whether an imported triton built its own ``@jit`` helpers (``tl.max``, ``tl.sum``, …)
    for ``interpret``: they are made once, when ``triton.language`` is imported (the zygote's
    ``torch._dynamo`` imports it), as compiled functions or as the interpreter's; a kernel of the
    other kind cannot call them ("Cannot call @triton.jit'd outside of the scope of a
    kernel")."""
    standard = sys.modules.get("triton.language.standard")
    helper = getattr(standard, "max", None)
    if helper is None:
        return False
    return (type(helper).__name__ == "InterpretedFunction") == interpret


def _forget_triton() -> None:
    """Drop triton's Python modules (not its native ``triton._C``, which cannot load twice), so
    the target's ``import triton`` builds them afresh under the mode just set. What imported
    the old ones (torch's compiler) keeps them; the target gets the new ones."""
    for name in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
        if not name.startswith("triton._C"):
            del sys.modules[name]


def kernels_in(modules) -> list[str]:
    """The names of the Triton kernels (``@triton.jit``, ``@triton.autotune``,
    ``@triton.heuristics`` objects) bound at the top of ``modules``, each once, sorted."""
    jit = sys.modules.get("triton.runtime.jit")
    kind = getattr(jit, "KernelInterface", None)
    if kind is None:
        return []
    found = set()
    for module in modules:
        top = str(getattr(module, "__name__", "")).partition(".")[0]
        if top in ("triton", "torch"):  # their own helpers are not the target's kernels
            continue
        names = getattr(module, "__dict__", None)
        if not isinstance(names, dict):
            continue
        for name, value in list(names.items()):
            try:
                if isinstance(value, kind):
                    found.add(f"{getattr(module, '__name__', '?')}.{name}")
            except Exception:  # noqa: BLE001 - an object whose class lookup raises
                continue
    return sorted(found)


def execution(device: str, runtime: dict) -> str:
    """What ran a target, for the console and the certificate: ``"cpu"``, or ``"cpu, Triton
    interpreter"`` for Triton kernels the interpreter ran."""
    mode = runtime.get("triton") if isinstance(runtime, dict) else None
    if mode == INTERPRETER:
        return f"{device}, Triton interpreter"
    if mode == COMPILED:
        return f"{device}, Triton compiled"
    return str(device)


def time_factor(runtime) -> float:
    """What the per-example time limit of a target with this ``runtime`` is multiplied by."""
    return TIME_FACTOR if interpreted(runtime) else 1.0


def interpreted(runtime) -> bool:
    """Whether a worker's ``runtime`` says its target's Triton kernels ran in the interpreter."""
    return isinstance(runtime, dict) and runtime.get("triton") == INTERPRETER
