"""The image registry: alias -> sealed image file, its sha256 pinned at ``image add``.

One JSON file per workspace (``<workspace>/images.json``, 0600), rewritten atomically
under an exclusive lock. Plans copy the entry (path and sha256) of every image they use,
so a later ``image rm`` or re-add never changes a submitted run.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Dict, Iterator, Optional, Tuple

from agent_stdlib.statefile import StateError, read_json, write_json_atomic
from control.config.fields import NAME, SAFE_PATH
from control.errors import Conflict, InvalidInput, NotFound

REGISTRY_FILE = "images.json"
SUFFIXES = (".sqsh", ".squashfs", ".sif", ".sqfs")
# Which image files each container runtime can run.
RUNTIME_SUFFIXES: Dict[str, Tuple[str, ...]] = {
    "pyxis": (".sqsh", ".squashfs"),
    "apptainer": (".sif", ".sqsh", ".squashfs"),
    "charliecloud": (".sqfs", ".squashfs"),
}
CHUNK = 1 << 20


@dataclass(frozen=True)
class ImageEntry:
    """One registered image."""

    alias: str
    path: str
    sha256: str
    bytes: int
    added_at: float


def registry_path(workspace: Path) -> Path:
    """Where the workspace keeps its image registry."""
    return workspace / REGISTRY_FILE


def sha256_file(path: Path) -> str:
    """Hex sha256 of a (possibly large) file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_alias(alias: str) -> None:
    if not NAME.fullmatch(alias):
        raise InvalidInput(f"image alias {alias!r}: letters, digits, '.', '_', '-' only "
                           f"(max 64)")


def _check_image_path(path: str) -> Path:
    pure = PurePosixPath(path)
    if not pure.is_absolute() or ".." in pure.parts or not SAFE_PATH.fullmatch(path):
        raise InvalidInput(f"image path {path!r}: must be an absolute path without '..' "
                           f"made of letters, digits and ._/+@,=-")
    if pure.suffix not in SUFFIXES:
        raise InvalidInput(f"image path {path}: expected a sealed image file ("
                           + ", ".join(SUFFIXES) + ")")
    real = Path(path)
    if not real.is_file():
        raise NotFound(f"image path {path}: no such file")
    return real


def load(workspace: Path) -> Dict[str, ImageEntry]:
    """Every registered image by alias (empty if there is no registry yet)."""
    path = registry_path(workspace)
    try:
        data = read_json(path)
    except StateError as err:
        raise InvalidInput(f"{path}: not a valid image registry ({err})") from err
    if data is None:
        return {}
    try:
        if data.get("schema_version") != 1:
            raise ValueError("unsupported schema_version")
        return {alias: ImageEntry(alias=alias, **entry)
                for alias, entry in data["images"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise InvalidInput(f"{path}: not a valid image registry ({err})") from err


def _save(workspace: Path, entries: Dict[str, ImageEntry]) -> None:
    images = {alias: {k: v for k, v in asdict(e).items() if k != "alias"}
              for alias, e in sorted(entries.items())}
    write_json_atomic(registry_path(workspace), {"schema_version": 1, "images": images})


@contextlib.contextmanager
def _locked(workspace: Path) -> Iterator[None]:
    workspace.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(workspace / (REGISTRY_FILE + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def get(workspace: Path, alias: str) -> ImageEntry:
    """The entry of ``alias`` or NotFound."""
    entry = load(workspace).get(alias)
    if entry is None:
        raise NotFound(f"image {alias!r}: not registered", hint="see 'synthbatch image ls'")
    return entry


def add(workspace: Path, alias: str, path: str, replace: bool = False,
        now: Optional[float] = None) -> ImageEntry:
    """Hash ``path`` and register it as ``alias`` (Conflict if taken, unless ``replace``)."""
    _check_alias(alias)
    real = _check_image_path(path)
    digest, size = sha256_file(real), real.stat().st_size
    with _locked(workspace):
        entries = load(workspace)
        if alias in entries and not replace:
            raise Conflict(f"image {alias!r}: already registered ({entries[alias].path})",
                           hint="pass --replace to pin the new file")
        entry = ImageEntry(alias=alias, path=path, sha256=digest, bytes=size,
                           added_at=time.time() if now is None else now)
        entries[alias] = entry
        _save(workspace, entries)
    return entry


def remove(workspace: Path, alias: str) -> ImageEntry:
    """Unregister ``alias`` (the image file is left alone); NotFound if unknown."""
    with _locked(workspace):
        entries = load(workspace)
        if alias not in entries:
            raise NotFound(f"image {alias!r}: not registered", hint="see 'synthbatch image ls'")
        entry = entries.pop(alias)
        _save(workspace, entries)
    return entry


def verify(entry: ImageEntry) -> Optional[str]:
    """None if the file still has the pinned sha256, else what is wrong."""
    path = Path(entry.path)
    if not path.is_file():
        return f"{entry.path}: no such file"
    digest = sha256_file(path)
    if digest != entry.sha256:
        return f"{entry.path}: sha256 {digest} does not match the pinned {entry.sha256}"
    return None
