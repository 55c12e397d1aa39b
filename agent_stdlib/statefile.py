"""Durable JSON state files: atomic, fsynced, private, never followed through symlinks.

Mutable records are replaced with temp + fsync + rename; immutable records are published
with ``link`` so that the first writer wins. Every write fsyncs the parent directory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time
from pathlib import Path
from typing import (
    Any,
    Dict,
    Iterable,
    Iterator,
    Optional,
    Tuple,
    Type,
    TypeVar,
    Union,
)

from .errors import AgentError

DIR_MODE = 0o700
FILE_MODE = 0o600


class StateError(AgentError):
    """A state file is unreadable, half-published or malformed; the message names it."""


LOCK_POLL_S = 0.05


@contextlib.contextmanager
def locked(path: Path, wait_s: Optional[float] = None) -> Iterator[Optional[int]]:
    """Hold an exclusive ``flock`` on ``path`` (created 0600, never through a symlink).

    The one lock of the tree. ``wait_s`` None: block until it is had; 0: one try; more:
    try until that many seconds have passed. Yields the lock file's descriptor (a holder
    may write who it is into it), or None when the lock could not be had in time; closing
    the descriptor at the end of the block releases it.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
    try:
        if wait_s is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as err:
                    if err.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    if time.monotonic() >= deadline:
                        yield None
                        return
                    time.sleep(LOCK_POLL_S)
        yield fd
    finally:
        os.close(fd)


def ensure_dir(path: Path) -> Path:
    """Create ``path`` and any missing parents, each with mode 0700; return it."""
    missing = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=DIR_MODE)
        except FileExistsError:
            pass
    if not path.is_dir():
        raise StateError(f"{path}: not a directory")
    return path


_encode_str = json.encoder.encode_basestring_ascii  # what json.dumps uses for a str


def _scalar(value: Any) -> str:
    kind = type(value)
    if kind is str:
        return _encode_str(value)
    if kind is int:
        return int.__repr__(value)
    if kind is float and value - value == 0.0:  # finite: what json writes is its repr
        return float.__repr__(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    return json.dumps(value)  # floats (and their NaN/Infinity), anything else as json does


def _indented(value: Any, pad: str) -> str:
    kind = type(value)
    if kind is dict and value:
        inner = pad + "  "
        items = sorted(value.items())
        if any(type(k) is not str for k, _ in items):
            raise TypeError("non-string key")
        parts = []
        for key, item in items:  # scalars inline: most records are flat
            kind = type(item)
            text = _encode_str(item) if kind is str else int.__repr__(item) \
                if kind is int else "null" if item is None else _indented(item, inner)
            parts.append(f"{inner}{_encode_str(key)}: {text}")
        return "{\n" + ",\n".join(parts) + f"\n{pad}}}"
    if kind in (list, tuple) and value:
        inner = pad + "  "
        return "[\n" + ",\n".join(f"{inner}{_indented(v, inner)}" for v in value) + \
            f"\n{pad}]"
    if kind is dict or kind in (list, tuple):
        return "{}" if kind is dict else "[]"
    return _scalar(value)


def canonical(data: Any) -> str:
    """``json.dumps(data, sort_keys=True, indent=2)``, byte for byte, about 5x faster.

    The standard library writes indented JSON with its pure-Python encoder (~100 us for an
    attempt record, seconds for a 100,000-shard plan); this writes the same text with the
    C string escaper. Anything unusual (a key that is not a string, a subclass of dict)
    goes to ``json.dumps`` itself.
    """
    try:
        return _indented(data, "")
    except (TypeError, ValueError, RecursionError):
        return json.dumps(data, sort_keys=True, indent=2)


def dumps(data: Dict[str, Any]) -> bytes:
    """Serialise a record canonically (sorted keys, indented, trailing newline)."""
    return (canonical(data) + "\n").encode("utf-8")


def fsync_dir(path: Path) -> None:
    """fsync the directory ``path`` (what makes a rename or a new entry in it durable)."""
    fd = os.open(str(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(directory: Path, payload: bytes, mode: int) -> Path:
    temp = directory / f".tmp-{os.urandom(8).hex()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(str(temp), flags, mode)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return temp


def write_bytes_atomic(path: Path, payload: bytes, mode: int = FILE_MODE) -> None:
    """Replace ``path`` atomically with ``payload`` (temp + fsync + rename + dir fsync)."""
    temp = _write_temp(path.parent, payload, mode)
    try:
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: Path, data: Dict[str, Any]) -> None:
    """Replace the mutable record at ``path`` atomically."""
    write_bytes_atomic(path, dumps(data))


def sync_filesystem(path: Union[str, Path]) -> None:
    """Make everything written so far to the filesystem holding ``path`` durable.

    ``syncfs(2)`` of that one filesystem (Linux, through ctypes), not ``sync(2)`` of every
    filesystem of the machine: on a login node the latter also waits for every other
    user's dirty data. Falls back to ``os.sync()`` where syncfs is not there.
    """
    try:
        import ctypes

        syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError, ImportError):  # pragma: no cover - not Linux
        os.sync()
        return
    fd = os.open(str(path), os.O_RDONLY)
    try:
        if syncfs(fd) != 0:  # pragma: no cover - EBADF cannot happen on an open fd
            os.sync()
    finally:
        os.close(fd)


def write_many_json(records: Iterable[Tuple[Union[str, Path], Dict[str, Any]]]) -> None:
    """Replace many mutable records, then make them all durable with one sync.

    For bulk state (thousands of attempt records at submit and retry): each file is still
    written to a temp and renamed, so a reader sees old or new (or nothing), never half;
    durability comes from one ``sync_filesystem`` at the end instead of an fsync per file
    and per directory. Return only after everything is on disk.
    """
    write_many((path, dumps(data)) for path, data in records)


def write_many(payloads: Iterable[Tuple[Union[str, Path], bytes]]) -> None:
    """``write_many_json`` of records already serialised (``dumps``)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    first = None
    for path, payload in payloads:
        path = str(path)
        folder = os.path.dirname(path)
        first = first or folder
        temp = f"{folder}/.tmp-{os.urandom(8).hex()}"
        fd = os.open(temp, flags, FILE_MODE)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(temp, path)
    if first is not None:
        sync_filesystem(first)


def publish_immutable(path: Path, payload: bytes, mode: int = FILE_MODE) -> bool:
    """Publish ``payload`` at ``path`` only if nothing is there; True if this call won."""
    temp = _write_temp(path.parent, payload, mode)
    try:
        os.link(temp, path)
        won = True
    except FileExistsError:
        won = False
    finally:
        temp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return won


def publish_json_immutable(path: Path, data: Dict[str, Any]) -> bool:
    """Publish an immutable JSON record; True if this call created it."""
    return publish_immutable(path, dumps(data))


def refusal(info: os.stat_result) -> Optional[str]:
    """Why a file with this ``stat`` may not be read as a run's state or output, or None.

    The one rule every reader of a run directory applies (state records, the client's
    output, the files merge copies): a regular file owned by this user. The owner, not
    the link count, tells a planted file: a hard link to another user's file (``ln
    /other/secret winner.json``) carries that user's uid, while ``publish_immutable``
    links our own temp file (two links only until it unlinks the temp).
    """
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_uid != os.geteuid():
        return f"owned by uid {info.st_uid}, not by this user (uid {os.geteuid()}); not read"
    return None


def open_state_file(path: Union[str, Path]) -> Optional[int]:
    """A read-only fd of a state file; None if it does not exist.

    StateError unless ``path`` is a regular file of this user (:func:`refusal`): a symlink
    is never followed (O_NOFOLLOW), a FIFO or device is never read (O_NONBLOCK keeps the
    open from waiting on one), a hard link to another user's file is refused.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as err:
        what = "a symbolic link" if err.errno == errno.ELOOP else err.strerror
        raise StateError(f"{path}: cannot open ({what})") from err
    try:
        why = refusal(os.fstat(fd))
    except OSError as err:
        os.close(fd)
        raise StateError(f"{path}: cannot stat ({err.strerror})") from err
    if why:
        os.close(fd)
        raise StateError(f"{path}: {why}")
    return fd


