"""The worker: the process that loads the code under test and does nothing but call it.

docs/ARCHITECTURE.md ("Two processes") has the picture. The checker (every check, reference,
tolerance, Hypothesis run, shrink, bound and report) runs in another process and reaches the
target only through the requests of :mod:`attnverify.wire`, which this module answers:

- ``load``: import the target (a normalizer or an attention kernel) and describe what it
  declares (parameters, claims, output space, kernel, reference, restrictions);
- ``call``: the target (or its own kernel ``F``/``F'``, or its own reference) on given tensors;
- ``vjp``: vector–Jacobian products for given cotangents (``create_graph`` tells whether the
  gradient is itself differentiable);
- ``vjp2``: the derivative of ``⟨vjp, outer⟩`` (double backward), with respect to the inputs and
  to the cotangent;
- ``jvp``: a Jacobian–vector product by forward mode (``torch.func.jvp``);
- ``normal``: ``J·v`` and ``Jᵀu`` (``u`` the unit direction of ``J·v``), a step of Lanczos.

Every request gets its inputs in fresh storage with the layout the checker gave (sizes, strides,
storage offset), and the inputs of recent calls stay alive, so no address is reused while a
cache keyed on it could still answer. Every output is checked at the border
(:meth:`Server.accept`): exactly ``torch.Tensor`` (no subclass), strided and materialised, of the
expected shape, dtype and device, sharing storage with no input and with no earlier output
that is still alive (:class:`_Returned`: nothing is kept alive for that check). Around
every call of the code under test the global state a later call depends on (grad mode, default
dtype and device, deterministic algorithms, float32 matmul precision, threads, anomaly mode, the
torch functions this module uses) is compared with its state before the call; a change is
reported to the checker (``side_effects``) and undone.

This module imports :mod:`attnverify.wire` and, to load targets, the loaders
(:mod:`attnverify.registry`, :mod:`attnverify.attention.loader`); never a module of the checker
(``tests/test_isolation.py`` checks it). :class:`Server` also serves the checker's own process
under ``--no-isolation`` (debugging), with the same border checks and state checks.

The process side: a *zygote* (``python -m attnverify.worker zygote FD``) imports torch once and
forks one worker per target on request. A worker starts in a session of its own, with no file
descriptor but its channel (``stdin``/``stdout``/``stderr`` are ``/dev/null``), under a memory
limit on the CPU, and dies with the zygote; the zygote is a child subreaper, so a process a
worker leaves behind is reparented to it and killed.
"""

from __future__ import annotations

import bisect
import builtins
import collections
import dataclasses
import gc
import hashlib
import inspect
import itertools
import operator
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any

from attnverify import heap, sandbox, settings, triton_runtime, wire
from attnverify.errors import TargetImportFailed, UsageError, check_not_shadowed
from attnverify.registry import load_target
from attnverify.spec import NormalizerSpec, normalizer_spec

#: Distinct warnings of the target's calls a worker reports over its life.
MAX_WARNINGS = 20

#: Inputs of recent calls stay referenced, up to this many bytes (no address is reused among
#: them, so a cache keyed on an address cannot answer a later call). Outputs are not kept: their
#: storages are remembered by weak reference (:class:`_Returned`).
RECENT_BYTES = 256 << 20
#: Longest message text sent back (a target's exception message included).
MAX_TEXT = 600


class Border(Exception):
    """An output the checker must not receive (wrong type, shape, aliasing, …)."""


class Raised(Exception):
    """The code under test raised ``cause``."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


def _text(value: Any) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


#: A target's traceback sent back: at most this many lines (its last), each at most this long.
MAX_TRACEBACK_LINES, MAX_TRACEBACK_LINE = 60, 300
_ATTNVERIFY_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_traceback(exc: BaseException) -> list[str]:
    """The traceback of an exception the code under test raised, as Python prints it, with the
    frames of attnverify itself (and of the import machinery) left out: the user's own frames
    and whatever they called; ``[]`` when no frame is left. The last lines only, each made
    printable (a control character becomes a space) and cut short."""

    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not os.path.abspath(f.filename).startswith(_ATTNVERIFY_DIR)
              and not f.filename.startswith("<frozen ")]
    if not frames:
        return []
    lines = [line for entry in traceback.format_list(frames)
             for line in entry.rstrip("\n").splitlines()]
    lines = lines[-(MAX_TRACEBACK_LINES - 1):]
    lines.append(" ".join(traceback.format_exception_only(type(exc), exc)[-1].split()))
    out = []
    for line in lines:
        line = "".join(c if c.isprintable() else " " for c in line.rstrip())
        out.append(line if len(line) <= MAX_TRACEBACK_LINE else
                   line[: MAX_TRACEBACK_LINE - 1] + "…")
    return out


def describe_exception(exc: BaseException) -> tuple[str, str]:
    """``(type name, first line of the message)``, both short and printable."""
    name = type(exc).__name__
    text = str(exc).strip()
    return _text(name)[:80], _text(text.splitlines()[0] if text else "")


# --------------------------------------------------------------------------------------------
# Global state a target must leave as it found it


def _lookup(owner, name: str):
    """``owner``'s own binding of ``name`` (the class dictionaries along its MRO, or the module
    dictionary), without running descriptors: what a patch replaces."""
    for space in getattr(owner, "__mro__", None) or (owner,):
        found = vars(space).get(name, _MISSING)
        if found is not _MISSING:
            return found
    return _MISSING


_MISSING = object()


def _watched_functions():
    """The torch callables this module relies on, by name, with the objects they are now."""
    import torch  # worker: torch loads in the zygote, after this
    import torch.func  # worker: torch loads in the zygote, after this

    owners = {
        "torch": (torch, ("empty", "as_strided", "frombuffer", "is_grad_enabled",
                          "set_grad_enabled", "get_default_dtype", "get_num_threads",
                          "zeros_like", "stack")),
        "torch.Tensor": (torch.Tensor, ("copy_", "detach", "requires_grad_", "untyped_storage",
                                        "data_ptr", "numel", "element_size", "stride",
                                        "storage_offset", "size", "dim", "to", "contiguous",
                                        "view", "__torch_function__")),
        "torch.UntypedStorage": (torch.UntypedStorage, ("_weak_ref", "_expired",
                                                        "_free_weak_ref", "data_ptr", "nbytes")),
        "torch.autograd": (torch.autograd, ("grad",)),
        "torch.func": (torch.func, ("jvp",)),
    }
    out = []
    for owner_name, (owner, names) in owners.items():
        for name in names:
            found = _lookup(owner, name)
            if found is not _MISSING:
                out.append((f"{owner_name}.{name}", owner, name, found))
    return out


def _flags():
    """The global flags a call must leave unchanged: ``[(name, get, set)]``."""
    import torch  # worker: torch loads in the zygote, after this

    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    flags = [
        ("grad mode", torch.is_grad_enabled, torch.set_grad_enabled),
        ("default dtype", torch.get_default_dtype, torch.set_default_dtype),
        ("deterministic algorithms",
         lambda: (torch.are_deterministic_algorithms_enabled(),
                  torch.is_deterministic_algorithms_warn_only_enabled()),
         lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
        ("float32 matmul precision", torch.get_float32_matmul_precision,
         torch.set_float32_matmul_precision),
        ("thread count", torch.get_num_threads, torch.set_num_threads),
        ("anomaly detection", torch.is_anomaly_enabled, torch.set_anomaly_enabled),
        ("cudnn flags", lambda: (cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32),
         lambda v: _set_cudnn(*v)),
        ("cuda matmul TF32", lambda: matmul.allow_tf32,
         lambda v: setattr(matmul, "allow_tf32", v)),
    ]
    if hasattr(torch, "get_default_device"):
        flags.append(("default device", _default_device_getter(), torch.set_default_device))
    return flags


def _default_device_getter():
    """``str(torch.get_default_device())`` read without building a device where none was set:
    the same two places torch looks (a ``DeviceContext`` among the function modes, which
    ``set_default_device`` pushes, and the global device context), read at every call; where
    either holds one, torch's own getter (taken now, before any target) names it."""
    import torch  # worker: torch loads in the zygote, after this
    from torch.overrides import _get_current_function_mode_stack  # worker: as above
    from torch.utils._device import DeviceContext  # worker: as above

    get, space = torch.get_default_device, vars(torch)

    def default_device() -> str:
        for mode in _get_current_function_mode_stack():
            if isinstance(mode, DeviceContext):
                return str(get())
        holder = space.get("_GLOBAL_DEVICE_CONTEXT")
        if getattr(holder, "device_context", None) is not None:
            return str(get())
        return "cpu"

    return default_device


def _set_cudnn(deterministic, benchmark, tf32) -> None:
    import torch  # worker: torch loads in the zygote, after this

    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cudnn.allow_tf32 = tf32


