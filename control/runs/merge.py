"""Merge: the winners' files, verified, concatenated in shard order, written atomically.

Only ``winner.json`` files say what to read (a failed attempt's output is never touched).
Before any content is read every winner's files must exist with the sizes it names; while
the bytes stream into a private temp file next to the output each file is hashed, and the
temp file is renamed onto the output only when every digest matched. So the output path
only ever holds a complete, verified merge, and the bytes hashed are exactly the bytes
written (no window between a check and a later read): JSONL is copied in the kernel
(``copy_file_range``) and each chunk is hashed from the output file itself, where it
landed; where the kernel cannot copy between the files, through buffers that are hashed
and written from the same memory.

Every shard that cannot be merged is named with its reason, never only the first: no
winner, a damaged ``winner.json`` (``publish.load_winner``, the one verification every
reader uses), a file missing or of the wrong size, content that fails its digest. A plain
merge refuses naming them all; ``--allow-partial`` leaves them out (a digest failure found
while streaming discards the temp file and redoes the merge without that shard) and lists
them in the manifest: ``missing_shards`` (every shard left out) and ``bad_shards``
(``{"shard", "reason"}`` for those whose records or files are damaged).

Deterministic: the same winners give the same bytes and the same manifest (no
timestamps), so a rerun is byte-identical and two concurrent merges each write their own
temp file and rename the same content into place. Memory does not grow with the number of
records: JSONL is copied in 8 MiB chunks; parquet is converted one shard file at a time.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import mmap
import os
import secrets
import shutil
import stat
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Tuple

from synthbatch.agent_stdlib.candidate import DD_PROFILE, DROPPED
from synthbatch.agent_stdlib.contracts import WinnerRecord
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.publish import load_winner
from synthbatch.agent_stdlib.statefile import (
    StateError,
    ensure_dir,
    fsync_dir,
    read_bytes,
    read_json,
    refusal,
    write_bytes_atomic,
    write_json_atomic,
)
from synthbatch.control.errors import Conflict, InvalidInput, SynthbatchError
from synthbatch.control.runs.status.records import load_plan_view
from synthbatch.control.runs.store import load_plan

CHUNK = 1 << 20
# 2: the manifest names the digest of the output's files (``files_sha256``), not its own
MANIFEST_VERSION = 2
DEPTH = 4  # read buffers in flight while their blocks are hashed
FORMATS = ("jsonl", "parquet")
PARTIAL_HINT = ("wait, retry them (synthbatch retry), or pass --allow-partial to merge the "
                "others (the manifest names each shard left out, and why)")


@dataclass(frozen=True)
class Source:
    """One file of one winner: where it is and what the winner says it holds."""

    shard: int
    path: Path
    sha256: str
    size: int


def winners(layout: RunLayout, count: int
            ) -> Tuple[List[WinnerRecord], List[int], Dict[int, str]]:
    """The verified winners of shards ``0 .. count-1`` in order, the shards without one, and
    the shards whose ``winner.json`` is there but damaged (shard -> why)."""
    found, missing, bad = [], [], {}
    for index in range(count):
        try:
            winner = load_winner(layout, index)
        except StateError as err:
            bad[index] = str(err)
            continue
        if winner is None:
            missing.append(index)
        else:
            found.append(winner)
    return found, missing, bad


def sources(layout: RunLayout, found: List[WinnerRecord]
            ) -> Tuple[List[Source], Dict[int, str]]:
    """Every file to read, in shard order, and the shards a file of which is not there as
    the regular file of the size its winner names (shard -> why)."""
    out, bad = [], {}
    for winner in found:
        base = layout.attempt(winner.shard, winner.attempt).output
        files = [Source(winner.shard, base / e.path, e.sha256, e.bytes) for e in winner.files]
        why = next(filter(None, map(_unusable, files)), None)
        if why:
            bad[winner.shard] = why
        else:
            out.extend(files)
    return out, bad


def _unusable(source: Source) -> Optional[str]:
    """Why ``source`` is not the regular file of the size its winner names, or None."""
    try:
        info = os.lstat(source.path)
    except OSError as err:
        return f"{source.path}: {err.strerror}"
    if not stat.S_ISREG(info.st_mode) or info.st_size != source.size:
        return f"{source.path}: not the {source.size}-byte regular file its winner names"
    why = refusal(info)
    return f"{source.path}: {why}" if why else None


def left_out(run_id: str, missing: List[int], bad: Dict[int, str]) -> str:
    """One line naming every shard a merge cannot include, and why."""
    shown = ", ".join(str(i) for i in missing[:20])  # at most 20, then "and N more"
    shown += f" and {len(missing) - 20} more" if len(missing) > 20 else ""
    parts = [f"run {run_id}: shards without a winner: {shown}"] if missing else []
    parts += [f"shard {index}: {bad[index]}" for index in sorted(bad)]
    return "; ".join(parts)


def merge_run(layout: RunLayout, output: Optional[Path], allow_partial: bool,
              fmt: str = "jsonl", stats: bool = True) -> Dict[str, Any]:
    """Verify and merge every winner in shard order; write the manifest and the dataset
    card (``card.json``, ``README.md``) in ``merged/``; return the manifest.

    jsonl: one file, the winners' bytes. parquet: a folder of Parquet files with one
    schema (``control.runs.parquet``). ``stats=False`` leaves the card's column
    statistics out (a jsonl merge then reads no record: a pure copy).
    """
    if fmt not in FORMATS:
        raise InvalidInput(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    parquet = _parquet() if fmt == "parquet" else None
    plan = load_plan_view(layout)
    plan_bytes = read_bytes(layout.plan_json) or b""
    found, missing, bad = winners(layout, len(plan.shard_records))
    files, unusable = sources(layout, found)
    bad.update(unusable)
    if (missing or bad) and not allow_partial:
        raise Conflict(left_out(plan.run_id, missing, bad), hint=PARTIAL_HINT)
    target = output or layout.merged / DEFAULT_OUTPUT[fmt]
    ensure_dir(layout.merged)
    if not target.parent.is_dir():
        raise InvalidInput(f"--output {target}: {target.parent} is not a directory")
    known, judges = _known(layout) if parquet is not None or stats else (None, [])
    observed: Any = None
    parts: Optional[List[Dict[str, Any]]] = None
    schema = None
    while True:  # a shard whose content fails its digest is left out, and the rest redone
        try:
            if parquet is None:
                digest, size = _publish(target, functools.partial(_copy_jsonl, files))
            else:
                from synthbatch.control.runs.colstats import ColumnStats

                digest, size, (parts, schema, observed) = _publish(
                    target, functools.partial(
                        _write_parquet, parquet, files, known,
                        lambda: ColumnStats(judges) if stats else None), folder=True)
            break
        except Mismatches as err:
            bad.update(err.shards)
            if not allow_partial:
                raise Conflict(left_out(plan.run_id, missing, bad) + "; nothing was merged",
                               hint=PARTIAL_HINT) from err
            files = [f for f in files if f.shard not in bad]
    found = [w for w in found if w.shard not in bad]
    manifest = {
        "schema_version": MANIFEST_VERSION,
        "run_id": plan.run_id,
        "plan_sha256": hashlib.sha256(plan_bytes).hexdigest(),
        "format": fmt,
        "output": str(target),
        "files_sha256": digest,
        "bytes": size,
        "records": sum(w.records for w in found),
        "dropped": sum(w.dropped for w in found),  # given up on by the client (on_error)
        "dropped_files": dropped_files(layout, found),
        "complete": not missing and not bad,
        "missing_shards": sorted(missing + list(bad)),  # every shard left out
        "bad_shards": [{"shard": index, "reason": bad[index]} for index in sorted(bad)],
        "shards": [{"shard": w.shard, "attempt": w.attempt, "records": w.records,
                    "dropped": w.dropped, "result_sha256": w.result_sha256,
                    "files": [{"path": f.path, "sha256": f.sha256, "bytes": f.bytes,
                               "records": f.records} for f in w.files]} for w in found],
    }
    if parts is not None:
        manifest["parquet_files"] = parts
    where = layout.merged / "manifest.json"
    write_json_atomic(where, manifest)
    card = _write_card(layout, manifest, target, schema, observed, judges, stats)
    return {**manifest, "manifest": str(where), "card": card}


DEFAULT_OUTPUT = {"jsonl": "records.jsonl", "parquet": "data"}


def _known(layout: RunLayout) -> Tuple[Any, List[str]]:
    """The plan's record schema (built-in generator; None otherwise, or when the plan
    cannot be read in full) and its judge columns."""
    try:
        from synthbatch.control.runs.dataschema import known_schema

        plan = load_plan(layout)
    except (SynthbatchError, StateError, ImportError):
        return None, []
    judges = [c.name for c in plan.client.columns if c.type == "llm-judge"] \
        if plan.client is not None else []
    return known_schema(plan), judges


def _write_parquet(parquet: Any, files: List[Source], known: Any, stats: Callable[[], Any],
                   folder: Path) -> Tuple[str, int, Tuple[List[Dict[str, Any]], Any, Any]]:
    """The parquet files of ``files`` in ``folder``: their ``files_sha256``, total bytes,
    and (the files, the schema, the statistics); Mismatches when a source's bytes fail
    their digest."""
    parts, bad, schema, observed = parquet.write(files, folder, known, stats, _mismatch)
    if bad:
        raise Mismatches(bad)
    return (files_sha256([(p["sha256"], p["bytes"]) for p in parts]),
            sum(p["bytes"] for p in parts), (parts, schema, observed))


def dropped_files(layout: RunLayout, found: List[WinnerRecord]) -> List[Dict[str, Any]]:
    """Where each merged shard's dropped records are listed: ``{"shard", "records",
    "path"}`` per ``output/.dropped-*.jsonl`` of its winning attempt."""
    out = []
    for winner in found:
        if winner.dropped:
            base = layout.attempt(winner.shard, winner.attempt).output
            out.append({"shard": winner.shard, "records": winner.dropped,
                        "path": [str(base / n) for n in _named(base, DROPPED)]})
    return out


def _named(folder: Path, pattern: Any) -> List[str]:
    """The names in ``folder`` that ``pattern`` matches in full, sorted ([] when it cannot
    be listed)."""
    try:
        return sorted(n for n in os.listdir(folder) if pattern.fullmatch(n))
    except OSError:
        return []


def _write_card(layout: RunLayout, manifest: Dict[str, Any], target: Path, schema: Any,
                observed: Any, judges: List[str], stats: bool) -> Optional[str]:
    """``card.json`` and ``README.md`` in ``merged/`` (None when pyarrow is missing: the
    card's statistics and features need it)."""
    try:
        from synthbatch.control.runs import card as cards
        from synthbatch.control.runs.colstats import ColumnStats
        from synthbatch.control.runs.parquet import observe_jsonl
    except ImportError:
        return None
    summary: Dict[str, Any] = {}
    if observed is not None:
        summary = observed.summary()
    elif stats and manifest["format"] == "jsonl":
        counter = ColumnStats(judges)
        summary = {"note": observe_jsonl(target, counter.add), **counter.summary()}
    try:
        relative = target.relative_to(layout.merged).as_posix()
    except ValueError:
        relative = str(target)
    data_files = f"{relative}/*.parquet" if manifest["format"] == "parquet" else relative
    data = cards.card_data(layout, manifest, summary, schema, data_files,
                           dd_profiles(layout, manifest))
    write_json_atomic(layout.merged / "card.json", data)
    text = cards.render(data).encode("utf-8")
    write_bytes_atomic(layout.merged / "README.md", text)
    return str(layout.merged / "README.md")


def dd_profiles(layout: RunLayout, manifest: Dict[str, Any]) -> Dict[int, Any]:
    """Data Designer's own profile of each merged shard (``output/.dd-profile-*.json``,
    written by the adapter; not part of the verified result): shard -> the profile, or
    ``{"error": why}`` when it is there but unreadable."""
    found: Dict[int, Any] = {}
    for entry in manifest["shards"]:
        base = layout.attempt(entry["shard"], entry["attempt"]).output
        for name in _named(base, DD_PROFILE)[:1]:
            try:
                found[entry["shard"]] = read_json(base / name)
            except (StateError, OSError, ValueError) as err:
                found[entry["shard"]] = {"error": f"{base / name}: {err}"}
    return found


def files_sha256(files: List[Tuple[str, int]]) -> str:
    """The digest a jsonl merge's manifest gives its output: sha256 of one line
    ``<sha256> <bytes>`` per merged file (as its winner records them), in output order.

    The output is exactly those files, each followed by a newline when it does not end
    with one, so it can be checked piece by piece (``verify_jsonl``) without the merge
    hashing every byte a second time.
    """
    return hashlib.sha256("".join(f"{digest} {size}\n" for digest, size in files)
                          .encode("ascii")).hexdigest()


def verify_jsonl(output: Path, manifest: Dict[str, Any]) -> Optional[str]:
    """None when the jsonl ``output`` is what ``manifest`` says it is, else why not.

    Walks the manifest's files in order: each one's bytes must have its sha256, followed
    by the newline the merge adds when a file does not end with one; nothing may follow
    the last; and ``files_sha256`` must be the digest of that list.
    """
    files = [(f["sha256"], f["bytes"]) for shard in manifest["shards"] for f in shard["files"]]
    if files_sha256(files) != manifest.get("files_sha256"):
        return "files_sha256 is not the digest of the manifest's files"
    with open(output, "rb") as handle:
        for number, (digest, size) in enumerate(files):
            check, left, last = hashlib.sha256(), size, b"\n"
            while left:
                block = handle.read(min(left, CHUNK))
                if not block:
                    return f"file {number}: the output ends early"
                check.update(block)
                left -= len(block)
                last = block[-1:]
            if check.hexdigest() != digest:
                return f"file {number}: its bytes do not match their sha256"
            if last != b"\n" and handle.read(1) != b"\n":
                return f"file {number}: not followed by the newline the merge adds"
        if handle.read(1):
            return "the output goes on after the last file"
    return None


def _publish(target: Path, write: Callable[[Any], Any], folder: bool = False) -> Any:
    """Run ``write`` into a private temp file beside ``target``, fsync, rename onto it;
    ``folder``: a temp folder, put in ``target``'s place (an earlier folder there is moved
    aside first, then removed). ``write``'s result."""
    temp = target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp"
    try:
        if folder:
            os.mkdir(temp, 0o700)
            result = write(temp)
            fsync_dir(temp)
            old = target.parent / f".{target.name}.{secrets.token_hex(6)}.old"
            if target.exists() or target.is_symlink():
                if target.is_symlink() or not target.is_dir():
                    raise InvalidInput(f"--output {target}: a parquet merge writes a folder; "
                                       "this is a file")
                os.rename(target, old)  # moved aside; removed once the new one is in place
            os.rename(temp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            with open(temp, "xb+") as handle:  # readable too: the jsonl copy hashes its output
                result = write(handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, target)
    except BaseException:
        if folder:
            shutil.rmtree(temp, ignore_errors=True)
        else:
            temp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)
    return result


class Mismatches(Conflict):
    """Files whose bytes did not match their winner's digests (shard -> why); the output
    was not published."""

    def __init__(self, shards: Dict[int, str]) -> None:
        super().__init__("; ".join(f"shard {s}: {why}" for s, why in sorted(shards.items())))
        self.shards = shards


def _mismatch(source: Source) -> str:
    return f"{source.path}: content does not match its winner's digest"


COPY_CHUNK = 8 << 20  # bytes per copy_file_range call, hashed while the next is copied
COPY_DEPTH = 3  # copied chunks in flight while their bytes are hashed
NO_COPY_RANGE = (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF)


def _copy_jsonl(files: List[Source], out: BinaryIO, kernel: bool = True) -> Tuple[str, int]:
    """Copy every file in order (a file without a final newline gets one); return
    ``files_sha256`` of the files and the output's size (the module docstring). Each chunk
    is hashed once, against its file's digest, while the next is copied: files alternate
    between two threads (hashlib releases the GIL), a file's chunks in order on its thread.

    ``kernel``: ``copy_file_range``, each chunk hashed in the output (``mmap`` of its page
    cache); when its first call fails as the kernel cannot copy between these files
    (another filesystem, NFS < 4.2), nothing was written and the copy goes on through
    buffers: each 1 MiB block read into one of ``DEPTH`` buffers, written and hashed from
    there; a buffer is reused only after the hash of its previous block.
    """
    fd, size, checks, blocks = out.fileno(), 0, [], 0
    inflight: List[Tuple[Optional[mmap.mmap], Future]] = []
    slots: List[bytearray] = []

    def settle(limit: int) -> None:
        while len(inflight) > limit:
            mapped, future = inflight.pop(0)
            wait([future])
            if mapped is not None:
                mapped.close()
            future.result()

    with ThreadPoolExecutor(1) as even, ThreadPoolExecutor(1) as odd:
        try:
            for number, source in enumerate(files):
                digest, read, last = hashlib.sha256(), 0, 10
                pool = odd if number % 2 else even
                with open(source.path, "rb") as handle:
                    while True:
                        mapped: Optional[mmap.mmap] = None
                        if kernel:
                            try:
                                n = os.copy_file_range(handle.fileno(), fd, COPY_CHUNK)
                            except OSError as err:
                                if size or err.errno not in NO_COPY_RANGE:
                                    raise
                                kernel = False  # nothing copied yet: through buffers
                                continue
                            if not n:
                                break
                            base = size - size % mmap.ALLOCATIONGRANULARITY
                            mapped = mmap.mmap(fd, size + n - base, offset=base,
                                               access=mmap.ACCESS_READ)
                            view = memoryview(mapped)[size - base:]
                            settle(COPY_DEPTH - 1)
                        else:
                            settle(DEPTH - 1)  # the oldest in flight used this buffer
                            slots = slots or [bytearray(CHUNK) for _ in range(DEPTH)]
                            slot = slots[blocks % DEPTH]
                            n = handle.readinto(slot)
                            if not n:
                                break
                            view = memoryview(slot)[:n]
                            out.write(view)
                            blocks += 1
                        last = view[-1]
                        inflight.append((mapped, pool.submit(_hash, digest, view)))
                        read, size = read + n, size + n
                checks.append((source, pool.submit(digest.hexdigest), read))
                if last != 10:
                    if kernel:
                        os.write(fd, b"\n")
                    else:
                        out.write(b"\n")
                    size += 1
        finally:
            settle(0)
        return _verdict(checks), size


def _verdict(checks: List[Tuple[Source, Future, int]]) -> str:
    """``files_sha256`` of the merged files, or Mismatches naming each that failed."""
    bad = {source.shard: _mismatch(source) for source, digest, read in checks
           if read != source.size or digest.result() != source.sha256}
    if bad:
        raise Mismatches(bad)
    return files_sha256([(source.sha256, source.size) for source, _, _ in checks])


def _hash(digest: Any, view: memoryview) -> None:
    """Hash ``view`` (a view of a mapped chunk or a buffer, one per thread) and let go of
    it: a map can only be closed once no view of it is left."""
    try:
        digest.update(view)
    finally:
        view.release()


def _parquet() -> Any:
    """The parquet writer's module; InvalidInput with the install hint when pyarrow is
    missing (it is a dependency of the control plane: only a broken install lacks it)."""
    try:
        import pyarrow  # noqa: F401 - the one import that can be missing

        from synthbatch.control.runs import parquet
    except ImportError as err:
        raise InvalidInput(f"--format parquet needs pyarrow, which cannot be imported "
                           f"({err})", hint="pip install 'pyarrow>=14' into synthbatch's "
                                            "environment (a dependency of synthbatch), or "
                                            "merge as jsonl") from err
    return parquet
