"""The worker protocol: what crosses between the checker and the worker that runs the target.

This is the bottom layer of the isolation (docs/ARCHITECTURE.md, "Two processes"). It imports
nothing of attnverify, so the worker (:mod:`attnverify.worker`) can use it without reaching any
module of the checker, and the checker (:mod:`attnverify.remote`) uses the same definitions.

- **Frames.** Every message is one frame on a Unix stream socket: a 4-byte big-endian length,
  then that many bytes of UTF-8 JSON holding one object. Nothing is pickled in either direction;
  a frame longer than :data:`MAX_FRAME` or that is not a JSON object is a protocol error.
  :func:`parse` rejects ``NaN``, ``Infinity`` and duplicate keys, so a value the parser accepts
  has one meaning.
- **Tensors** travel through a shared-memory *arena* (an anonymous ``memfd`` mapped by both
  sides; its descriptor crosses once, with ``SCM_RIGHTS``, and is closed after mapping). A tensor
  is described by :class:`Slot`: where its bytes lie in the arena, its dtype, and its layout
  (sizes, strides, storage offset). The bytes are the storage span the view reaches, from
  element 0 of its storage, so the receiver rebuilds the *same* view (``as_strided`` on fresh
  storage), not a contiguous copy.
- **Answers** carry flags and messages only; output tensors are written by the worker into slots
  the checker allocated with the shape and dtype it expects, and the checker reads them once,
  into storage of its own.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import math
import mmap
import os
import select
import socket
import struct
import sys
import tempfile
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

#: Largest frame accepted (bytes). Tensors never travel in frames.
MAX_FRAME = 1 << 24
#: Largest answer the checker accepts from a worker (bytes): an answer holds flags, a message's
#: first line and at most a target's description, never tensors; a frame announcing more is a
#: protocol error at once, not a wait for bytes no sane worker sends.
MAX_ANSWER = 1 << 20
#: The bytes a frame's JSON may hold: :func:`dump` escapes everything else (``ensure_ascii``,
#: control characters inside strings), so any other byte ends the frame as a protocol error as
#: soon as it arrives (the zero bytes of a frame header read as a body, say).
_JSON_BYTES = bytes(range(0x20, 0x7F))
#: Every tensor's bytes start at a multiple of this in the arena.
ALIGN = 64
#: Smallest arena (bytes); it grows by doubling.
MIN_ARENA = 1 << 22

DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16", "bool", "int64", "int32", "int16",
               "int8", "uint8")


class ProtocolError(Exception):
    """A frame or an answer that does not follow the protocol."""


# --------------------------------------------------------------------------------------------
# JSON, strictly


def _reject_constant(name: str):
    raise ProtocolError(f"non-finite number {name} in a message")


def _no_duplicates(pairs):
    out = dict(pairs)
    if len(out) != len(pairs):  # a key given twice: the first one named
        seen: set = set()
        for key, _ in pairs:
            if key in seen:
                raise ProtocolError(f"duplicate key {key!r} in a message")
            seen.add(key)
    return out


#: One decoder and one encoder for every message (``json.loads``/``json.dumps`` with options
#: build a new one per call): the same parse and the same bytes.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


def parse(data: bytes) -> dict:
    """One message: a JSON object, no non-finite numbers, no duplicate keys."""
    try:
        text = data.decode("utf-8")
        if text.startswith("\ufeff"):  # as json.loads: a byte-order mark is not JSON
            raise json.JSONDecodeError("Unexpected UTF-8 BOM", text, 0)
        value = _DECODER.decode(text)
    except ProtocolError:
        raise
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"a message that is not JSON ({type(exc).__name__})") from None
    except RecursionError:
        raise ProtocolError("a message nested too deeply") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"a message that is a JSON {type(value).__name__}, not an object")
    return value


def dump(message: dict) -> bytes:
    return _ENCODER.encode(message).encode("utf-8")


def plain(value: Any) -> Any:
    """``value`` as JSON-safe data: non-finite floats as the strings ``"inf"``, ``"-inf"``,
    ``"nan"``; tuples as lists; anything else that JSON cannot hold as its ``repr``."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return repr(value)


