"""The worker's sandbox: what the code under test can reach besides its channel (Linux Landlock).

The process boundary (:mod:`attnverify.worker`) keeps the target away from the checker's
interpreter; this module keeps it away from the rest of the machine the verdict depends on. A
worker applies it to itself after the fork and before it loads the target
(:func:`restrict`), with the kernel's Landlock LSM, which needs no privilege, cannot be undone
by the process it restricts, and is inherited by every process it starts:

- **files**: read and execute anywhere; create, write, truncate, rename or delete only beneath
  the worker's private temporary directory (``TMPDIR``, which also holds its compile caches:
  :func:`private_caches`), ``/dev/shm`` and the null, zero and random devices; GPU device nodes
  (``/dev/nvidia*``, ``/dev/dri``, ``/dev/kfd``) stay usable. So the target cannot rewrite
  attnverify's sources (the checker imports some modules late), a compile cache the checker
  reads, a certificate, a ``falsify --workers`` result, an example database on disk or anything
  a later run reads;
- **processes** (Landlock ABI ≥ 6): no signal to a process outside the worker's own domain (the
  checker, the zygote, a ``falsify`` worker), no abstract Unix socket outside it; Landlock always
  forbids ``ptrace`` and ``/proc/PID/mem`` of a process outside the domain;
- **network** (ABI ≥ 4): no TCP connect or bind (a Redis example database is out of reach);
- **capabilities**: a worker started as root gives up every capability
  (:func:`drop_all_capabilities`), so BPF, perf events and raw devices cannot reach around
  Landlock.

Where the kernel has no Landlock (not Linux, or an older or configured-out kernel) the worker
runs without it and the certificate says so (``sandbox``); ``ATTNVERIFY_SANDBOX=0`` turns it
off, and ``ATTNVERIFY_SANDBOX_WRITABLE=DIR[:DIR…]`` lets targets write beneath the directories
it names (a target that keeps a log, say); both are recorded. This module imports nothing of
attnverify and nothing but the standard library: it runs in the worker before the target.
"""

from __future__ import annotations

import ctypes
import glob
import os
import platform
import struct

#: Landlock's system calls (the same numbers on every architecture: they postdate the split).
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

# filesystem rights, by the ABI that introduced them
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
#: Rights that make sense on a file (not a directory) in a path-beneath rule.
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
READ_RIGHTS = EXECUTE | READ_FILE | READ_DIR
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

#: Device nodes a target may open for writing (besides GPU nodes).
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
GPU_NODES = ("/dev/nvidia*", "/dev/dri", "/dev/kfd")

ENV = "ATTNVERIFY_SANDBOX"
#: Directories (``os.pathsep``-separated) the person running the check lets targets write.
WRITABLE_ENV = "ATTNVERIFY_SANDBOX_WRITABLE"
_ON = ("", "1", "on", "auto", "true", "yes")
_OFF = ("0", "off", "false", "no")


def wanted(environ=None) -> bool:
    """Whether ``ATTNVERIFY_SANDBOX`` asks for the sandbox (default yes); ``ValueError`` on a
    value that is neither on nor off."""
    value = (environ if environ is not None else os.environ).get(ENV, "").strip().lower()
    if value not in _ON + _OFF:
        raise ValueError(f"{ENV}={value!r}: use 1 or 0 (on or off)")
    return value in _ON


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 where there is none."""
    if platform.system() != "Linux":
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        version = libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0),
                               ctypes.c_uint32(CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(int(version), 0)


#: The compile caches a kernel fills, by the variable that places each: ``torch.compile``'s,
#: Triton's and ``torch.utils.cpp_extension``'s.
CACHE_VARIABLES = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton",
                   "TORCH_EXTENSIONS_DIR": "torch_extensions"}


def private_caches(environ, private_tmp: str) -> None:
    """Point the compile caches into ``private_tmp`` (``environ`` updated): never the shared
    ones (``/tmp/torchinductor_$USER``, ``~/.triton``, ``~/.cache/torch_extensions``), which the
    checker and every later process read. A compiled file a target leaves there could run in
    the checker (a built-in reference compiled with ``torch.compile``) or in a later run; so a
    worker compiles afresh, at the price of the shared cache's speed."""
    for name, sub in CACHE_VARIABLES.items():
        environ[name] = os.path.join(private_tmp, sub)