READ_CHUNK = 1 << 16  # os.read(fd, n) allocates n bytes first: 1 MiB per call cost ~11 us


def _read_upto(fd: int, limit: int) -> bytes:
    """At most ``limit`` bytes of ``fd``; a short first read is the whole file (one
    ``read`` for a small record: status reads 100,000 of them)."""
    raw = os.read(fd, min(READ_CHUNK, limit))
    if len(raw) < READ_CHUNK:
        return raw
    parts, size = [raw], len(raw)
    while size < limit:
        more = os.read(fd, min(1 << 20, limit - size))
        if not more:
            break
        parts.append(more)
        size += len(more)
    return b"".join(parts)


def read_bytes(path: Union[str, Path], limit: Optional[int] = None) -> Optional[bytes]:
    """Read a state file (a regular file, never through a symlink); None if it is absent.
    ``limit``: at most that many bytes (a bulk reader's bound on a damaged record)."""
    fd = open_state_file(path)
    if fd is None:
        return None
    try:
        if limit is not None:
            return _read_upto(fd, limit)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    except OSError as err:
        raise StateError(f"{path}: cannot read ({err.strerror})") from err
    finally:
        os.close(fd)


R = TypeVar("R")


def load_record(path: Union[str, Path], cls: Type[R]) -> Optional[R]:
    """Read a contract record of type ``cls`` (anything with ``from_dict``).

    None if the file is missing; StateError naming the file if it is half-published,
    malformed or off-contract (the contracts raise ValueError subclasses).
    """
    data = read_json(path)
    if data is None:
        return None
    try:
        return cls.from_dict(data)  # type: ignore[attr-defined, no-any-return]
    except ValueError as err:
        raise StateError(f"{path}: {err}") from err


def read_json(path: Union[str, Path], limit: Optional[int] = None
              ) -> Optional[Dict[str, Any]]:
    """Read a JSON record; None if missing, StateError if half-published or malformed
    (``limit``: as :func:`read_bytes`)."""
    raw = read_bytes(path, limit)
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise StateError(f"{path}: not valid JSON ({err})") from err
    except RecursionError:  # a damaged or hostile record, nested thousands deep
        raise StateError(f"{path}: not valid JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise StateError(f"{path}: expected a JSON object")
    return data


def read_json_or_none(path: Union[str, Path]) -> Optional[Dict[str, Any]]:
    """:func:`read_json` for an advisory record: None when it is missing *or* damaged (a
    symlink, another user's file, not JSON), for readers that fall back and say nothing."""
    try:
        return read_json(path)
    except StateError:
        return None