def _more_flags():
    """Flags that change which algorithm or rounding later calls get (matmul reductions, SDPA
    backends, oneDNN, flush-to-zero), the global random generator (reseeded or drawn from) and
    the fast path of ``nn.MultiheadAttention``: ``[(name, get, set)]``, those this torch has."""
    import torch  # worker: torch loads in the zygote, after this

    out = []
    matmul = torch.backends.cuda.matmul
    for attr in ("allow_fp16_reduced_precision_reduction",
                 "allow_bf16_reduced_precision_reduction"):
        if hasattr(matmul, attr):
            out.append((f"cuda matmul {attr}", lambda a=attr: getattr(matmul, a),
                        lambda v, a=attr: setattr(matmul, a, v)))
    cuda = torch.backends.cuda
    for backend in ("flash", "mem_efficient", "math", "cudnn"):
        get, put = getattr(cuda, f"{backend}_sdp_enabled", None), \
            getattr(cuda, f"enable_{backend}_sdp", None)
        if get is not None and put is not None:
            out.append((f"{backend} SDPA backend enabled", get, put))
    for module, attr in ((torch.backends.mkldnn, "enabled"), (torch.backends.cudnn, "enabled"),
                         (getattr(torch.backends, "opt_einsum", None), "enabled")):
        if module is not None and hasattr(module, attr):
            out.append((f"{module.__name__}.{attr}", lambda m=module, a=attr: getattr(m, a),
                        lambda v, m=module, a=attr: setattr(m, a, v)))
    mha = getattr(torch.backends, "mha", None)
    if mha is not None and hasattr(mha, "get_fastpath_enabled"):
        out.append(("nn.MultiheadAttention fast path", mha.get_fastpath_enabled,
                    mha.set_fastpath_enabled))
    out.append(("flush-to-zero of denormals", _flushes_denormals, torch.set_flush_denormal))
    generator = torch.default_generator  # the process's CPU generator, taken before any target
    out.append(("the global random generator's state (reseeded or drawn from)",
                lambda: _RngState(generator.get_state()), lambda v: torch.set_rng_state(v.state)))
    return out


#: A subnormal double: a product with it is zero where denormals are flushed.
_TINY = 1e-310


def _flushes_denormals() -> bool:
    """Whether the floating-point unit flushes denormals (``torch.set_flush_denormal`` sets
    the CPU's flush-to-zero and denormals-are-zero modes, which Python's own float arithmetic
    obeys as torch's does): a Python product, no tensor made at every call."""
    tiny = _TINY  # a name, not a literal: the product is computed here, not folded at compile
    return tiny * 1.0 == 0.0


class _RngState:
    """The CPU generator's state, compared by value: its bytes, taken when it is read (one
    comparison of two byte strings where ``torch.equal`` of the tensors takes several times as
    long)."""

    def __init__(self, state) -> None:
        self.state = state
        self.data = state.numpy().tobytes()

    def __eq__(self, other) -> bool:
        return isinstance(other, _RngState) and self.data == other.data

    def __str__(self) -> str:
        return f"state {hashlib.sha1(self.state.numpy().tobytes()).hexdigest()[:8]}"


def _namespaces():
    """The public namespaces a target could patch for everybody else in the process: the torch
    modules a normalizer or attention kernel is written with, ``torch.Tensor`` and its base,
    and ``builtins``. ``[(label, owner, {name: object})]``, public names (no ``_`` prefix) as
    they are now; names added later are not changes."""

    import torch  # worker: torch loads in the zygote, after this
    import torch.func  # worker: torch loads in the zygote, after this
    import torch.nn.functional  # worker: torch loads in the zygote, after this
    import torch.special  # worker: torch loads in the zygote, after this

    owners = [("torch", torch), ("torch.nn.functional", torch.nn.functional),
              ("torch.linalg", torch.linalg), ("torch.special", torch.special),
              ("torch.autograd", torch.autograd), ("torch.func", torch.func),
              ("torch.fft", torch.fft), ("torch.Tensor", torch.Tensor),
              ("torch.Tensor", torch._C.TensorBase), ("builtins", builtins)]
    out = []
    for label, owner in owners:
        space = vars(owner)
        out.append((label, owner, {k: v for k, v in list(space.items())
                                   if not k.startswith("_")}))
    return out


def _dict_of(owner) -> dict:
    """The dictionary itself behind ``vars(owner)`` (a class's is behind a read-only proxy)."""
    space = vars(owner)
    if type(space) is dict:
        return space
    inner = [d for d in gc.get_referents(space) if type(d) is dict]
    if len(inner) != 1:
        raise TypeError(f"no dictionary behind vars({owner!r})")
    return inner[0]


def _version_reader(dicts: list):
    """A function that returns the version tags of ``dicts`` (CPython's per-dictionary tag of
    PEP 509, given a new value at every change of the dictionary's contents), or ``None`` where
    this Python has no such tag to read. The tag is read from the dictionary object's memory,
    at the offset CPython 3.11–3.13 put it; a test on probe dictionaries (a module's and a
    class's: a rebinding, an addition and a deletion each change the tag, a read does not)
    decides whether it is used at all."""
    if sys.implementation.name != "cpython" or not (3, 11) <= sys.version_info[:2] <= (3, 13):
        return None
    try:
        import ctypes  # optional dependency: ctypes (absent on some builds)

        offset = 2 * ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)

        def cells(spaces):
            return [ctypes.c_uint64.from_address(id(d) + offset) for d in spaces]

        def read(cs):
            return list(map(_VALUE, cs))

        class Probe:
            pass

        module = type(sys)("attnverify_probe")
        module.f = len
        probes = [vars(module), _dict_of(Probe)]
        probe_cells = cells(probes)
        for change in (lambda o: setattr(o, "f", abs), lambda o: setattr(o, "g", abs),
                       lambda o: delattr(o, "g"), lambda o: setattr(o, "f", len)):
            for owner, cell in ((module, probe_cells[0]), (Probe, probe_cells[1])):
                before = cell.value
                getattr(owner, "f", None)
                if cell.value != before:
                    return None
                change(owner)
                if cell.value == before:
                    return None
    except Exception:  # noqa: BLE001 - no tag to read here: every call compares every name
        return None
    watched = cells(dicts)
    keep = list(dicts)  # the cells point into these objects: they stay alive with the reader

    def versions() -> list:
        assert keep
        return read(watched)

    return versions


_VALUE = operator.attrgetter("value")


class StateGuard:
    """Compares the global state after a call with the state before it, and undoes changes.
    The getters and the functions' original objects are taken once, before any target is
    imported.

    The watched functions and namespaces live in a few dictionaries (modules' and classes');
    where their version tags can be read (:func:`_version_reader`), a call that changed none
    of them is not compared name by name: the comparison runs only after a call that changed
    one of those dictionaries, so a change is still found at the call that made it."""

    def __init__(self) -> None:
        self.functions = _watched_functions()
        self.flags = _flags() + _more_flags()
        self.namespaces = _namespaces()
        dicts: dict[int, dict] = {}
        for _label, owner, _name, _found in self.functions:
            for space in getattr(owner, "__mro__", None) or (owner,):
                d = _dict_of(space)
                dicts[id(d)] = d
        for _label, owner, _names in self.namespaces:
            d = _dict_of(owner)
            dicts[id(d)] = d
        self.versions = _version_reader(list(dicts.values()))
        #: Public names of ``torch.Tensor``'s bases: a binding of one in ``torch.Tensor``
        #: itself shadows a method (a patch), where another new name is only an addition.
        import torch  # worker: torch loads in the zygote, after this

        self.shadowable = {name for base in torch.Tensor.__mro__[1:]
                           for name in vars(base) if not name.startswith("_")}
        self._tensor = torch.Tensor
        self._tensor_size = len(vars(torch.Tensor))

    def snapshot(self) -> tuple:
        """The state before a call: ``(version tags or None, flag values)``."""
        return (None if self.versions is None else self.versions()), self._flag_values()

    def _flag_values(self) -> list:
        try:  # every getter, in one pass
            return [get() for _name, get, _set in self.flags]
        except Exception:  # noqa: BLE001 - a getter itself was replaced: read one by one
            pass
        out = []
        for _name, get, _set in self.flags:
            try:
                out.append(get())
            except Exception:  # noqa: BLE001 - a getter itself was replaced
                out.append(_MISSING)
        return out

    def check(self, before: tuple) -> list[str]:
        """What changed since ``before`` (a :meth:`snapshot`; each change undone), as plain
        phrases."""
        tags, before = before
        bound = tags is None or self.versions() != tags  # a watched dictionary was written
        changes = self._functions() if bound else []
        after = self._flag_values()
        for (name, _get, restore), old, new in zip(self.flags, before, after):
            if not _same(new, old):
                changes.append(f"{name} changed from {_shown(old)} to {_shown(new)}")
                try:
                    restore(old)
                except Exception:  # noqa: BLE001
                    changes.append(f"{name} could not be restored")
        if bound:
            for label, owner, original in self.namespaces:
                changes += self._namespace(label, owner, original)
        return changes

    def _functions(self) -> list[str]:
        changes = []
        for label, owner, name, original in self.functions:
            try:
                now = _lookup(owner, name)
            except Exception:  # noqa: BLE001 - the lookup itself was tampered with
                now = _MISSING
            if now is not original:
                changes.append(f"{label} was replaced")
                try:
                    setattr(owner, name, original)
                except Exception:  # noqa: BLE001
                    changes.append(f"{label} could not be restored")
        return changes

    def _namespace(self, label: str, owner, original: dict) -> list[str]:
        changes = []
        space = vars(owner)
        tensor = owner is self._tensor
        if not any(map(operator.is_not, map(space.get, original, itertools.repeat(_MISSING)),
                       original.values())) and (not tensor or len(space) == self._tensor_size):
            return changes  # nothing rebound (a C-level pass; the details only on a change)
        for name, value in list(original.items()):
            now = space.get(name, _MISSING)
            if now is not value and _torch_rebinds(f"{label}.{name}", value, now):
                original[name] = now  # torch's own doing: the new binding is the one to keep
            elif now is not value:
                changes.append(f"{label}.{name} was replaced")
                try:
                    setattr(owner, name, value)
                except Exception:  # noqa: BLE001
                    changes.append(f"{label}.{name} could not be restored")
        if tensor and len(space) != self._tensor_size:
            for name in [n for n in space if n in self.shadowable and n not in original]:
                changes.append(f"{label}.{name} was replaced")
                try:
                    delattr(owner, name)
                except Exception:  # noqa: BLE001
                    changes.append(f"{label}.{name} could not be restored")
        return changes


