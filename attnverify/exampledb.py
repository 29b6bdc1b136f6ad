"""Example databases shared between runs, processes and machines (``falsify --database``).

Every database here is one of Hypothesis's own: a directory (:class:`DirectoryBasedExampleDatabase`,
safe for several processes on one machine or a shared file system) or a Redis server
(:class:`hypothesis.extra.redis.RedisExampleDatabase`, for several machines; the ``redis`` package
of the ``fuzz`` extra). :func:`open_database` validates the user's text before anything is written
(a bad URL, an unreachable server, a database directory that is a file or cannot be written: one
line, exit 2) and returns the database wrapped in a :class:`ResilientDatabase`: when the database
goes away in the middle of a run (the Redis server stops, the disk fills), the run goes on with an
in-memory database, the wrapper records that the database was lost and why, and the caller says so
(the search's verdict stands).

Keys come from :func:`database_key`: a kind (``witness``, ``near``, ``strata``) and the parts that
make an entry meaningful (target, normalized expression, parameters), with attnverify's version,
so that a release that changes what a stored entry means never replays an older one.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import unquote, urlsplit

from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    InMemoryExampleDatabase,
)

import attnverify
from attnverify.errors import UsageError

__all__ = ["REDIS_TIMEOUT_S", "ResilientDatabase", "database_key", "describe", "open_database"]

#: Seconds a Redis connection, command or answer may take before the server counts as away
#: (at open: exit 2; mid-run: the database is lost and the run goes on without it).
REDIS_TIMEOUT_S = 3.0
#: Redis database numbers accepted in a URL (a server has 16 by default; the server decides).
MAX_REDIS_DB = 2**31 - 1


def open_database(text: str, *, option: str = "--database") -> ResilientDatabase:
    """The example database that ``text`` names, checked and ready (nothing written yet):

    - ``redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`` (port 6379 and database 0 by default):
      connected and PINGed within :data:`REDIS_TIMEOUT_S`;
    - anything else: a directory path, existing and writable, or creatable (its nearest existing
      parent a writable directory); it is created on the first save.

    Raises :class:`UsageError` (one line naming ``option``) for a malformed URL, a server that does
    not answer or refuses the database number, or a path that is a file, not writable or not
    creatable."""
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"{option} expects a directory or redis://HOST:PORT/DB, got {text!r}")
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    if scheme == "redis":
        return ResilientDatabase(_open_redis(text, option), describe(text), "redis")
    if scheme:
        raise UsageError(f"{option}: unsupported URL scheme {scheme!r} in {_short(text)!r} "
                         "(expected a directory or redis://HOST:PORT/DB)")
    path = _check_directory(text, option)
    return ResilientDatabase(DirectoryBasedExampleDatabase(path), str(path), "directory")


def describe(text: str) -> str:
    """``text`` as results may show it: a Redis URL without its password."""
    if "://" not in text:
        return text
    parts = urlsplit(text)
    if parts.password is None:
        return text
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return parts._replace(netloc=f"{user}:***@{netloc}").geturl()


def _short(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."


def _open_redis(text: str, option: str) -> ExampleDatabase:
    shown = _short(describe(text))
    try:
        parts = urlsplit(text)
        port = parts.port  # ValueError for a port that is not a number in 0 … 65535
    except ValueError as exc:
        raise UsageError(f"{option}: bad Redis URL {shown!r} ({exc})") from None
    host = parts.hostname
    if not host:
        raise UsageError(f"{option}: no host in the Redis URL {shown!r} "
                         "(expected redis://HOST:PORT/DB)")
    if port == 0:
        raise UsageError(f"{option}: port 0 in the Redis URL {shown!r}")
    if parts.query or parts.fragment:
        raise UsageError(f"{option}: unexpected '?' or '#' part in the Redis URL {shown!r}")
    db_text = parts.path.strip("/")
    if db_text and not (db_text.isascii() and db_text.isdigit() and len(db_text) <= 10):
        raise UsageError(f"{option}: the Redis database must be a number, got {db_text[:20]!r} "
                         f"in {shown!r}")
    db = int(db_text) if db_text else 0
    if db > MAX_REDIS_DB:
        raise UsageError(f"{option}: Redis database number {db} is out of range in {shown!r}")
    try:
        import redis  # optional dependency (fuzz extra)
        from hypothesis.extra.redis import RedisExampleDatabase  # optional dependency (fuzz extra)
        from redis.backoff import NoBackoff  # optional dependency (fuzz extra)
        from redis.retry import Retry  # optional dependency (fuzz extra)
    except ImportError:
        raise UsageError(f"{option} {shown}: the redis package is not installed "
                         "(pip install 'attnverify[fuzz]')") from None
    client = redis.Redis(host=host, port=port or 6379, db=db,
                         username=unquote(parts.username) if parts.username else None,
                         password=unquote(parts.password) if parts.password else None,
                         socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S,
                         retry=Retry(NoBackoff(), 0))
    try:
        if client.ping() is not True:
            raise redis.exceptions.RedisError("PING was not answered with PONG")
    except (redis.exceptions.RedisError, OSError) as exc:
        client.close()
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise UsageError(f"{option}: cannot use the Redis database {shown!r}: "
                         f"{reason[:200]}") from None
    return RedisExampleDatabase(client, key_prefix=b"attnverify:")


def _check_directory(text: str, option: str) -> Path:
    """The directory ``text`` names, if it is one this process can write, or can create."""
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"{option}: {text} is not a directory")
        if not _writable(path):
            raise UsageError(f"{option}: the directory {text} is not writable")
        return path
    probe = path.parent
    try:
        while not probe.exists():
            probe = probe.parent
    except OSError as exc:
        raise UsageError(f"{option}: cannot create the directory {text} ({exc.strerror})") \
            from None
    if not probe.is_dir():
        raise UsageError(f"{option}: cannot create the directory {text}: {probe} is not a "
                         "directory")
    if not _writable(probe):
        raise UsageError(f"{option}: cannot create the directory {text}: {probe} is not "
                         "writable")
    return path


def _writable(directory: Path) -> bool:
    """Whether this process can create entries in ``directory``: the permission bits and a
    read-only mount say no; for root, whom permission bits never stop, a probe file (removed at
    once) tells a virtual or read-only file system (``/proc``, ``/sys``) apart."""
    if not os.access(directory, os.W_OK | os.X_OK):
        return False
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return False
    except (OSError, AttributeError):
        pass
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return True
    try:
        fd, name = tempfile.mkstemp(prefix=".attnverify-probe-", dir=directory)
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


def database_key(kind: str, *parts: object) -> bytes:
    """The key of entries of ``kind`` for ``parts`` (target, normalized expression, parameters,
    …), with attnverify's version: ``b"attnverify/<kind>/<digest>"``, the same on every machine
    and process for the same parts."""

    text = "\x00".join(["attnverify-example-db-1", attnverify.__version__, kind, *map(str, parts)])
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:40]
    return f"attnverify/{kind}/{digest}".encode()


def _lost_errors() -> tuple[type[BaseException], ...]:
    """What a database raises when it goes away: OSError (sockets, disks), and Redis's own
    errors where the redis package is installed."""
    errors: list[type[BaseException]] = [OSError, EOFError]
    try:
        import redis  # optional dependency (fuzz extra)
    except ImportError:
        pass
    else:
        errors.append(redis.exceptions.RedisError)
    return tuple(errors)


class ResilientDatabase(ExampleDatabase):
    """A database that outlives its backend: every entry is also kept in memory; when the backend
    fails (connection refused or reset, timeout, disk error) it is dropped for the rest of the run,
    :attr:`lost` says why (one line), and the run goes on with what is in memory."""

    def __init__(self, backend: ExampleDatabase, where: str, kind: str) -> None:
        super().__init__()
        self.backend: ExampleDatabase | None = backend
        self.memory = InMemoryExampleDatabase()
        self.where = where
        self.kind = kind
        self.lost: str | None = None
        self.saves = 0
        self._errors = _lost_errors()

    def __repr__(self) -> str:
        return f"ResilientDatabase({self.backend!r}, lost={self.lost!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ResilientDatabase) and other is self

    def __hash__(self) -> int:
        return id(self)

    def _lose(self, exc: BaseException, op: str) -> None:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        self.lost = f"{op} failed: {type(exc).__name__}: {reason}"[:200]
        backend, self.backend = self.backend, None
        try:
            close = getattr(getattr(backend, "redis", None), "close", None)
            if close is not None:
                close()
        except Exception:  # noqa: BLE001 - it is already gone
            pass

    def _call(self, op: str, *args) -> object:
        if self.backend is None:
            return None
        try:
            result = getattr(self.backend, op)(*args)
            return list(result) if op == "fetch" else result
        except self._errors as exc:
            self._lose(exc, op)
            return None

    def fetch(self, key: bytes) -> Iterable[bytes]:
        stored = self._call("fetch", key) or []
        seen = set()
        for value in [*stored, *self.memory.fetch(key)]:
            if value not in seen:
                seen.add(value)
                yield value

    def save(self, key: bytes, value: bytes) -> None:
        self.saves += 1
        self.memory.save(key, value)
        self._call("save", key, value)

    def delete(self, key: bytes, value: bytes) -> None:
        self.memory.delete(key, value)
        self._call("delete", key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.memory.move(src, dest, value)
        self._call("move", src, dest, value)

    def close(self) -> None:
        """Close the connection to a Redis server (a no-op for a directory)."""
        client = getattr(self.backend, "redis", None)
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing a connection that went away
                pass
