"""Candidate validation: what the client left in ``output/`` becomes a result manifest.

Every regular file of ``output/`` whose name does not start with a dot is a JSONL file of
records. A client that gives up on some records (the built-in generator with
``on_error = "drop"``) lists their indices in ``output/.dropped-*.jsonl`` (one JSON object
with an integer ``index`` a line): those count towards the shard's records, so a dropped
record is accounted for and never silently missing, but are not records of the result.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from pathlib import Path
from typing import List, Set, Tuple

from .contracts import FileEntry, ResultManifest
from .errors import AgentError
from .statefile import refusal

DROPPED = re.compile(r"\.dropped-[A-Za-z0-9_.-]*\.jsonl")


def dropped_name(stem: str) -> str:
    """The file name under ``output/`` that lists dropped records (``stem``: letters,
    digits, ``._-``)."""
    name = f".dropped-{stem}.jsonl"
    assert DROPPED.fullmatch(name), name
    return name


# Data Designer's own profile of a shard (the ``dd`` role writes it; merge puts it in the
# dataset card). A dot file: not a record file, not part of the verified result.
DD_PROFILE = re.compile(r"\.dd-profile-[0-9]+\.json")


def dd_profile_name(offset: int) -> str:
    """The file name under ``output/`` of the profile of the shard at ``offset``."""
    return f".dd-profile-{offset:012d}.json"


class CandidateError(AgentError):
    """The client's output is not an acceptable result for the shard."""


def _is_record(line: bytes, rel: str, number: int) -> bool:
    """True for a JSON record, False for a blank line; CandidateError naming file:line else."""
    if not line.strip():
        return False
    try:
        json.loads(line)
    except ValueError as err:
        raise CandidateError(f"{rel}:{number}: not a JSON record ({err})") from err
    return True


def _scan_file(path: Path, rel: str) -> FileEntry:
    digest = hashlib.sha256()
    size = records = 0
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            digest.update(line)
            size += len(line)
            records += _is_record(line, rel, number)
    return FileEntry(path=rel, sha256=digest.hexdigest(), bytes=size, records=records)


def _walk(output: Path) -> List[Tuple[Path, str]]:
    found: List[Tuple[Path, str]] = []
    for dirpath, dirnames, filenames in os.walk(output, followlinks=False):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(output).as_posix()
            info = os.lstat(path)
            mode = info.st_mode
            if stat.S_ISLNK(mode):
                raise CandidateError(f"output/{rel}: symlinks are not allowed in output")
            why = None if stat.S_ISDIR(mode) else refusal(info)
            if why:
                raise CandidateError(f"output/{rel}: {why}")
            if stat.S_ISREG(mode) and not name.startswith("."):
                found.append((path, rel))
    return sorted(found, key=lambda item: item[1])


def scan_output(output: Path) -> Tuple[FileEntry, ...]:
    """Every regular file of ``output`` with its digest, size and JSONL record count."""
    if not output.is_dir() or output.is_symlink():
        raise CandidateError("output/: missing or not a directory")
    return tuple(_scan_file(path, rel) for path, rel in _walk(output))


def _complete_records(path: Path, rel: str) -> int:
    records = 0
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.endswith(b"\n"):
                break  # a torn last line: the client was stopped while writing it
            records += _is_record(line, rel, number)
    return records


def count_records(output: Path) -> int:
    """Complete records the client left in ``output`` (a partial result), dropped ones
    included.

    A torn last line (no newline: the client was killed mid-write) is not counted and does
    not make the output unusable; a malformed complete line raises CandidateError.
    """
    if not output.is_dir() or output.is_symlink():
        raise CandidateError("output/: missing or not a directory")
    return sum(_complete_records(path, rel) for path, rel in _walk(output)) + \
        len(dropped_indices(output))


def dropped_indices(output: Path) -> Set[int]:
    """The record indices ``output/.dropped-*.jsonl`` lists (complete lines only)."""
    found: Set[int] = set()
    for name in sorted(os.listdir(output)):
        path = output / name
        if not DROPPED.fullmatch(name):
            continue
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode):
            continue
        if refusal(info):
            raise CandidateError(f"output/{name}: {refusal(info)}")
        with open(path, "rb") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.endswith(b"\n"):
                    break
                try:
                    index = json.loads(line).get("index")
                except (ValueError, AttributeError) as err:
                    raise CandidateError(f"output/{name}:{number}: not a dropped-record "
                                         f"line") from err
                if not isinstance(index, int) or isinstance(index, bool):
                    raise CandidateError(f"output/{name}:{number}: no integer index")
                found.add(index)
    return found


def build_manifest(output: Path, shard: int, attempt: int, expected: int) -> ResultManifest:
    """Scan ``output`` (JSONL files), check the record count, return the manifest."""
    files = scan_output(output)
    total = sum(f.records for f in files)
    dropped = len(dropped_indices(output))
    if total + dropped != expected:
        held = f"{total} records" + (f" and {dropped} dropped" if dropped else "")
        raise CandidateError(f"output/ holds {held}, the shard needs {expected}")
    return ResultManifest(shard=shard, attempt=attempt, records=total, files=files,
                          created_at=time.time(), dropped=dropped)


def verify_files(output: Path, files: Tuple[FileEntry, ...]) -> None:
    """Re-hash every file of a manifest; raise CandidateError on the first mismatch."""
    for entry in files:
        path = output / entry.path
        try:
            info = os.lstat(path)
        except OSError:
            info = None
        if info is None or not stat.S_ISREG(info.st_mode):
            raise CandidateError(f"{path}: missing or not a regular file")
        if refusal(info):
            raise CandidateError(f"{path}: {refusal(info)}")
        digest = hashlib.sha256()
        size = 0
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
                size += len(block)
        if digest.hexdigest() != entry.sha256 or size != entry.bytes:
            raise CandidateError(f"{path}: content does not match its manifest digest")