#: Public names torch rebinds itself: ``torch.Storage`` follows the default dtype
#: (``set_default_dtype``), and importing ``torch._dynamo`` (``torch.compile``, FlexAttention)
#: wraps ``torch.manual_seed``.
_REBOUND_BY_TORCH = frozenset({"torch.Storage", "torch.manual_seed"})


def _torch_rebinds(label: str, old, new) -> bool:
    """Whether ``new`` replacing ``old`` at ``label`` is torch's own doing: a name of
    :data:`_REBOUND_BY_TORCH`, the new object defined in torch, and a wrapper only if it wraps
    the old one."""
    if label not in _REBOUND_BY_TORCH or not str(getattr(new, "__module__", "")).startswith(
            "torch"):
        return False
    if label == "torch.manual_seed":
        inner = new
        for _ in range(8):
            inner = getattr(inner, "__wrapped__", None)
            if inner is old:
                return True
        return False
    return isinstance(new, type)


def _same(new, old) -> bool:
    try:
        return bool(new == old)
    except Exception:  # noqa: BLE001 - a value that cannot be compared has changed
        return False


def _shown(value) -> str:
    return "(unreadable)" if value is _MISSING else _text(value)[:80]


# --------------------------------------------------------------------------------------------
# The server


class Server:
    """Answers the requests of :mod:`attnverify.wire` for one loaded target."""

    def __init__(self) -> None:
        self.guard = StateGuard()
        self.spec = None
        self.kind = ""
        self.reference = None
        self.recent_inputs = _Recent()
        self.recent_outputs = _Returned()
        #: Functions (``target``, ``reference``, …) whose backward is not differentiable: a
        #: Lanczos step's ``J·v`` is made by forward mode there (:meth:`_reverse_product`).
        self.forward_mode_only: set = set()
        self.constants = _Constants()
        #: How the target's Triton kernels run (``runtime``: ``triton``, ``triton_kernels``).
        self.triton: dict[str, str] = {}
        #: Warnings the target's calls raised, each told to the checker once (``warnings`` in
        #: the next answer): new ones of this request, and every one told so far.
        self.warned: list[str] = []
        self.warned_seen: set[str] = set()

    # ---- load ------------------------------------------------------------------------------

    def load(self, message: dict) -> dict:
        kind, target = message.get("kind"), message.get("target")
        params = message.get("params") or {}
        if kind not in ("normalizer", "attention") or not isinstance(target, str) or \
                not isinstance(params, dict):
            raise wire.ProtocolError("a load request without kind, target or params")

        check_not_shadowed()  # a folder named attnverify in place of the package: exit 2
        triton = triton_runtime.prepare()  # before the target's import: it decides jit's kind
        before = set(sys.modules)
        if kind == "normalizer":
            self.spec = load_target(target, params)
        else:
            # worker: brings torch, loaded late
            from attnverify.attention.loader import load_attention

            self.spec = load_attention(target, params)
        self.kind = kind
        self.triton = _triton_record(triton, self.spec, before)
        return self.describe()

    def describe(self) -> dict:
        spec, out = self.spec, {"kind": self.kind}
        for f in dataclasses.fields(spec):
            if f.name in ("fn", "kernel", "reference", "param_checks"):
                continue
            value = getattr(spec, f.name)
            if f.name == "dtypes":
                value = [str(d).removeprefix("torch.") for d in value]
            out[f.name] = wire.plain(value)
        if self.kind == "normalizer":
            kernel = spec.kernel
            out["kernel"] = None if kernel is None else {"formula": _text(kernel.formula)}
            out["reference"] = self._describe_reference()
            out["signature"] = _signature(spec.fn, spec.params)
        else:
            out["reference"] = spec.reference if isinstance(spec.reference, str) else ""
        fused = sys.modules.get("attnverify.normalizers.fused")
        out["runtime"] = {"softmax_kernel": _text(fused.status())} if fused is not None else {}
        out["runtime"].update(self.triton)
        return out

    def _describe_reference(self):
        """How the checker evaluates the target's reference: an attnverify formula or built-in
        (in the checker), or the target's own (here, in the worker)."""
        from attnverify.normalizers import BUILTINS  # worker: brings torch, loaded late
        from attnverify.normalizers.reference import REFERENCES  # worker: as above

        spec = self.spec
        ref = spec.reference
        if ref is None:
            return None if spec.kernel is None else {"kind": "kernel"}
        if isinstance(ref, str) and ref.strip() in BUILTINS:
            return {"kind": "builtin", "name": ref.strip()}
        for name, fn in REFERENCES.items():
            if ref is fn:
                return {"kind": "formula", "name": name}
        for name, builtin in BUILTINS.items():
            if ref is builtin or ref is builtin.fn:
                return {"kind": "builtin", "name": name}
        if isinstance(ref, str):
            resolved = load_target(ref)
        elif isinstance(ref, NormalizerSpec):
            resolved = ref
        elif callable(ref):
            resolved = normalizer_spec(ref, id=getattr(ref, "__name__", "reference"), claims=(),
                                       space="any")
        else:
            raise TypeError(f"reference of {spec.id!r} is a {type(ref).__name__}: expected a "
                            "callable, a NormalizerSpec or a target string")
        self.reference = resolved
        return {"kind": "own", "label": _reference_label(ref), "params": wire.plain(
            dict(resolved.params)), **_signature(resolved.fn, resolved.params)}

    # ---- calls -----------------------------------------------------------------------------

    def function(self, name: str):
        spec = self.spec
        if name == "target":
            return spec
        if name in ("kernel_F", "kernel_dF") and self.kind == "normalizer" and spec.kernel:
            f = spec.kernel.F if name == "kernel_F" else spec.kernel.dF
            return lambda l, t: f(l, t)
        if name == "reference" and self.reference is not None:
            return self.reference
        raise wire.ProtocolError(f"no function {name!r} to call")

    def handle(self, message: dict, tensors: list, sink=None) -> tuple[dict, list]:
        """Answer one request on ``tensors`` (fresh storage): ``(reply, outputs)``; the outputs
        are accepted tensors in the order of ``message["expect"]``. ``sink(i, out)``, where
        given, takes output ``i`` of a request of several calls as soon as its call is done
        (written to its slot), and ``None`` stands for it among the outputs: the worker then
        holds one call's outputs at a time, not every call's."""
        import torch  # worker: torch loads in the zygote, after this

        op = message.get("op")
        fn = self.function(message.get("fn", "target"))
        args, kwargs = _arguments(message, tensors)
        grad_mode = bool(message.get("grad_mode", False))
        self.recent_inputs.append(tensors)
        effects: list[str] = []
        reply: dict = {"ok": True}
        before_mode = torch.is_grad_enabled()
        try:
            if op == "call":
                outputs, reply["requires_grad"] = self._call(fn, args, kwargs, tensors, message,
                                                             grad_mode, effects)
            elif op == "calls":
                outputs = self._calls(fn, tensors, message, effects, sink)
            elif op == "vjps":
                outputs, reply["graph"] = self._vjps(fn, tensors, message, effects, sink)
            elif op == "vjp":
                outputs, reply["differentiable"] = self._vjp(fn, args, kwargs, tensors, message,
                                                             effects)
            elif op == "vjp2":
                outputs = self._vjp2(fn, args, kwargs, tensors, message, effects)
            elif op == "jvp":
                outputs = self._jvp(fn, args, kwargs, tensors, message, effects)
            elif op == "normal":
                outputs = self._normal(fn, args, kwargs, tensors, message, effects)
            else:
                raise wire.ProtocolError(f"unknown request {op!r}")
        except (Raised, Border) as exc:
            exc.side_effects = effects
            raise
        finally:
            torch.set_grad_enabled(before_mode)
        reply["side_effects"] = effects
        if self.warned:
            reply["warnings"], self.warned = self.warned, []
        return reply, outputs

    def _guarded(self, effects: list[str], grad: bool, call):
        import torch  # worker: torch loads in the zygote, after this

        torch.set_grad_enabled(grad)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # the target's warnings are reported, not printed
            before = self.guard.snapshot()
            try:
                return call()
            except BaseException as exc:  # noqa: BLE001 - SystemExit included: the target's
                raise Raised(exc) from exc
            finally:
                effects.extend(self.guard.check(before))
                torch.set_grad_enabled(grad)
                self._warned(caught)

    def _warned(self, caught: list) -> None:
        """Keep each new warning of the target's call (category, message, where), at most
        :data:`MAX_WARNINGS` over the worker's life."""
        for w in caught:
            if len(self.warned_seen) >= MAX_WARNINGS:
                return
            where = f"{os.path.basename(str(w.filename))}:{w.lineno}"
            text = f"{getattr(w.category, '__name__', 'Warning')}: {w.message} ({where})"[:400]
            if text not in self.warned_seen:
                self.warned_seen.add(text)
                self.warned.append(text)

    def _call(self, fn, args, kwargs, tensors, message, grad_mode, effects):
        import torch  # worker: torch loads in the zygote, after this

        wants = [bool(g) for g in message.get("grad", [])]
        if len(wants) != len(tensors):
            wants = [False] * len(tensors)
        for i, need in enumerate(wants):
            if need:
                tensors[i].requires_grad_(True)
        grad = grad_mode and any(wants)
        out = self._guarded(effects, grad, lambda: fn(*args(), **kwargs()))
        accepted = self.accept([out], message, tensors, alias=True)
        requires_grad = bool(grad and isinstance(out, torch.Tensor) and out.requires_grad)
        return accepted, requires_grad

    def _calls(self, fn, tensors, message, effects, sink):
        """Several calls in one request, in order, each on its own inputs (no grad); the
        ``index`` of a call that raises or is refused goes back with the error."""
        import torch  # worker: torch loads in the zygote, after this

        calls, expect = message.get("calls"), message.get("expect")
        if not isinstance(calls, list) or not isinstance(expect, list) or \
                len(calls) != len(expect):
            raise wire.ProtocolError("a calls request without one expectation per call")
        outputs = []
        for i, (sub, want) in enumerate(zip(calls, expect)):
            if not isinstance(sub, dict):
                raise wire.ProtocolError("a call that is not an object")
            reuse = sub.get("reuse")
            if reuse is not None:
                # new values in the storage (the very tensor) an earlier call was given: an
                # answer remembered by address or identity shows itself here
                arg = sub.get("arg", 0)
                given = sub.get("args")
                if type(arg) is not int or not isinstance(given, list) or \
                        not 0 <= arg < len(given) or not isinstance(given[arg], dict):
                    raise wire.ProtocolError("reuse of an argument the call is not given")
                mine = _index(given[arg].get("$tensor"), len(tensors))
                earlier, new = tensors[_index(reuse, len(tensors))], tensors[mine]
                if self.constants.owns(earlier):
                    raise wire.ProtocolError("reuse of a read-only constant")
                if (earlier.shape, earlier.stride(), earlier.storage_offset(), earlier.dtype) \
                        != (new.shape, new.stride(), new.storage_offset(), new.dtype):
                    raise wire.ProtocolError("reuse of a tensor of another layout")
                n = wire.span_elements(new)
                torch.as_strided(earlier, (n,), (1,), 0).copy_(
                    torch.as_strided(new, (n,), (1,), 0))
                tensors[mine] = earlier
            args, kwargs = _arguments(sub, tensors)
            try:
                out = self._guarded(effects, False,
                                    lambda a=args, k=kwargs: fn(*a(), **k()))
                _keep(outputs, self.accept([out], {"expect": [want]}, tensors, alias=True), sink)
            except (Raised, Border) as exc:
                exc.index = i
                raise
            out = None  # not alive while the next call runs (see handle)
        return outputs

    def _vjps(self, fn, tensors, message, effects, sink):
        """Several reverse-mode products in one request, in order, each on its own input: per
        call the forward output (with grad; checked as a call's result, ``alias`` included) and
        the gradient ``Jᵀc`` with respect to its input (``c`` the call's ``cotangent``), in
        that order; ``graph`` per call (whether its output carried a graph: without one the
        gradient is zero). The ``index`` of a call that raises or is refused goes back with
        the error."""
        calls, expect = message.get("calls"), message.get("expect")
        if not isinstance(calls, list) or not isinstance(expect, list) or \
                len(expect) != 2 * len(calls):
            raise wire.ProtocolError("a vjps request without two expectations per call")
        outputs, graph = [], []
        for i, sub in enumerate(calls):
            if not isinstance(sub, dict) or not sub.get("args") or \
                    not isinstance(sub["args"][0], dict):
                raise wire.ProtocolError("a vjps call without a tensor argument")
            x = tensors[_index(sub["args"][0].get("$tensor"), len(tensors))]
            cotangent = tensors[_index(sub.get("cotangent"), len(tensors))]
            if x is cotangent:
                raise wire.ProtocolError("a vjps call whose cotangent is its input")
            args, kwargs = _arguments(sub, tensors)
            try:
                x.requires_grad_(True)
                out = self._guarded(effects, True, lambda a=args, k=kwargs: fn(*a(), **k()))
                _keep(outputs, self.accept([out], {"expect": [expect[2 * i]]}, tensors,
                                           alias=True), sink)
                grads = self._guarded(effects, False,
                                      lambda o=out, w=x, c=cotangent: _grad(o, [w], c, False))
                # a gradient may be the cotangent itself (autograd passes it through)
                _keep(outputs, self.accept(list(grads), {"expect": [expect[2 * i + 1]]},
                                           tensors), sink)
            except (Raised, Border) as exc:
                exc.index = i
                raise
            graph.append(bool(out.requires_grad))
            out = grads = None  # not alive while the next call runs (see handle)
        return outputs, graph

    def _graph(self, fn, args, kwargs, tensors, message, effects, extra=()):
        """The forward pass with the ``wrt`` inputs requiring grad: ``(out, wrt tensors)``."""
        wrt = _indices(message.get("wrt"), len(tensors))
        for i in wrt:
            tensors[i].requires_grad_(True)
        for i in extra:
            tensors[i].requires_grad_(True)
        out = self._guarded(effects, True, lambda: fn(*args(), **kwargs()))
        self.accept([out], {"expect": message["expect_forward"]}, tensors)
        return out, [tensors[i] for i in wrt]

    def _vjp(self, fn, args, kwargs, tensors, message, effects):
        out, wrt = self._graph(fn, args, kwargs, tensors, message, effects)
        cotangent = tensors[_index(message.get("cotangent"), len(tensors))]
        create = bool(message.get("create_graph", False))
        grads = self._guarded(effects, create, lambda: _grad(out, wrt, cotangent, create))
        differentiable = [bool(create and g.requires_grad) for g in grads]
        return self.accept(list(grads), message, tensors), differentiable

    def _vjp2(self, fn, args, kwargs, tensors, message, effects):
        c = _index(message.get("cotangent"), len(tensors))
        out, wrt = self._graph(fn, args, kwargs, tensors, message, effects, extra=(c,))
        cotangent = tensors[c]
        outer = [tensors[i] for i in _indices(message.get("outer"), len(tensors))]
        if len(outer) != len(wrt):
            raise wire.ProtocolError("vjp2 needs one outer cotangent per input")

        def second():
            first = _grad(out, wrt, cotangent, True)
            live = [(g, o) for g, o in zip(first, outer) if g.requires_grad]
            if not live:
                raise RuntimeError("the gradient carries no graph: backward is not "
                                   "differentiable")
            return _grad([g for g, _ in live], [*wrt, cotangent], [o for _, o in live], False)

        return self.accept(list(self._guarded(effects, True, second)), message, tensors)

    def _jvp(self, fn, args, kwargs, tensors, message, effects):
        """``J·v`` by forward mode (``torch.func.jvp``): the target's own forward-mode AD, which
        the ``gradient`` property checks; :meth:`_normal` may take another way."""
        import torch.func  # worker: torch loads in the zygote, after this

        wrt, tangents = self._tangents(tensors, message)

        def forward(*primals):
            full = list(tensors)
            for i, p in zip(wrt, primals):
                full[i] = p
            return fn(*args(full), **kwargs(full))

        def run():
            _, tangent = torch.func.jvp(forward, tuple(tensors[i].detach() for i in wrt),
                                        tuple(tangents))
            return tangent

        return self.accept([self._guarded(effects, False, run)], message, tensors)

    @staticmethod
    def _tangents(tensors, message):
        wrt = _indices(message.get("wrt"), len(tensors))
        tangents = [tensors[i] for i in _indices(message.get("tangents"), len(tensors))]
        if len(tangents) != len(wrt):
            raise wire.ProtocolError("jvp needs one tangent per input")
        return wrt, tangents

    def _reverse_product(self, fn, args, kwargs, tensors, message, effects):
        """``(J·v, out, wrt)`` by reverse over reverse, on one recorded forward pass ``(out,
        wrt)`` (:meth:`_graph`): ``g = Jᵀw`` with a graph, then ``J·v = ∂⟨g, v⟩/∂w`` (``g`` is
        linear in ``w``, so ``w = 0`` serves); ``J·v`` is ``None`` where the backward is not
        differentiable (``once_differentiable``, unrecorded, no path from ``w``) or raises, or
        the output carries no graph; ``out`` is then ``None`` where the backward raised (its
        graph may be spent). A function whose backward was found not differentiable once is
        not tried again (:attr:`forward_mode_only`). In torch 2.13 reverse over reverse is
        faster than forward mode for common code: there the zero tangent of a constant operand
        (``x / T``, ``x − max``) is an ``_efficientzerotensor`` whose kernels run torch's
        Python meta functions at every op."""
        import torch  # worker: torch loads in the zygote, after this

        wrt, tangents = self._tangents(tensors, message)
        if any(tensors[i] is t for i in wrt for t in tangents):
            raise wire.ProtocolError("a jvp whose tangent is its input")
        out, inputs = self._graph(fn, args, kwargs, tensors, message, effects)
        name = message.get("fn", "target")
        if not out.requires_grad or name in self.forward_mode_only:
            return None, out, inputs

        def reverse_over_reverse():
            w = torch.zeros_like(out, requires_grad=True)
            gs = torch.autograd.grad(_paired([out], [w]), inputs, create_graph=True,
                                     allow_unused=True)
            if any(g is None or not g.requires_grad for g in gs):
                return None
            return torch.autograd.grad(_paired(gs, tangents), w, retain_graph=True,
                                       allow_unused=True)[0]

        try:
            jv = self._guarded(effects, True, reverse_over_reverse)
        except Raised:
            self.forward_mode_only.add(name)
            return None, None, None
        if jv is None:
            self.forward_mode_only.add(name)
        return jv, out, inputs

    def _normal(self, fn, args, kwargs, tensors, message, effects):
        """``J·v`` and ``Jᵀu`` in one request, ``u`` the unit direction of ``J·v`` per row (last
        dimension; zero where ``J·v`` is), over the outputs ``keep`` marks (a 0/1 tensor of the
        output's shape: zero elsewhere) where the message names one. ``J·v`` by reverse over
        reverse (:meth:`_reverse_product`; both products then come from the target's backward,
        consistent with each other), else by forward mode (:meth:`_jvp`); then the reverse-mode
        product with ``u`` as the cotangent, on the same recorded forward pass where there is
        one. ``u`` is a unit vector so that ``JᵀJv`` of a tiny Jacobian does not underflow."""
        import torch  # worker: torch loads in the zygote, after this

        expect = message.get("expect")
        if not isinstance(expect, list) or len(expect) != 2:
            raise wire.ProtocolError("a normal request without two expectations")
        jv, out, wrt = self._reverse_product(fn, args, kwargs, tensors, message, effects)
        if jv is None:  # forward mode, as the jvp request
            (jv,) = self._jvp(fn, args, kwargs, tensors, {**message, "expect": expect[:1]},
                              effects)
        else:
            (jv,) = self.accept([jv], {"expect": expect[:1]}, tensors)
        cotangent = jv
        if message.get("keep") is not None:
            keep = tensors[_index(message["keep"], len(tensors))]
            if keep.shape != jv.shape:
                raise wire.ProtocolError("a normal request whose keep is not the output's shape")
            cotangent = jv * keep.to(jv.dtype)
        # the norm scaled by the largest |entry| (attnverify.jacobian.row_norm): no underflow
        top = cotangent.abs().amax(-1, keepdim=True)
        top = torch.where((top > 0) & torch.isfinite(top), top, torch.ones_like(top))
        norm = torch.linalg.vector_norm(cotangent / top, dim=-1, keepdim=True) * top
        live = norm > 0
        u = torch.where(live, cotangent / torch.where(live, norm, torch.ones_like(norm)), 0.0)
        if out is None:
            out, wrt = self._graph(fn, args, kwargs, tensors, message, effects)
        grads = self._guarded(effects, False, lambda: _grad(out, wrt, u, False))
        return [jv, *self.accept(list(grads), {"expect": expect[1:]}, tensors)]

    # ---- the border --------------------------------------------------------------------------

    def accept(self, outputs: list, message: dict, inputs: list, alias: bool = False) -> list:
        """Each output checked against ``message["expect"]`` (shape, dtype or ``None`` for any
        floating dtype, device) and, with ``alias`` (the results of a call, not derivatives, which
        autograd may pass through), against sharing storage with an input or an earlier result;
        :class:`Border` when refused."""
        import torch  # worker: torch loads in the zygote, after this

        expect = message.get("expect")
        if not isinstance(expect, list) or len(expect) != len(outputs):
            raise wire.ProtocolError("a request without one expectation per output")
        for i, (out, want) in enumerate(zip(outputs, expect)):
            what = "the output" if len(outputs) == 1 else f"output {i}"
            _check_plain(out, what)
            _check_expected(out, want, what)
        if not alias:
            return [t.detach() for t in outputs]
        taken = [_storage_range(t) for t in inputs if isinstance(t, torch.Tensor)]
        accepted = []
        for i, out in enumerate(outputs):
            what = "the output" if len(outputs) == 1 else f"output {i}"
            here = _storage_range(out)
            if here is not None and any(_overlap(here, r) for r in taken if r is not None):
                raise Border(f"{what} shares its storage with an input (a result must be in "
                             "storage of its own)")
            if self.recent_outputs.overlaps(here):
                raise Border(f"{what} shares its storage with the output of an earlier call "
                             "(a cached or reused buffer)")
            if here is not None and any(_overlap(here, _storage_range(t)) for t in accepted):
                raise Border(f"{what} shares its storage with another output of this call")
            accepted.append(out)
        self.recent_outputs.append(accepted)
        return [t.detach() for t in accepted]