# --------------------------------------------------------------------------------------------
# Frames


def send(sock: socket.socket, message: dict, fds: tuple[int, ...] = ()) -> None:
    data = dump(message)
    if len(data) > MAX_FRAME:
        raise ProtocolError(f"a message of {len(data)} bytes (limit {MAX_FRAME})")
    frame = struct.pack(">I", len(data)) + data
    if fds:
        sent = socket.send_fds(sock, [frame], list(fds))
        if sent < len(frame):
            sock.sendall(frame[sent:])
    else:
        sock.sendall(frame)


def _read_exact(sock: socket.socket, n: int, fds: list | None = None,
                deadline: float | None = None, text: bool = False) -> bytes:
    """``n`` bytes; with ``deadline`` (``time.monotonic()``), ``TimeoutError`` once it passes,
    however the bytes trickle in (a peer sending one byte at a time gains no time): after it,
    only bytes already there are read (an answer that came in time but is read late, as a spare
    worker's load is, still counts; :func:`receive` bounds a frame's length). ``text``:
    each chunk is checked as it arrives (only the bytes :func:`dump` writes), so a frame whose
    body cannot be a message fails at once instead of waiting for the rest of it."""

    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = max(deadline - time.monotonic(), 0.0)
            if not select.select([sock], [], [], left)[0]:
                raise TimeoutError("no complete answer in time")
        if fds is not None:
            data, new_fds, _flags, _addr = socket.recv_fds(sock, n - got, 4)
            fds.extend(new_fds)
        else:
            data = sock.recv(n - got)
        if not data:
            raise EOFError("the peer closed the channel")
        if text and data.translate(None, _JSON_BYTES):
            raise ProtocolError("a frame holding bytes that no message holds")
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


def receive(sock: socket.socket, *, with_fds: bool = False, deadline: float | None = None,
            limit: int = MAX_FRAME, strict: bool = False):
    """One message (``(message, fds)`` with ``with_fds``). ``EOFError`` when the peer is gone;
    ``TimeoutError`` when the whole frame has not arrived by ``deadline``; ``ProtocolError`` for
    a frame longer than ``limit`` and, with ``strict`` (the checker reading a worker's answer),
    as soon as a byte arrives that no frame :func:`dump` writes could hold there."""
    fds: list | None = [] if with_fds else None
    head = _read_exact(sock, 4, fds, deadline)
    (length,) = struct.unpack(">I", head)
    if length > limit:
        raise ProtocolError(f"a frame of {length} bytes (limit {limit})")
    if strict and length < 2:
        raise ProtocolError(f"a frame of {length} bytes (no message is that short)")
    message = parse(_read_exact(sock, length, fds, deadline, text=strict))
    return (message, fds or []) if with_fds else message


# --------------------------------------------------------------------------------------------
# The arena


def _memfd(size: int) -> int:
    """A shared-memory file of ``size`` bytes. A memfd is sealed at that size: the worker (which
    maps it, and as root could reopen it) cannot shrink it under the checker's mapping, where a
    read would then end the checker with ``SIGBUS``."""
    if hasattr(os, "memfd_create"):
        flags = getattr(os, "MFD_CLOEXEC", 0) | getattr(os, "MFD_ALLOW_SEALING", 0)
        fd = os.memfd_create("attnverify-arena", flags)
        os.ftruncate(fd, size)
        _seal(fd)
        return fd
    # no memfd (not Linux): an unlinked temporary file
    fd, path = tempfile.mkstemp(prefix="attnverify-arena-")
    os.unlink(path)
    os.set_inheritable(fd, False)
    os.ftruncate(fd, size)
    return fd


def _seal(fd: int) -> None:
    seals = sum(getattr(fcntl, name, 0) for name in ("F_SEAL_SHRINK", "F_SEAL_GROW",
                                                      "F_SEAL_SEAL"))
    if seals and hasattr(fcntl, "F_ADD_SEALS"):
        try:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        except OSError:  # a kernel without sealing: the size stays unprotected
            pass


