"""Durable JSON state files: atomic, fsynced, private, never followed through symlinks.

Mutable records are replaced with temp + fsync + rename; immutable records are published
with ``link`` so that the first writer wins. Every write fsyncs the parent directory.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Tuple, Type, TypeVar, Union

from agent_stdlib.errors import AgentError

DIR_MODE = 0o700
FILE_MODE = 0o600


class StateError(AgentError):
    """A state file is unreadable, half-published or malformed; the message names it."""


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


def dumps(data: Dict[str, Any]) -> bytes:
    """Serialise a record canonically (sorted keys, trailing newline)."""
    return (json.dumps(data, sort_keys=True, indent=2) + "\n").encode("utf-8")


def _fsync_dir(path: Path) -> None:
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
    _fsync_dir(path.parent)


def write_json_atomic(path: Path, data: Dict[str, Any]) -> None:
    """Replace the mutable record at ``path`` atomically."""
    write_bytes_atomic(path, dumps(data))


def write_many_json(records: Iterable[Tuple[Path, Dict[str, Any]]]) -> None:
    """Replace many mutable records, then make them all durable with one ``sync``.

    For bulk state written before a commit marker (thousands of attempt records at submit):
    each file is still written to a temp and renamed, so a reader sees old or new, never
    half; durability comes from one ``os.sync()`` at the end instead of an fsync per file
    and per directory. Return only after everything is on disk.
    """
    for path, data in records:
        temp = path.parent / f".tmp-{os.urandom(8).hex()}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        fd = os.open(str(temp), flags, FILE_MODE)
        try:
            os.write(fd, dumps(data))
        finally:
            os.close(fd)
        os.replace(temp, path)
    os.sync()


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
    _fsync_dir(path.parent)
    return won


def publish_json_immutable(path: Path, data: Dict[str, Any]) -> bool:
    """Publish an immutable JSON record; True if this call created it."""
    return publish_immutable(path, dumps(data))


def open_state_file(path: Union[str, Path]) -> Optional[int]:
    """A read-only fd of a state file; None if it does not exist.

    StateError unless ``path`` is a regular file: a symlink is never followed (O_NOFOLLOW),
    and a FIFO or device is never read (O_NONBLOCK keeps the open from waiting on one).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as err:
        what = "a symbolic link" if err.errno == errno.ELOOP else err.strerror
        raise StateError(f"{path}: cannot open ({what})") from err
    try:
        mode = os.fstat(fd).st_mode
    except OSError as err:
        os.close(fd)
        raise StateError(f"{path}: cannot stat ({err.strerror})") from err
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise StateError(f"{path}: not a regular file")
    return fd


def read_bytes(path: Union[str, Path]) -> Optional[bytes]:
    """Read a state file (a regular file, never through a symlink); None if it is absent."""
    fd = open_state_file(path)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb") as handle:
            return handle.read()
    except OSError as err:
        raise StateError(f"{path}: cannot read ({err.strerror})") from err


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


def read_json(path: Union[str, Path]) -> Optional[Dict[str, Any]]:
    """Read a JSON record; None if missing, StateError if half-published or malformed."""
    raw = read_bytes(path)
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise StateError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise StateError(f"{path}: expected a JSON object")
    return data