def _triton_record(mode, spec, before) -> dict[str, str]:
    """The description's ``runtime`` entries of a target whose import brought Triton kernels
    (in a module it imported, or in the module of its function): how they run and their
    names; nothing for a target without one."""
    if mode is None:
        return {}
    modules = [sys.modules[m] for m in set(sys.modules) - before if m in sys.modules]
    fn = getattr(spec, "fn", None)
    for owner in (fn, getattr(fn, "attention", None), getattr(spec, "reference", None)):
        module = inspect.getmodule(owner) if owner is not None else None
        if module is not None:
            modules.append(module)
    kernels = triton_runtime.kernels_in(modules)
    if not kernels:
        return {}
    return {"triton": mode, "triton_kernels": _text(", ".join(kernels))}


class _Constants:
    """The constants the checker names by recipe (:class:`attnverify.wire.Recipe`), built here:
    each identity once, read-only (:func:`attnverify.wire.eye_pages`), and kept for later
    requests while their pages fit :data:`attnverify.wire.KEEP_EYES`; where it cannot be
    protected, a fresh one for every request, so that a target writing into one cannot change
    a later call's."""

    def __init__(self) -> None:
        self.built = wire.Identities(wire.KEEP_EYES)

    def get(self, recipe: wire.Recipe):
        import torch  # worker: torch loads in the zygote, after this

        dtype = wire.torch_dtype(recipe.dtype)
        key = (recipe.n, recipe.dtype)
        base = self.built.get(key)
        if base is None:
            base = wire.eye_pages(recipe.n, dtype, readonly=True)
            if base is not None:
                self.built.put(key, base, wire.eye_resident(recipe.n, base.element_size()))
        if base is None:
            base = torch.eye(recipe.n, dtype=dtype)
        t = torch.as_strided(base, recipe.size, recipe.stride, 0)
        return t if recipe.device == "cpu" else t.to(recipe.device)

    def owns(self, t) -> bool:
        """Whether ``t`` is a view of one of the read-only constants."""
        address = t.untyped_storage().data_ptr()
        return any(b.untyped_storage().data_ptr() == address for b in self.built.values())