def user_writable(environ) -> list[str]:
    """The directories ``ATTNVERIFY_SANDBOX_WRITABLE`` names (absolute; missing ones left out):
    a target that must write somewhere (a log, a build directory) is given that place by the
    person who runs the check, and the certificate says how many such places there were."""
    out = []
    for part in (environ.get(WRITABLE_ENV) or "").split(os.pathsep):
        path = os.path.abspath(part.strip()) if part.strip() else ""
        if path and os.path.isdir(path) and path not in out:
            out.append(path)
    return out


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


def restrict(private_tmp: str, writable=(), *, drop_capabilities: bool = True) -> str:
    """Restrict this process (and every process it starts) as the module docstring says, with
    ``private_tmp`` and ``writable`` the directories it may write beneath. Returns what was
    applied, as a phrase for the certificate (``"landlock ABI N: …"``), or why nothing was
    (``"none: …"``). Never raises: a sandbox that cannot be applied is reported, not fatal."""
    abi = abi_version()
    if abi < 1:
        status = "none: this kernel has no Landlock (Linux 5.13+ with CONFIG_SECURITY_LANDLOCK)"
    else:
        try:
            status = _restrict(abi, private_tmp, writable)
        except OSError as exc:
            status = f"none: Landlock refused the rules ({exc.strerror or exc})"
    if drop_capabilities and _capabilities():
        status += ("; no capabilities" if drop_all_capabilities() else
                   "; capabilities could not be dropped")
    return status


def _capabilities() -> int:
    """This process's effective capability set (0 where unknown)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
CAPABILITY_VERSION_3 = 0x20080522


def drop_all_capabilities() -> bool:
    """Give up every capability, for good (the bounding, ambient, inheritable, permitted and
    effective sets): a worker started as root keeps uid 0 (it reads what it could read) but
    loses what reaches past Landlock — BPF, system-wide perf events, raw I/O, kernel modules,
    other users' files. True when the effective set is empty afterwards."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in range(64):
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last one: ignored
        libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        header = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)
        data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable}, all zero
        libc.capset(header, data)
    except (OSError, AttributeError):
        return False
    return _capabilities() == 0


def _restrict(abi: int, private_tmp: str, writable) -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    fs = FS_BY_ABI[max(k for k in FS_BY_ABI if k <= abi)]
    net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    attr = _RulesetAttr(fs, net, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        _raise(libc)
    try:
        _allow(libc, ruleset, "/", READ_RIGHTS & fs)
        for path in (private_tmp, *writable, "/dev/shm"):
            _allow(libc, ruleset, path, fs)
        for pattern in (*DEVICES, *GPU_NODES):
            for path in glob.glob(pattern):
                _allow(libc, ruleset, path, fs)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            _raise(libc)
        if libc.syscall(SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
            _raise(libc)
    finally:
        os.close(ruleset)
    extra = [p for p in writable if p != private_tmp]
    parts = ["writes only beneath its own temporary directory" + (
        f" and {len(extra)} more ({WRITABLE_ENV})" if extra else "")]
    parts.append("no signal, ptrace or abstract socket outside the worker" if scoped else
                 "no ptrace outside the worker (signals not scoped before ABI 6)")
    parts.append("no TCP" if net else "TCP not restricted before ABI 4")
    return f"landlock ABI {abi}: " + "; ".join(parts)


def _allow(libc, ruleset: int, path: str, rights: int) -> None:
    """A path-beneath rule: ``rights`` (those that apply to a file, when ``path`` is one) on
    ``path`` and everything below it. A path that does not exist is skipped."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if not os.path.isdir(path):
            rights &= FILE_RIGHTS
        if not rights:
            return
        # struct landlock_path_beneath_attr { __u64 allowed_access; __s32 parent_fd; } packed
        attr = ctypes.create_string_buffer(struct.pack("=Qi", rights, fd), 12)
        if libc.syscall(SYS_ADD_RULE, ruleset, RULE_PATH_BENEATH, attr, ctypes.c_uint32(0)) != 0:
            _raise(libc)
    finally:
        os.close(fd)


def _raise(libc) -> None:
    errno = ctypes.get_errno()
    raise OSError(errno, os.strerror(errno))