class Arena:
    """A shared-memory region both processes map. The checker creates it (:meth:`create`) and
    sends its descriptor once; the worker maps it (:meth:`attach`) and closes the descriptor, so
    that nothing but the channel stays open in the worker (Python's ``mmap`` keeps a duplicate
    of the descriptor; the mapping is made with libc's ``mmap`` where it can be)."""

    def __init__(self, buffer, size: int, fd: int | None = None, unmap=None, drop=None,
                 compare=None):
        self.buffer, self.size, self.fd, self._unmap = buffer, size, fd, unmap
        self._drop, self._compare = drop, compare

    @classmethod
    def create(cls, size: int) -> Arena:
        size = max(MIN_ARENA, _round_up(size, mmap.PAGESIZE))
        fd = _memfd(size)
        buffer, unmap, drop, compare = _map(fd, size)
        return cls(buffer, size, fd, unmap, drop, compare)

    @classmethod
    def attach(cls, fd: int, size: int) -> Arena:
        try:
            if os.fstat(fd).st_size < size:
                raise ProtocolError("the arena is smaller than announced")
            buffer, unmap, drop, compare = _map(fd, size)
        finally:
            os.close(fd)
        return cls(buffer, size, None, unmap, drop, compare)

    def release_fd(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def drop_pages(self, start: int = 0) -> None:
        """Give the arena's memory from byte ``start`` on back (those bytes read as zeros
        after; ``start`` is rounded up to a page): in both processes, also where the other one
        keeps it mapped (the worker keeps a replaced arena mapped, since the target may hold
        views of it). Nothing where the platform cannot."""
        start = _round_up(max(0, start), mmap.PAGESIZE)
        if self._drop is not None and start < self.size:
            self._drop(start, self.size - start)

    def same_bytes(self, offset: int, want) -> bool:
        """Whether the arena holds ``want`` (bytes, or a contiguous CPU tensor: its bytes) at
        ``offset``, compared in place (``memcmp``: no copy of either side, which for a large
        input would cost as much memory again and more time than the comparison)."""
        if isinstance(want, (bytes, bytearray)):
            n, pointer = len(want), want
        else:
            n, pointer = want.numel() * want.element_size(), want.data_ptr()
        if offset < 0 or offset + n > self.size:
            return False
        if n == 0:
            return True
        if self._compare is not None:
            return self._compare(offset, pointer, n)
        here = bytes(self.buffer[offset:offset + n])
        if isinstance(want, (bytes, bytearray)):
            return here == bytes(want)
        return here == want.numpy().tobytes()

    def copy_in(self, offset: int, src) -> None:
        """The bytes of ``src`` (bytes, or a contiguous CPU tensor: its bytes) written at
        ``offset``: one copy (``memmove``) where the arena is mapped through libc."""
        if isinstance(src, (bytes, bytearray)):
            n, pointer = len(src), src
        else:
            n, pointer = src.numel() * src.element_size(), src.data_ptr()
        if offset < 0 or offset + n > self.size:
            raise ProtocolError("the arena is too small for this request")
        if n == 0:
            return
        if isinstance(self.buffer, ctypes.Array):
            ctypes.memmove(ctypes.addressof(self.buffer) + offset, pointer, n)
        else:
            memoryview(self.buffer)[offset:offset + n] = ctypes.string_at(pointer, n)

    def copy_out(self, offset: int, dst) -> None:
        """The arena's bytes at ``offset`` read once into ``dst`` (a contiguous CPU tensor of
        this process's own, as many bytes as it holds)."""
        n = dst.numel() * dst.element_size()
        if offset < 0 or offset + n > self.size:
            raise ProtocolError("a tensor slot outside the arena")
        if n == 0:
            return
        if isinstance(self.buffer, ctypes.Array):
            ctypes.memmove(dst.data_ptr(), ctypes.addressof(self.buffer) + offset, n)
        else:
            ctypes.memmove(dst.data_ptr(), bytes(self.buffer[offset:offset + n]), n)

    def close(self) -> None:
        self.release_fd()
        unmap, self._unmap = self._unmap, None
        if unmap is not None:
            try:
                unmap()
            except BufferError:  # a view is still exported: the mapping goes with the process
                pass


#: ``madvise`` advice that frees a shared mapping's pages in the file itself (Linux).
MADV_REMOVE = 9


def _map(fd: int, size: int):
    """``(writable buffer, unmap, drop, compare)`` over ``size`` bytes of ``fd``, shared; the
    buffer does not hold the descriptor; ``drop(start, length)`` frees those bytes' pages in
    the file (``MADV_REMOVE``), ``None`` where that is not available; ``compare(offset,
    pointer, n)`` compares ``n`` bytes in place (``memcmp``), ``None`` without libc."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        address = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        buffer = (ctypes.c_char * size).from_address(address)

        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        libc.memcmp.restype = ctypes.c_int

        def unmap():
            libc.munmap(address, size)

        def drop(start, length):
            # fails harmlessly where unsupported
            libc.madvise(address + start, length, MADV_REMOVE)

        def compare(offset, pointer, n):
            return libc.memcmp(address + offset, pointer, n) == 0

        return buffer, unmap, drop if sys.platform.startswith("linux") else None, compare
    except (OSError, AttributeError):  # no libc mmap: Python's (which keeps a descriptor)
        buffer = mmap.mmap(fd, size)
        return buffer, buffer.close, None, None


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


# --------------------------------------------------------------------------------------------
# Tensors in the arena


@dataclass(frozen=True)
class Slot:
    """A tensor in the arena: bytes at ``offset`` (``elements`` elements of ``dtype``, the
    storage from element 0 to the last the view reaches), viewed with ``size``, ``stride`` and
    ``storage_offset``; ``device`` is where the receiver puts it."""

    offset: int
    elements: int
    dtype: str
    size: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    device: str = "cpu"

    def to_json(self) -> dict:
        return {"offset": self.offset, "elements": self.elements, "dtype": self.dtype,
                "size": list(self.size), "stride": list(self.stride),
                "storage_offset": self.storage_offset, "device": self.device}

    @classmethod
    def from_json(cls, data: Any, arena_size: int) -> Slot:
        """A slot from a message, every field checked (types, ranges, inside the arena)."""
        if not isinstance(data, dict) or set(data) != {"offset", "elements", "dtype", "size",
                                                        "stride", "storage_offset", "device"}:
            raise ProtocolError("a tensor slot with missing or extra fields")
        ints = [data["offset"], data["elements"], data["storage_offset"], *data["size"],
                *data["stride"]] if isinstance(data["size"], list) and \
            isinstance(data["stride"], list) else None
        if ints is None or any(type(v) is not int or v < 0 for v in ints):
            raise ProtocolError("a tensor slot with a field that is not a non-negative integer")
        if data["dtype"] not in DTYPE_NAMES or not isinstance(data["device"], str):
            raise ProtocolError(f"a tensor slot with dtype {data['dtype']!r}")
        if len(data["size"]) != len(data["stride"]) or len(data["size"]) > 16:
            raise ProtocolError("a tensor slot whose sizes and strides do not match")
        slot = cls(data["offset"], data["elements"], data["dtype"], tuple(data["size"]),
                   tuple(data["stride"]), data["storage_offset"], data["device"])
        if slot.offset % ALIGN or slot.offset + slot.nbytes > arena_size:
            raise ProtocolError("a tensor slot outside the arena")
        if slot.reach > slot.elements:
            raise ProtocolError("a tensor slot whose view reaches past its bytes")
        return slot

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.elements * self.itemsize

    @property
    def reach(self) -> int:
        """Elements of storage the view needs (0 for an empty view)."""
        if any(n == 0 for n in self.size):
            return 0
        return self.storage_offset + sum((n - 1) * s for n, s in zip(self.size, self.stride)) + 1


_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "bool": 1, "int64": 8,
             "int32": 4, "int16": 2, "int8": 1, "uint8": 1}


@dataclass(frozen=True)
class Recipe:
    """A constant input the receiver builds itself instead of reading its bytes from the arena:
    the ``n × n`` identity (``"eye"``) of ``dtype``, viewed contiguously as ``size`` (leading
    sizes 1). Nothing of it is in the arena (``elements`` 0: no bytes to write, read back or
    compare). The worker hands the target a read-only identity (:func:`eye_pages`): a write
    into it ends the worker. The lifting's ``K = V = I`` (:mod:`attnverify.attention.lift`)
    crosses so: up to 134 MB a call that would otherwise be written, read back twice and held
    in the arena."""

    name: str
    n: int
    dtype: str
    size: tuple[int, ...]
    device: str = "cpu"

    elements = 0  # no bytes in the arena

    @property
    def stride(self) -> tuple[int, ...]:
        return _contiguous_strides(self.size)

    def to_json(self) -> dict:
        return {"recipe": self.name, "n": self.n, "dtype": self.dtype, "size": list(self.size),
                "device": self.device}

    @classmethod
    def from_json(cls, data: Any) -> Recipe:
        """A recipe from a message, every field checked."""
        if not isinstance(data, dict) or set(data) != {"recipe", "n", "dtype", "size", "device"}:
            raise ProtocolError("a constant with missing or extra fields")
        n, size = data["n"], data["size"]
        if data["recipe"] != "eye" or type(n) is not int or not 0 <= n <= MAX_EYE:
            raise ProtocolError("a constant that is not an identity of at most "
                                f"{MAX_EYE} rows")
        if data["dtype"] not in _FLOATS or not isinstance(data["device"], str):
            raise ProtocolError(f"a constant of dtype {data['dtype']!r}")
        if not isinstance(size, list) or not 2 <= len(size) <= 16 or size[-2:] != [n, n] or \
                any(type(v) is not int or v != 1 for v in size[:-2]):
            raise ProtocolError("a constant identity whose sizes are not [1, …, n, n]")
        return cls("eye", n, data["dtype"], tuple(size), data["device"])


#: Largest identity a :class:`Recipe` names (rows).
MAX_EYE = 1 << 16
#: The pages of identities each side keeps for later requests (:class:`Identities`): two of
#: 4096 rows.
KEEP_EYES = 32 << 20
_FLOATS = ("float64", "float32", "float16", "bfloat16")


def slot_from_json(data: Any, arena_size: int) -> Slot | Recipe:
    """An input's description: a :class:`Slot` in the arena or a :class:`Recipe`."""
    if isinstance(data, dict) and "recipe" in data:
        return Recipe.from_json(data)
    return Slot.from_json(data, arena_size)


def _contiguous_strides(size) -> tuple[int, ...]:
    stride, acc = [], 1
    for n in reversed(size):
        stride.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(stride))