def _keep(outputs: list, accepted: list, sink) -> None:
    """The accepted outputs of one call of a request of several: to ``sink`` at once (see
    :meth:`Server.handle`), else kept for the answer."""
    if sink is None:
        outputs += accepted
        return
    for out in accepted:
        sink(len(outputs), out)
        outputs.append(None)


class _Recent:
    """Groups of tensors kept referenced, the oldest dropped beyond :data:`RECENT_BYTES`, with
    the storage ranges they occupy in a sorted index (live storages never overlap, so the range
    that starts last at or before an address is the only one that can hold it)."""

    def __init__(self) -> None:
        self.groups: collections.deque = collections.deque()
        self.bytes = 0
        self.starts: list = []  # sorted (device type, device index, start, end)

    def append(self, group) -> None:
        ranges = [r for r in (_storage_range(t) for t in group) if r is not None]
        size = sum(r[3] - r[2] for r in ranges)
        self.groups.append((group, size, ranges))
        self.bytes += size
        for r in ranges:
            bisect.insort(self.starts, r)
        while self.bytes > RECENT_BYTES and len(self.groups) > 1:
            _, dropped, old = self.groups.popleft()
            self.bytes -= dropped
            for r in old:
                i = bisect.bisect_left(self.starts, r)
                if i < len(self.starts) and self.starts[i] == r:
                    del self.starts[i]

    def overlaps(self, r) -> bool:
        if r is None:
            return False
        i = bisect.bisect_right(self.starts, (r[0], r[1], r[2], float("inf")))
        for j in (i - 1, i):  # the last range starting at or before r, and the next one
            if 0 <= j < len(self.starts) and _overlap(r, self.starts[j]):
                return True
        return False


