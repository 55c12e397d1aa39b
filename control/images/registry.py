"""The image registry: alias -> sealed image, its digest pinned at ``image add``.

One JSON file per workspace (``<workspace>/images.json``, 0600). An image is a file
(SquashFS ``.sqsh``/``.squashfs``/``.sqfs``, SIF ``.sif``) or a charliecloud image
directory; its digest is the file's sha256 or the directory's tree digest
(:mod:`agent_stdlib.imagedigest`, the rule preflight uses too), computed while streaming,
before the registry is touched. Every update is one read-modify-write under an exclusive
``flock`` of ``images.json.lock``, written with temp + fsync + rename, so concurrent adds
and removes never lose each other's entries and a reader never sees half a file.

Plans copy the entry (path and digest) of every image they use, so a later ``image rm``
or re-add never changes a submitted run.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

from synthbatch.agent_stdlib.imagedigest import DigestError, Progress, image_digest
from synthbatch.agent_stdlib.layout import images_registry
from synthbatch.agent_stdlib.statefile import StateError, locked, read_json, write_json_atomic
from synthbatch.agent_stdlib.text import quoted
from synthbatch.control.config.fields import NAME, SAFE_PATH
from synthbatch.control.config.rules import check_version
from synthbatch.control.errors import Conflict, InvalidInput, NotFound

SCHEMA_VERSION = 2  # 2 added kind, format and inspection (version 1 files are still read)
KINDS = ("serving", "client")
SUFFIXES = (".sqsh", ".squashfs", ".sif", ".sqfs")
DIRECTORY = "directory"  # the format of an image directory (charliecloud)
# Which image files each container runtime can run, and which can run a directory.
RUNTIME_SUFFIXES: Dict[str, Tuple[str, ...]] = {
    "pyxis": (".sqsh", ".squashfs"),
    "apptainer": (".sif", ".sqsh", ".squashfs"),
    "charliecloud": (".sqfs", ".squashfs"),
}
DIRECTORY_RUNTIMES = ("charliecloud",)
# A directory is an image tree only with these (ch-run binds its own files onto them).
TREE_FILES = ("etc/passwd", "etc/group")
# Inspects the image at a path: a record for ``image info``, or None (not inspected).
Inspector = Callable[[str], Optional[Dict[str, Any]]]


@dataclass(frozen=True)
class ImageEntry:
    """One registered image."""

    alias: str
    path: str
    sha256: str  # a file's sha256, or a directory's tree digest
    bytes: int
    added_at: float
    kind: str = "serving"  # "serving" | "client": what the image is for
    format: str = ""  # "squashfs" | "sif" | "directory" ("" in version-1 entries)
    inspection: Optional[Dict[str, Any]] = field(default=None, compare=False)


def registry_path(workspace: Path) -> Path:
    """Where the workspace keeps its image registry."""
    return images_registry(workspace)


def image_format(entry: ImageEntry) -> str:
    """``squashfs``, ``sif`` or ``directory`` (version-1 entries: from the suffix)."""
    if entry.format:
        return entry.format
    suffix = PurePosixPath(entry.path).suffix
    if suffix not in SUFFIXES:
        return DIRECTORY
    return "sif" if suffix == ".sif" else "squashfs"


def _check_alias(alias: str) -> None:
    if not NAME.fullmatch(alias):
        raise InvalidInput(f"image alias {alias!r}: letters, digits, '.', '_', '-' only "
                           f"(max 64)")


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise InvalidInput(f"image kind {kind!r}: expected one of " + ", ".join(KINDS))


def _check_image_path(path: str) -> Path:
    pure = PurePosixPath(path)
    if not pure.is_absolute() or ".." in pure.parts or not SAFE_PATH.fullmatch(path):
        raise InvalidInput(f"image path {path!r}: must be an absolute path without '..' "
                           f"made of letters, digits and ._/+@,=-")
    real = Path(path)
    if real.is_dir():
        lacking = [name for name in TREE_FILES if not (real / name).is_file()]
        if lacking:
            raise InvalidInput(f"image directory {path}: not an image tree (no {lacking[0]}; "
                               "ch-run binds its own etc/passwd and etc/group onto them)")
        return real
    if pure.suffix not in SUFFIXES:
        raise InvalidInput(f"image path {path}: expected a sealed image file ("
                           + ", ".join(SUFFIXES) + ") or a charliecloud image directory")
    if not real.is_file():
        raise NotFound(f"image path {path}: no such file")
    return real


def _entry(alias: str, data: Any) -> ImageEntry:
    if not isinstance(data, dict):
        raise TypeError(f"entry {alias!r} is not an object")
    entry = ImageEntry(alias=alias, **data)
    checks = {"path": str, "sha256": str, "bytes": int, "added_at": (int, float),
              "kind": str, "format": str, "inspection": (dict, type(None))}
    for name, kind in checks.items():
        if not isinstance(getattr(entry, name), kind):
            raise TypeError(f"entry {alias!r}: {name} has the wrong type")
    return entry


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
        try:
            check_version(data.get("schema_version"), (1, SCHEMA_VERSION))
        except ValueError:
            raise ValueError(f"unsupported schema_version "
                             f"{quoted(data.get('schema_version'))}") from None
        return {alias: _entry(alias, entry) for alias, entry in data["images"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise InvalidInput(f"{path}: not a valid image registry ({err})") from err


def _save(workspace: Path, entries: Dict[str, ImageEntry]) -> None:
    images = {alias: {k: v for k, v in asdict(e).items() if k != "alias"}
              for alias, e in sorted(entries.items())}
    write_json_atomic(registry_path(workspace),
                      {"schema_version": SCHEMA_VERSION, "images": images})


@contextlib.contextmanager
def _locked(workspace: Path) -> Iterator[None]:
    workspace.mkdir(mode=0o700, parents=True, exist_ok=True)
    with locked(images_registry(workspace).with_suffix(".json.lock")):
        yield


def get(workspace: Path, alias: str) -> ImageEntry:
    """The entry of ``alias`` or NotFound."""
    entry = load(workspace).get(alias)
    if entry is None:
        raise NotFound(f"image {alias!r}: not registered", hint="see 'synthbatch image ls'")
    return entry


def digest(path: str, progress: Optional[Progress] = None) -> Tuple[str, int]:
    """``(digest, bytes)`` of an image; InvalidInput naming what cannot be read."""
    try:
        return image_digest(path, progress)
    except DigestError as err:
        raise InvalidInput(f"image path {path}: {err.strerror or err}") from err


def add(workspace: Path, alias: str, path: str, replace: bool = False,
        now: Optional[float] = None, kind: str = "serving",
        progress: Optional[Progress] = None,
        inspect: Optional[Inspector] = None) -> ImageEntry:
    """Hash ``path`` and register it as ``alias`` (Conflict if taken, unless ``replace``).

    The digest is computed while streaming (``progress(done, total)`` after each block),
    then ``inspect(path)`` runs (the image's Python and engines, when the runtime can run
    it here); only then is the registry locked and rewritten, once.
    """
    _check_alias(alias)
    _check_kind(kind)
    real = _check_image_path(path)
    if not replace and alias in load(workspace):  # fail before hashing gigabytes
        raise Conflict(f"image {alias!r}: already registered ({load(workspace)[alias].path})",
                       hint="pass --replace to pin the new file")
    sha, size = digest(str(real), progress)
    record = inspect(path) if inspect is not None else None
    with _locked(workspace):
        entries = load(workspace)
        if alias in entries and not replace:
            raise Conflict(f"image {alias!r}: already registered ({entries[alias].path})",
                           hint="pass --replace to pin the new file")
        entry = ImageEntry(alias=alias, path=path, sha256=sha, bytes=size,
                           added_at=time.time() if now is None else now, kind=kind,
                           format=DIRECTORY if real.is_dir() else
                           ("sif" if real.suffix == ".sif" else "squashfs"),
                           inspection=record)
        entries[alias] = entry
        _save(workspace, entries)
    return entry


def remove(workspace: Path, alias: str) -> ImageEntry:
    """Unregister ``alias`` (the image itself is left alone); NotFound if unknown."""
    with _locked(workspace):
        entries = load(workspace)
        if alias not in entries:
            raise NotFound(f"image {alias!r}: not registered", hint="see 'synthbatch image ls'")
        entry = entries.pop(alias)
        _save(workspace, entries)
    return entry


def verify(entry: ImageEntry, progress: Optional[Progress] = None) -> Optional[str]:
    """None if the image still has the pinned digest, else what is wrong."""
    path = Path(entry.path)
    if not (path.is_file() or path.is_dir()):
        return f"{entry.path}: no such file or directory"
    try:
        sha = image_digest(entry.path, progress)[0]
    except DigestError as err:
        return f"{entry.path}: {err.strerror or err}"
    if sha != entry.sha256:
        return f"{entry.path}: sha256 {sha} does not match the pinned {entry.sha256}"
    return None