def eye_pages(n: int, dtype, *, readonly: bool):
    """``I_n`` (``[n, n]``) on anonymous pages of its own: only the pages the diagonal touches
    are ever allocated (the rest read as the kernel's shared zero page: ``L = 4097`` in float64
    holds 16 MB, not 134 MB). ``readonly``: ``mprotect``-ed read-only, so that no one can write
    it (a write is a segmentation fault, not a silent change). ``None`` where this platform
    cannot map or protect it."""
    import torch  # torch-free: the zygote imports wire first

    itemsize = torch.empty(0, dtype=dtype).element_size()
    nbytes = max(n * n * itemsize, 1)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                           prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, AttributeError, ValueError):
        return None
    eye = torch.frombuffer(buffer, dtype=dtype, count=n * n) if n else torch.empty(0, dtype=dtype)
    if n:
        eye.view(n, n).diagonal().fill_(1)
        pointer = ctypes.c_char.from_buffer(buffer)
        address = ctypes.addressof(pointer)
        del pointer  # no export of the buffer left behind but the tensor's
        if readonly and libc.mprotect(address, nbytes, mmap.PROT_READ) != 0:
            return None
    return eye.view(n, n)


def eye_resident(n: int, itemsize: int) -> int:
    """The bytes :func:`eye_pages` allocates for ``I_n``: the pages its diagonal touches (one a
    row once a row spans a page)."""
    page = mmap.PAGESIZE
    return min(-(-n * n * itemsize // page), n) * page


class Identities:
    """Identities kept for later use while the pages they hold (:func:`eye_resident`) stay
    within ``budget`` bytes, the least recently used dropped first (the last one always kept):
    an identity of 4096 rows holds 16 MiB in any dtype, so a count of them would not bound the
    memory; building one again costs a page fault a row."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.kept: OrderedDict = OrderedDict()
        self.held = 0

    def get(self, key):
        if key not in self.kept:
            return None
        self.kept.move_to_end(key)
        return self.kept[key][0]

    def put(self, key, eye, resident: int):
        old = self.kept.pop(key, None)
        self.held += resident - (old[1] if old is not None else 0)
        self.kept[key] = (eye, resident)
        while self.held > self.budget and len(self.kept) > 1:
            self.held -= self.kept.popitem(last=False)[1][1]
        return eye

    def values(self):
        return [eye for eye, _ in self.kept.values()]


#: Tensors marked :func:`constant`, by the address of their storage: ``(weak reference, the
#: storage's write count then, its recipe or None)``. By storage, not by object: torch.func
#: hands an autograd Function other tensor objects over the same storage.
_CONSTANTS: dict = {}


def constant(t, recipe: str | None = None):
    """Mark ``t`` (a CPU tensor of the sender's own that nothing writes into again, such as the
    lifting's identity built once per process) as constant: a request that sends it, or another
    view of its storage, may keep its bytes as what its slot must hold after the call instead of
    a copy (``remote._expected_bytes``), and send it once when it is given twice. Torch counts
    every write into a storage (``_version``, shared by its views): a constant written into
    after all is an internal error where it is next sent. ``recipe`` ``"eye"`` (``t`` the
    identity, ``[1, …, n, n]``): the receiver builds it (:class:`Recipe`, :func:`recipe_of`)
    instead of receiving its bytes."""
    for key in [k for k, (ref, _, _) in _CONSTANTS.items() if ref() is None]:
        del _CONSTANTS[key]
    if recipe is not None:
        n = t.shape[-1] if t.dim() >= 2 else -1
        if recipe != "eye" or t.shape[-2:] != (n, n) or any(d != 1 for d in t.shape[:-2]) or \
                not t.is_contiguous() or t.storage_offset():
            raise ValueError("a recipe 'eye' names a contiguous identity [1, …, n, n]")
    _CONSTANTS[t.untyped_storage().data_ptr()] = (weakref.ref(t), t._version, recipe)
    return t


def recipe_of(t) -> Recipe | None:
    """The :class:`Recipe` of ``t`` where ``t`` is a whole constant marked with one (the same
    view: sizes, contiguous, offset 0), else ``None``."""
    entry = _constant_entry(t)
    if entry is None or entry[2] is None or t.storage_offset() or not t.is_contiguous():
        return None
    owner = entry[0]()
    if owner is None or tuple(t.shape) != tuple(owner.shape):
        return None
    return Recipe(entry[2], int(t.shape[-1]), dtype_name(t.dtype), tuple(t.shape))


def is_constant(t) -> bool:
    """Whether ``t`` is a view of the storage of a live tensor marked :func:`constant`
    (``RuntimeError`` if that storage was written into since)."""
    return _constant_entry(t) is not None


def _constant_entry(t):
    if not _CONSTANTS or t.device.type != "cpu":
        return None
    try:
        address = t.untyped_storage().data_ptr()
    except (NotImplementedError, RuntimeError):  # a torch.func wrapper: no storage of its own
        return None
    entry = _CONSTANTS.get(address)
    owner = entry[0]() if entry is not None else None
    if owner is None or owner.untyped_storage().data_ptr() != address:
        return None
    if t._version != entry[1]:
        raise RuntimeError("attnverify: a tensor marked constant was written into")
    return entry


def dtype_name(dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _ITEMSIZE:
        raise ProtocolError(f"tensors of dtype {name} do not cross the process boundary")
    return name


def torch_dtype(name: str):
    import torch  # torch-free: the zygote imports wire first

    return getattr(torch, name)


def span_elements(t) -> int:
    """Storage elements from element 0 to the last one ``t`` reaches."""
    if t.numel() == 0:
        return 0
    return t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1


class Layout:
    """Allocation of slots in an arena for one request (a bump allocator from ``start``)."""

    def __init__(self, start: int = 0) -> None:
        self.used = _round_up(start, ALIGN)

    def take(self, nbytes: int) -> int:
        offset = _round_up(self.used, ALIGN)
        self.used = offset + nbytes
        return offset


def view_of(arena: Arena, slot: Slot, elements: int | None = None):
    """A tensor over the arena's bytes of ``slot``: 1-D, ``elements`` long (default all)."""
    import torch  # torch-free: the zygote imports wire first

    count = slot.elements if elements is None else elements
    if count == 0:
        return torch.empty(0, dtype=torch_dtype(slot.dtype))
    return torch.frombuffer(arena.buffer, dtype=torch_dtype(slot.dtype), count=count,
                            offset=slot.offset)


def write_tensor(arena: Arena, layout: Layout, t, device: str | None = None,
                 span=None) -> Slot:
    """Copy ``t``'s storage span into the arena; the slot rebuilds the same view. ``span``: for
    a CPU tensor, the span's bytes the caller holds already (bytes, or a contiguous CPU tensor,
    such as its own copy of them), copied from there (``memmove``)."""
    import torch  # torch-free: the zygote imports wire first

    t = t.detach()
    elements = span_elements(t)
    itemsize = t.element_size()
    offset = layout.take(elements * itemsize)
    slot = Slot(offset, elements, dtype_name(t.dtype), tuple(t.shape), tuple(t.stride()),
                t.storage_offset() if elements else 0, device or str(t.device))
    if span is not None:
        held = len(span) if isinstance(span, (bytes, bytearray)) else \
            span.numel() * span.element_size()
        if held != slot.nbytes or t.device.type != "cpu":
            raise ValueError("a span that is not the CPU tensor's storage span")
    if elements:
        if layout.used > arena.size:
            raise ProtocolError("the arena is too small for this request")
        if span is not None:
            arena.copy_in(offset, span)
        else:
            flat = torch.as_strided(t, (elements,), (1,), 0)
            view_of(arena, slot).copy_(flat)
    return slot


def output_slot(layout: Layout, shape, dtype, device: str) -> Slot:
    """A contiguous slot for a result the worker writes (``shape`` and ``dtype`` expected)."""
    shape = tuple(int(n) for n in shape)
    numel = math.prod(shape)
    name = dtype_name(dtype)
    offset = layout.take(numel * _ITEMSIZE[name])
    return Slot(offset, numel, name, shape, _contiguous_strides(shape), 0, device)


def read_tensor(arena: Arena, slot: Slot, *, fresh: bool = True):
    """The tensor ``slot`` describes (the same sizes, strides and storage offset), on
    ``slot.device``: in new storage of its own (``fresh``), or, on the CPU, a view of the
    arena's own bytes (no copy: what is written into it is what the other side reads)."""
    import torch  # torch-free: the zygote imports wire first

    dtype = torch_dtype(slot.dtype)
    if not fresh and slot.device == "cpu":
        storage = view_of(arena, slot) if slot.elements else torch.empty(0, dtype=dtype)
        return torch.as_strided(storage, slot.size, slot.stride, slot.storage_offset)
    storage = torch.empty(slot.elements, dtype=dtype, device=slot.device)
    if slot.elements and slot.device == "cpu":
        arena.copy_out(slot.offset, storage)
    elif slot.elements:
        storage.copy_(view_of(arena, slot))
    return torch.as_strided(storage, slot.size, slot.stride, slot.storage_offset)
