"""Image digests, remembered per run so array tasks do not re-hash them.

Hashing a multi-GB image takes tens of seconds, and every array task of a run checks the
same images. The first task that hashes an image (:func:`agent_stdlib.imagedigest.image_digest`:
a file's sha256, a directory's tree digest) records the digest in
``<run>/image-hashes/<key>.json`` together with the image's identity and change stamps
(device, inode, size, mtime_ns, ctime_ns; for a directory also :func:`tree_stamp`, the
same stamps of every entry below it); a later task reuses the digest only when all of
them still match. ``ctime`` cannot be set back by a user, so an image rewritten in place,
replaced, or touched back to its old mtime is hashed again.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any, Dict, Optional

from ..imagedigest import image_digest, tree_stamp
from ..statefile import StateError, ensure_dir, read_json, write_json_atomic


def stamp(path: str) -> Dict[str, Any]:
    """The identity and change stamps of ``path`` (follows symlinks, like reading does);
    a directory's also cover every entry below it (``tree``)."""
    st = os.stat(path)
    out: Dict[str, Any] = {"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size,
                           "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}
    if stat.S_ISDIR(st.st_mode):
        out["tree"] = tree_stamp(path)
    return out


def record_path(cache: Path, path: str) -> Path:
    """The cache record of the image at ``path``."""
    return cache / f"{hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:32]}.json"


def cached_sha256(path: str, cache: Optional[Path]) -> str:
    """The image's digest: from the run's cache when the image is unchanged, else hashed
    (and recorded; a cache that cannot be written is not an error)."""
    if cache is None:
        return image_digest(path)[0]
    before = stamp(path)
    where = record_path(cache, path)
    try:
        known = read_json(where)
    except StateError:
        known = None
    if known is not None and known.get("path") == os.path.abspath(path) \
            and all(known.get(k) == v for k, v in before.items()) \
            and isinstance(known.get("sha256"), str):
        return str(known["sha256"])
    digest = image_digest(path)[0]
    if stamp(path) == before:  # not changed while it was read
        try:
            ensure_dir(cache)
            write_json_atomic(where, {"path": os.path.abspath(path), **before, "sha256": digest})
        except (OSError, StateError):
            pass
    return digest
