"""sha256 of container images, remembered per run so array tasks do not re-hash them.

Hashing a multi-GB image takes tens of seconds, and every array task of a run checks the
same files. The first task that hashes an image records the digest in
``<run>/image-hashes/<key>.json`` together with the file's identity and change stamps
(device, inode, size, mtime_ns, ctime_ns); a later task reuses the digest only when all of
them still match. ``ctime`` cannot be set back by a user, so a file rewritten in place,
replaced, or touched back to its old mtime is hashed again.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Dict, Optional

from agent_stdlib.statefile import StateError, ensure_dir, read_json, write_json_atomic

HASH_BLOCK = 1 << 20
STAMP_FIELDS = ("dev", "ino", "size", "mtime_ns", "ctime_ns")


def file_sha256(path: str) -> str:
    """Hex sha256 of a file, streamed."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(HASH_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def stamp(path: str) -> Dict[str, Any]:
    """The identity and change stamps of ``path`` (follows symlinks, like reading does)."""
    st = os.stat(path)
    return {"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def record_path(cache: Path, path: str) -> Path:
    """The cache record of the image at ``path``."""
    return cache / f"{hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:32]}.json"


def cached_sha256(path: str, cache: Optional[Path]) -> str:
    """The image's sha256: from the run's cache when the file is unchanged, else hashed
    (and recorded; a cache that cannot be written is not an error)."""
    if cache is None:
        return file_sha256(path)
    before = stamp(path)
    where = record_path(cache, path)
    try:
        known = read_json(where)
    except StateError:
        known = None
    if known is not None and known.get("path") == os.path.abspath(path) \
            and all(known.get(k) == before[k] for k in STAMP_FIELDS) \
            and isinstance(known.get("sha256"), str):
        return str(known["sha256"])
    digest = file_sha256(path)
    if stamp(path) == before:  # not changed while it was read
        try:
            ensure_dir(cache)
            write_json_atomic(where, {"path": os.path.abspath(path), **before, "sha256": digest})
        except (OSError, StateError):
            pass
    return digest