class _Returned:
    """The storages of the outputs accepted so far, each by its range and a weak reference
    (torch's own, on the storage: ``UntypedStorage._weak_ref``). While one lives (the target
    keeps it: a cache, a buffer it writes into again, a view of its own constant), an output
    sharing its range is refused, however many calls ago it was returned; once its last
    reference is gone its memory is free and may rightly be handed out again, so its range no
    longer counts. Nothing is kept alive for the check, so it costs the worker no memory
    (keeping recent outputs referenced instead held up to :data:`RECENT_BYTES` of them).

    The ranges are kept sorted by start. Live storages never overlap, so scanning leftwards
    from the last range that starts before an output's end stops at the first live range that
    misses it; expired ones met on the way are dropped (their weak references freed), and all
    of them whenever the index has doubled since the last pruning."""

    def __init__(self) -> None:
        import torch  # worker: torch loads in the zygote, after this

        self.entries: list = []  # sorted (device type, device index, start, end, weak ref)
        # taken now: a patch of them by a target is reported and undone (StateGuard) anyway
        self.expired, self.free = torch.UntypedStorage._expired, torch.UntypedStorage._free_weak_ref
        self.pruned_at = 0

    def append(self, group) -> None:
        for t in group:
            r = _storage_range(t)
            if r is not None:
                bisect.insort(self.entries, (*r, t.untyped_storage()._weak_ref()))
        if len(self.entries) > 2 * self.pruned_at + 64:
            self.prune()

    def prune(self) -> None:
        keep = []
        for entry in self.entries:
            if self.expired(entry[4]):
                self.free(entry[4])
            else:
                keep.append(entry)
        self.entries, self.pruned_at = keep, len(keep)

    def overlaps(self, r) -> bool:
        if r is None:
            return False
        j = bisect.bisect_left(self.entries, (r[0], r[1], r[3])) - 1
        while j >= 0 and self.entries[j][:2] == r[:2]:
            entry = self.entries[j]
            if self.expired(entry[4]):  # gone on the way: the allocator reuses freed addresses at
                del self.entries[j]  # once, so the dead pile up just where outputs land
                self.free(entry[4])
            elif _overlap(r, entry[:4]):
                return True
            elif entry[3] <= r[2]:  # live, and wholly left of r: so is every live one before it
                return False
            j -= 1
        return False

    def __del__(self) -> None:
        entries, self.entries = self.entries, []
        for entry in entries:
            try:
                self.free(entry[4])
            except Exception:  # noqa: BLE001 - at interpreter exit torch may be gone already
                return


def _check_plain(out, what: str) -> None:
    import torch  # worker: torch loads in the zygote, after this

    if type(out) is not torch.Tensor:
        kind = type(out)
        if isinstance(out, torch.Tensor):
            raise Border(f"{what} is a {kind.__module__}.{kind.__qualname__}, a subclass of "
                         "torch.Tensor; only a plain torch.Tensor is accepted")
        raise Border(f"{what} is a {kind.__qualname__}, not a torch.Tensor")
    if out.layout is not torch.strided:
        raise Border(f"{what} has layout {out.layout}; a strided (dense) tensor is required")
    if out.is_meta or out.device.type == "meta":
        raise Border(f"{what} is a meta tensor: it holds no values")
    if out.is_nested or out.is_quantized or out.is_complex():
        raise Border(f"{what} is a nested, quantized or complex tensor")
    if out.numel() and out.untyped_storage().data_ptr() == 0:
        raise Border(f"{what} holds no materialised storage")


def _check_expected(out, want: Any, what: str) -> None:
    if not isinstance(want, dict):
        raise wire.ProtocolError("an expectation that is not an object")
    size, dtype, device = want.get("size"), want.get("dtype"), want.get("device")
    got = str(out.dtype).removeprefix("torch.")
    if list(out.shape) != list(size or []):
        raise Border(f"{what} has shape {tuple(out.shape)} {got}, but should be "
                     f"{tuple(size or [])} {dtype or ''}".rstrip())
    if dtype is not None and got != dtype:
        raise Border(f"{what} has dtype {got}, but should be {dtype} (the input's)")
    if dtype is None and not out.is_floating_point():
        raise Border(f"{what} has dtype {got}, not a floating dtype")
    if device is not None and str(out.device) != device:
        raise Border(f"{what} is on {out.device}, but should be on {device} (the input's)")


def _storage_range(t):
    if t is None or t.numel() == 0:
        return None
    try:
        storage = t.untyped_storage()
        start = storage.data_ptr()
        return (t.device.type, t.device.index, start, start + storage.nbytes())
    except Exception:  # noqa: BLE001 - no storage to compare
        return None


def _overlap(a, b) -> bool:
    return a is not None and b is not None and a[:2] == b[:2] and a[2] < b[3] and b[2] < a[3]


def _grad(out, wrt, cotangent, create: bool):
    import torch  # worker: torch loads in the zygote, after this

    outs = out if isinstance(out, (list, tuple)) else [out]
    cots = cotangent if isinstance(cotangent, (list, tuple)) else [cotangent]
    if not any(o.requires_grad for o in outs):
        return [torch.zeros_like(w) for w in wrt]
    return torch.autograd.grad(_paired(outs, cots), wrt, allow_unused=True,
                               materialize_grads=True, create_graph=create)


def _paired(outs, cots):
    """``Σ ⟨out, cotangent⟩``, one scalar whose gradient is the vector-Jacobian products
    ``torch.autograd.grad(outs, …, cots)`` gives: the same values (the backward of the sum is
    ones, that of each product ``1·cotangent``, exact in every dtype), without that call's check
    of a tensor cotangent, which imports ``torch.fx.experimental.symbolic_shapes`` and sympy
    (about half a second, and 34 MiB, in every zygote whose workers need none of it). The
    shapes are compared here instead (a cotangent is never broadcast), and, as there, every
    output must be part of the graph. Recorded whatever the grad mode (a first-order product
    runs with it off, as ``torch.autograd.grad`` does its backward then). The checker's
    :func:`attnverify.jacobian.vjp` does the same; the worker imports no module of the
    checks."""
    import torch  # worker: torch loads in the zygote, after this

    total = None
    with torch.enable_grad():
        for i, (o, c) in enumerate(zip(outs, cots, strict=True)):
            if c.shape != o.shape:
                raise RuntimeError(f"Mismatch in shape: grad_output[{i}] has a shape of "
                                   f"{tuple(c.shape)} and output[{i}] has a shape of "
                                   f"{tuple(o.shape)}")
            if not o.requires_grad:
                raise RuntimeError(f"element {i} of tensors does not require grad and does "
                                   "not have a grad_fn")
            term = (o * c).sum()
            total = term if total is None else total + term
    return total


def _index(value, n: int) -> int:
    if type(value) is not int or not 0 <= value < n:
        raise wire.ProtocolError(f"a tensor index {value!r} out of range")
    return value


def _indices(value, n: int) -> list[int]:
    if not isinstance(value, list):
        raise wire.ProtocolError("a list of tensor indices expected")
    return [_index(v, n) for v in value]


def _arguments(message: dict, tensors: list):
    """``(args(ts), kwargs(ts))``: the call's arguments with ``{"$tensor": i}`` replaced by
    ``ts[i]`` (``ts`` defaults to ``tensors``)."""
    raw_args, raw_kwargs = message.get("args", []), message.get("kwargs", {})
    if not isinstance(raw_args, list) or not isinstance(raw_kwargs, dict):
        raise wire.ProtocolError("a call whose arguments are not a list and an object")

    def resolve(value, ts):
        if isinstance(value, dict) and set(value) == {"$tensor"}:
            return ts[_index(value["$tensor"], len(ts))]
        if isinstance(value, str) and value in ("inf", "-inf", "nan"):
            return float(value)
        return value

    def args(ts=None):
        return [resolve(v, tensors if ts is None else ts) for v in raw_args]

    def kwargs(ts=None):
        return {str(k): resolve(v, tensors if ts is None else ts) for k, v in raw_kwargs.items()}

    return args, kwargs


def _reference_label(ref) -> str:
    if isinstance(ref, str):
        return ref
    target = getattr(ref, "target", "") or getattr(ref, "id", "")
    if target:
        return str(target)
    module = getattr(ref, "__module__", "") or ""
    name = getattr(ref, "__qualname__", getattr(ref, "__name__", type(ref).__name__))
    return f"{module}:{name}" if module else str(name)


