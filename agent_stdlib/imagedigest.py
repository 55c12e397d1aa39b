"""The digest of a sealed image: one rule for ``image add`` and for preflight.

An image is a file (SquashFS, SIF) or, for charliecloud, a directory (an unpacked image
tree). Its digest is 64 hex digits either way:

* a **file**: the sha256 of its bytes (what ``sha256sum`` prints);
* a **directory**: the *tree digest*, the sha256 of one record per entry below the
  directory, in a fixed order, so the same tree always gives the same digest wherever it
  was copied to and whoever owns it::

      sha256( b"synthbatch-tree-v1\\0" + record + record + ... )
      record = kind NUL path NUL detail NUL

  ``path`` is the entry's path relative to the directory, ``/``-separated, as bytes; the
  entries are visited depth first, names in byte order, and symlinks are never followed.
  ``kind`` and ``detail`` are ``d`` and the permission bits (octal) for a directory,
  ``f`` and ``<perm>:<sha256 of the content>`` for a regular file, ``l`` and the link's
  target for a symlink, ``c``/``b`` and ``<perm>:<major>,<minor>`` for a device, ``p``
  (fifo) and ``s`` (socket) and the permission bits. Owners, groups and times are not part
  of it (an unprivileged copy changes them, not the image); a change of any content, name,
  link target, type or permission bit changes the digest.

Standard library only (runs inside the agent on Python 3.9).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

BLOCK = 1 << 20
TREE_MAGIC = b"synthbatch-tree-v1\0"
# Progress callback: (bytes hashed so far, total bytes to hash).
Progress = Callable[[int, int], None]


class DigestError(OSError):
    """An image (or an entry of an image directory) that cannot be read."""


@dataclass(frozen=True)
class Entry:
    """One entry below an image directory, as ``lstat`` saw it."""

    path: bytes  # relative, "/"-separated
    full: bytes  # absolute path on this machine
    st: os.stat_result


def file_sha256(path: str, progress: Optional[Progress] = None, done: int = 0,
                total: int = 0) -> str:
    """Hex sha256 of a file, streamed in 1 MiB blocks (``progress`` after each block)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(BLOCK), b""):
                digest.update(block)
                done += len(block)
                if progress is not None:
                    progress(done, total)
    except OSError as err:
        raise DigestError(err.errno, f"cannot read {os.fsdecode(path)}: "
                                     f"{err.strerror or err}") from err
    return digest.hexdigest()


def walk(root: str) -> List[Entry]:
    """Every entry below ``root`` in digest order (depth first, names in byte order)."""
    base = os.fsencode(root)
    out: List[Entry] = []

    def visit(rel: bytes, full: bytes) -> None:
        try:
            names = sorted(os.listdir(full))
        except OSError as err:
            raise DigestError(err.errno, f"cannot list {os.fsdecode(full)}: "
                                         f"{err.strerror or err}") from err
        for name in names:
            child_rel = rel + b"/" + name if rel else name
            child = full + b"/" + name
            try:
                st = os.lstat(child)
            except OSError as err:
                raise DigestError(err.errno, f"cannot read {os.fsdecode(child)}: "
                                             f"{err.strerror or err}") from err
            out.append(Entry(child_rel, child, st))
            if stat.S_ISDIR(st.st_mode):
                visit(child_rel, child)

    visit(b"", base.rstrip(b"/") or b"/")
    return out


def _record(entry: Entry, progress: Optional[Progress], done: int, total: int) -> bytes:
    mode = entry.st.st_mode
    perm = b"%o" % stat.S_IMODE(mode)
    if stat.S_ISDIR(mode):
        kind, detail = b"d", perm
    elif stat.S_ISREG(mode):
        content = file_sha256(os.fsdecode(entry.full), progress, done, total)
        kind, detail = b"f", perm + b":" + content.encode("ascii")
    elif stat.S_ISLNK(mode):
        kind, detail = b"l", os.readlink(entry.full)
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        kind = b"c" if stat.S_ISCHR(mode) else b"b"
        dev = entry.st.st_rdev
        detail = perm + b":%d,%d" % (os.major(dev), os.minor(dev))
    else:
        kind, detail = (b"p" if stat.S_ISFIFO(mode) else b"s"), perm
    return kind + b"\0" + entry.path + b"\0" + detail + b"\0"


def tree_digest(root: str, progress: Optional[Progress] = None) -> Tuple[str, int]:
    """The tree digest of the directory ``root`` and the bytes of its regular files."""
    entries = walk(root)
    total = sum(e.st.st_size for e in entries if stat.S_ISREG(e.st.st_mode))
    digest = hashlib.sha256(TREE_MAGIC)
    done = 0
    for entry in entries:
        digest.update(_record(entry, progress, done, total))
        if stat.S_ISREG(entry.st.st_mode):
            done += entry.st.st_size
    return digest.hexdigest(), total


def image_digest(path: str, progress: Optional[Progress] = None) -> Tuple[str, int]:
    """``(digest, bytes)`` of the image at ``path``: a file's sha256, a directory's tree
    digest (see the module docstring). Raises DigestError when something cannot be read."""
    try:
        st = os.stat(path)
    except OSError as err:
        raise DigestError(err.errno, f"cannot read {path}: {err.strerror or err}") from err
    if stat.S_ISDIR(st.st_mode):
        return tree_digest(path, progress)
    return file_sha256(path, progress, 0, st.st_size), st.st_size


def tree_stamp(root: str) -> str:
    """A digest of every entry's identity and change stamps below ``root`` (no content
    read): equal stamps mean nothing below was replaced, rewritten or touched."""
    digest = hashlib.sha256()
    for entry in walk(root):
        st = entry.st
        digest.update(b"%s\0%d %d %d %d %d %d\0" % (entry.path, st.st_mode, st.st_dev,
                                                  st.st_ino, st.st_size, st.st_mtime_ns,
                                                  st.st_ctime_ns))
    return digest.hexdigest()