#: The call every normalizer (and reference) is made with (docs/INTERFACES.md).
CONTRACT = "fn(scores, dim=-1, **params)"


def _signature(fn, params: dict | None = None) -> dict:
    """What ``fn`` takes by keyword beside ``scores`` and ``dim`` (``accepts``, ``var_keywords``)
    and, in ``contract``, why the call :data:`CONTRACT` with ``params`` cannot bind to it (``""``:
    it can, or ``fn`` has no signature to read, as functions written in C: not judged here)."""

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return {"accepts": [], "var_keywords": True, "contract": ""}
    keywords = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    values = sig.parameters.values()
    contract = ""
    try:
        sig.bind(None, dim=-1, **dict(params or {}))
    except TypeError as exc:
        name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or \
            type(fn).__name__
        contract = _text(f"{name}{sig} cannot be called as {CONTRACT}: {exc}")
    return {"accepts": [p.name for p in values if p.kind in keywords
                        and p.name not in ("scores", "dim")],
            "var_keywords": any(p.kind is p.VAR_KEYWORD for p in values),
            "contract": contract}


# --------------------------------------------------------------------------------------------
# The worker process


def serve(sock: socket.socket) -> None:
    """The worker's loop: one answer per request, until the channel closes."""
    server, arena, retired = Server(), None, []
    while True:
        try:
            message, fds = wire.receive(sock, with_fds=True)
        except (EOFError, OSError, wire.ProtocolError):
            os._exit(0)
        ident = message.get("id")
        try:
            if message.get("op") == "map":
                if len(fds) != 1 or type(message.get("size")) is not int:
                    raise wire.ProtocolError("a map request without one descriptor and a size")
                if arena is not None:  # not unmapped: the target may still hold views of it
                    retired.append(arena)
                arena = wire.Arena.attach(fds[0], message["size"])
                reply = {"ok": True}
            elif message.get("op") == "bye":
                wire.send(sock, {"id": ident, "ok": True})
                os._exit(0)
            elif message.get("op") == "load":
                reply = {"ok": True, "describe": server.load(message)}
            else:
                for fd in fds:
                    os.close(fd)
                reply = _answer(server, arena, message)
        except Raised as exc:
            name, text = describe_exception(exc.cause)
            reply = {"ok": False, "kind": "raised", "type": name, "message": text,
                     "side_effects": getattr(exc, "side_effects", []),
                     "traceback": user_traceback(exc.cause)}
            if hasattr(exc, "index"):
                reply["index"] = exc.index
        except Border as exc:
            reply = {"ok": False, "kind": "border", "type": "", "message": _text(exc),
                     "side_effects": getattr(exc, "side_effects", [])}
            if hasattr(exc, "index"):
                reply["index"] = exc.index
        except Exception as exc:  # noqa: BLE001 - a usage error at load, a protocol fault, …
            name, text = describe_exception(exc)
            kind = "usage" if _is_usage(exc) else "raised"
            reply = {"ok": False, "kind": kind, "type": name, "message": text}
            if kind == "raised":  # the target's import raised: where, in its own code
                reply["traceback"] = user_traceback(exc.__cause__ or exc.__context__ or exc)
        except BaseException as exc:  # noqa: BLE001 - SystemExit from an import, say
            name, text = describe_exception(exc)
            reply = {"ok": False, "kind": "raised", "type": name, "message": text}
        reply["id"] = ident
        try:
            wire.send(sock, reply)
        except Exception:  # noqa: BLE001 - the checker is gone, or the answer cannot be sent
            os._exit(0)
        heap.trim_due()


def _is_usage(exc: BaseException) -> bool:
    """Bad input (a target that cannot be found, a bad parameter), not the target's own code
    raising at import (:class:`~attnverify.errors.TargetImportFailed`: a failure of that target)."""

    return isinstance(exc, UsageError) and not isinstance(exc, TargetImportFailed)


def _answer(server: Server, arena, message: dict) -> dict:
    if arena is None:
        raise wire.ProtocolError("a request before the arena was mapped")
    slots = message.get("tensors", [])
    outs = message.get("out", [])
    if not isinstance(slots, list) or not isinstance(outs, list):
        raise wire.ProtocolError("tensors and outputs must be lists")
    in_slots = [wire.slot_from_json(s, arena.size) for s in slots]
    # CPU inputs are views of the arena itself: what the target writes into its arguments is
    # what the checker reads back after the answer (no_mutation is judged there, not here);
    # a constant with a recipe is this process's own read-only one
    tensors = [server.constants.get(slot) if isinstance(slot, wire.Recipe)
               else wire.read_tensor(arena, slot, fresh=False) for slot in in_slots]
    given = list(tensors)
    out_slots = [wire.Slot.from_json(s, arena.size) for s in outs]

    def write(i: int, out) -> None:
        if i >= len(out_slots):
            raise wire.ProtocolError("one output slot per output expected")
        if out_slots[i].elements:
            wire.view_of(arena, out_slots[i]).view(out_slots[i].size).copy_(out)

    try:
        reply, outputs = server.handle(message, tensors, sink=write)
    finally:
        _return_inputs(arena, in_slots, given)
    if len(outputs) != len(out_slots):
        raise wire.ProtocolError("one output slot per output expected")
    for i, out in enumerate(outputs):
        if out is not None:
            write(i, out)
    return reply


def _return_inputs(arena, slots, tensors) -> None:
    """Inputs that were copied to another device written back to their slots, so the checker
    sees what the call left in them (CPU inputs are the arena's bytes already)."""
    import torch  # worker: torch loads in the zygote, after this

    for slot, t in zip(slots, tensors):
        if slot.device != "cpu" and slot.elements:
            with torch.no_grad():
                flat = torch.as_strided(t.detach(), (slot.elements,), (1,), 0)
                wire.view_of(arena, slot).copy_(flat.cpu())


# --------------------------------------------------------------------------------------------
# The zygote: imports torch once, forks a worker per target


PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
#: Imported by the zygote before it answers its checker, so that every worker starts with them
#: loaded (the forward-mode decompositions too: the first ``jvp`` of every target imports them).
PRELOAD = ("torch", "torch.func", "attnverify.registry", "attnverify.normalizers",
           "attnverify.attention.loader", "torch._decomp.decompositions_for_jvp")
#: Imported by the zygote with :data:`PRELOAD`, or, where its hello defers them
#: (:func:`attnverify.prestart.spawn`: ``falsify``, one worker a search; ``certify`` of one
#: normalizer, one worker a process), before it forks its second worker (so that it and any
#: later one start with them loaded); a clone forked before then defers them the same way:
#: ``torch._dynamo``, about as long to import as torch, which forward mode through
#: some of torch's decompositions imports (``torch._compile``'s disable wrapper: ``ssmax``'s
#: ``jvp``, say), ``torch.compile`` and FlexAttention too. A deferred first worker starts as soon
#: as the checker asks, and imports it itself only where its target's code needs it. Never
#: imported in the background: on two cores that import slows the checker and the worker, which
#: take turns on them, more than it saves.
DEFERRED = ("torch._dynamo",)


def _prctl(option: int, value: int) -> None:
    try:
        import ctypes  # optional dependency: ctypes (absent on some builds)

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, value, 0, 0, 0)
    except Exception:  # noqa: BLE001 - not Linux: no subreaper, no death signal
        pass


def zygote_main(ctrl_fd: int) -> None:
    """``python -m attnverify.worker zygote FD``: serve fork requests on the socket ``FD``."""
    ctrl = socket.socket(fileno=ctrl_fd)
    hello = wire.receive(ctrl)
    sys.path[:] = [str(p) for p in hello.get("path", sys.path)]
    serve_zygote(ctrl, hello)


def serve_zygote(ctrl: socket.socket, hello: dict) -> None:
    """The zygote's work once it has its ``hello`` (what to import first, what to defer): the
    imports, then the requests of the checker at the other end of ``ctrl``."""
    for name in hello.get("preload", PRELOAD + DEFERRED):
        _preload(name)
    _serve_forks(ctrl, [str(name) for name in hello.get("deferred", ())], owns_run=True)


def _preload(name: str) -> None:
    try:
        __import__(name)
    except Exception:  # noqa: BLE001 - a missing optional module: the worker imports later
        pass


def _serve_forks(ctrl: socket.socket, deferred: list[str] | None = None,
                 owns_run: bool = False) -> None:
    """The zygote's loop: answer the requests of the checker at the other end of ``ctrl`` (its
    hello's answer first) until it closes or asks the zygote to exit; the ``deferred`` modules
    (:data:`DEFERRED`) imported before any fork of a worker but the first (a clone inherits
    those still pending). ``owns_run`` (the zygote its
    checker started, not a clone): when it ends, every worker and clone killed, it removes the
    run's directory its fork requests name too (:func:`_drop_run_dir`), so that nothing is
    left in the temporary directory when the checker ended without removing it (killed, or a
    process that exits without its exit handlers)."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)  # not inherited: a clone (``clone``) sets it again
    workers: dict[int, int | None] = {}
    scratches.clear()  # a clone's: its parent's directories stay its parent's
    pending = list(deferred or ())
    forked = 0  # workers forked (a clone is not one)
    run_dir = ""
    wire.send(ctrl, {"ok": True, "pid": os.getpid()})

    while True:
        _reap(workers)
        ready, _, _ = select.select([ctrl], [], [], 0.25)
        if not ready:
            continue
        try:
            message, fds = wire.receive(ctrl, with_fds=True)
        except (EOFError, OSError, wire.ProtocolError):
            _shutdown(workers)
            _drop_run_dir(run_dir)
            os._exit(0)
        op = message.get("op")
        if pending and op == "fork" and forked:
            for name in pending:  # a second worker: all loaded (a clone takes them pending)
                _preload(name)
            pending = []
        if op == "fork" and len(fds) == 1:
            if owns_run and not run_dir and isinstance(message.get("scratch"), str):
                run_dir = message["scratch"]
            scratch = _scratch_dir(message.get("scratch"))
            status_r, status_w = os.pipe()
            gc.freeze()  # the zygote's objects stay shared with the worker (see _forked_jobs)
            pid = os.fork()
            if pid == 0:
                os.close(status_r)
                _become_worker(fds[0], message, ctrl.fileno(), scratch, status_w)
            os.close(status_w)
            os.close(fds[0])
            workers[pid] = None
            forked += 1
            scratches[pid] = scratch
            sandbox = _read_status(status_r)
            wire.send(ctrl, {"ok": True, "pid": pid, "sandbox": sandbox})
        elif op == "clone" and len(fds) == 1:
            # a zygote for another checker (``certify --jobs``): this process forked, torch
            # already imported, serving the socket sent; a live child here like a worker
            gc.freeze()
            pid = os.fork()
            if pid == 0:
                _become_clone(ctrl, fds[0], pending)
            os.close(fds[0])
            workers[pid] = None
            wire.send(ctrl, {"ok": True, "pid": pid})
        elif op == "status":
            pid = message.get("pid")
            deadline = time.monotonic() + min(float(message.get("wait", 0)), 30.0)
            while workers.get(pid, 0) is None and time.monotonic() < deadline:
                _reap(workers)
                time.sleep(0.01)
            wire.send(ctrl, {"ok": True, "status": workers.get(pid)})
        elif op == "kill":
            pid = message.get("pid")
            if pid in workers:
                _kill(pid)
                deadline = time.monotonic() + 5
                while workers.get(pid) is None and time.monotonic() < deadline:
                    _reap(workers)
                    time.sleep(0.005)
            wire.send(ctrl, {"ok": True})
        elif op == "sweep":  # whatever is not a live worker killed and reaped, synchronously
            wire.send(ctrl, {"ok": True, "left": _sweep(workers)})
        elif op == "exit":
            _shutdown(workers)
            _drop_run_dir(run_dir)
            wire.send(ctrl, {"ok": True})
            os._exit(0)
        else:
            for fd in fds:
                os.close(fd)
            wire.send(ctrl, {"ok": False})


def _become_clone(ctrl: socket.socket, fd: int, deferred: list[str]) -> None:
    """In the forked child of ``clone``: a zygote of its own on ``fd``, no worker of its
    parent's (the parent's channel closed, its workers left to it); it exits, like its
    parent, when its checker's end closes or asks it to."""
    try:
        ctrl.close()
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the parent zygote gone: so is this one
        _serve_forks(socket.socket(fileno=fd), deferred)
    finally:
        os._exit(0)


def _kill(pid) -> None:
    if type(pid) is not int or pid <= 1:
        return
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _status(code: int) -> int:
    return -os.WTERMSIG(code) if os.WIFSIGNALED(code) else os.WEXITSTATUS(code)


def _reap(workers: dict) -> None:
    """Collect every exited child; kill any live process reparented to the zygote that is not
    one of its workers (something a worker left behind)."""
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        if pid in workers:
            workers[pid] = _status(code)
            _drop_scratch(pid)
    for pid in _children():
        if pid not in workers:
            _kill(pid)


def _children() -> list[int]:
    me, out = os.getpid(), []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[-1].split()
        if len(fields) > 1 and int(fields[1]) == me:
            out.append(int(name))
    return out


def _sweep(workers: dict) -> int:
    """Kill every child that is not a live worker (a killed worker, whatever a worker left
    behind) until none is left or 10 s pass; the number still left."""
    deadline = time.monotonic() + 10
    while True:
        _reap(workers)
        strays = [pid for pid in _children() if workers.get(pid, 0) is not None]
        if not strays or time.monotonic() > deadline:
            return len(strays)
        for pid in strays:
            _kill(pid)
        time.sleep(0.005)


def _shutdown(workers: dict) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        live = [pid for pid, status in workers.items() if status is None] + _children()
        if not live:
            break
        for pid in live:
            _kill(pid)
        time.sleep(0.02)
        _reap(workers)
    for pid in list(scratches):
        _drop_scratch(pid)


#: Each live worker's private temporary directory (its ``TMPDIR``), removed when it is reaped.
scratches: dict[int, str] = {}


def _scratch_dir(root=None) -> str:
    """A new private temporary directory for the next worker, beneath ``root`` (the checker's
    :attr:`attnverify.remote.Zygote.root`) where that is a directory, else in the temporary
    directory (``""`` where none can be made)."""

    base = root if isinstance(root, str) and root and os.path.isdir(root) else None
    try:
        return tempfile.mkdtemp(prefix="attnverify-worker-", dir=base)
    except OSError:
        return ""


def _drop_run_dir(path: str) -> None:
    """Remove the run's directory (:attr:`attnverify.remote.Zygote.root`), which only ever
    holds workers' directories: only a directory named as the checker names it."""
    if path and os.path.basename(path.rstrip("/")).startswith("attnverify-run-") and \
            os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)


def _drop_scratch(pid: int) -> None:
    path = scratches.pop(pid, "")
    if path:
        shutil.rmtree(path, ignore_errors=True)


def _read_status(fd: int, wait: float = 30.0) -> str:
    """What the new worker wrote of its sandbox before it loaded anything (a short phrase), read
    to the end of the pipe; the zygote passes it on with the fork's answer."""

    data, deadline = b"", time.monotonic() + wait
    try:
        while len(data) < 4096:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    return _text(data.decode("utf-8", "replace")) or "none: the worker did not report its sandbox"


def _become_worker(chan_fd: int, message: dict, ctrl_fd: int, scratch: str = "",
                   status_fd: int = -1) -> None:
    """In the forked child: a session of its own, the checker's working directory, environment
    and import path, the sandbox (:mod:`attnverify.sandbox`, its outcome written to
    ``status_fd`` for the zygote), nothing open but the channel; then serve until the channel
    closes. All of it before the target is loaded: the target's code runs only under it."""
    try:
        os.setsid()
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.chdir(message.get("cwd") or "/")
        env = message.get("env")
        if isinstance(env, dict):
            os.environ.clear()
            os.environ.update({str(k): str(v) for k, v in env.items()})
        path = message.get("path")
        if isinstance(path, list):
            sys.path[:] = [str(p) for p in path]
        status = _sandbox(bool(message.get("sandbox")), scratch)
        if status_fd >= 0:
            try:
                os.write(status_fd, status.encode("utf-8")[:4096])
            except OSError:
                pass
        top = max(chan_fd, ctrl_fd, devnull, status_fd) + 1
        try:
            top = max(top, os.sysconf("SC_OPEN_MAX"))
        except (OSError, ValueError):
            top = max(top, 4096)
        os.closerange(3, chan_fd)
        os.closerange(chan_fd + 1, top)
        if message.get("memory_limit"):
            _limit_memory()

        settings.reload()
        serve(socket.socket(fileno=chan_fd))
    finally:
        os._exit(0)


def _sandbox(wanted: bool, scratch: str) -> str:
    """The worker's sandbox (:func:`attnverify.sandbox.restrict`) with ``scratch`` as its
    ``TMPDIR``; what was applied, as a phrase."""
    if not wanted:
        return "off: ATTNVERIFY_SANDBOX=0"
    if not scratch:
        return "none: no private temporary directory could be made"

    sandbox.private_caches(os.environ, scratch)
    allowed = sandbox.user_writable(os.environ)
    os.environ["TMPDIR"] = scratch
    tempfile.tempdir = scratch
    sys.dont_write_bytecode = True  # imports of the target write no bytecode (denied anyway)
    return sandbox.restrict(scratch, allowed)


def _limit_memory() -> None:
    """``RLIMIT_AS`` at the worker's size now plus half the physical memory: a runaway
    allocation is an error answer (or a killed worker), not the machine's out-of-memory killer."""
    try:
        import resource  # optional dependency: resource (Unix only)

        with open("/proc/self/statm") as fh:
            size = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, ImportError):
        return
    limit = size + physical // 2
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft == resource.RLIM_INFINITY or soft > limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "zygote" and argv[1].isdigit():
        zygote_main(int(argv[1]))
    raise SystemExit("usage: python -m attnverify.worker zygote FD (started by attnverify)")


if __name__ == "__main__":
    main(sys.argv[1:])
