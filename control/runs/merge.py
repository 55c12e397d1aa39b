"""Merge: the winners' files, verified, concatenated in shard order, written atomically.

Only ``winner.json`` files say what to read (a failed attempt's output is never touched).
Before any content is read every winner's files must exist with the sizes it names; while
the bytes stream into a private temp file next to the output each file is hashed, and the
temp file is renamed onto the output only when every digest matched. So the output path
only ever holds a complete, verified merge, and the bytes hashed are exactly the bytes
written (no window between a check and a later read).

Deterministic: the same winners give the same bytes and the same manifest (no
timestamps), so a rerun is byte-identical and two concurrent merges each write their own
temp file and rename the same content into place. Memory does not grow with the number of
records: JSONL is copied in 1 MiB blocks; parquet is converted one shard file at a time.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Tuple

from agent_stdlib.contracts import WinnerRecord
from agent_stdlib.layout import RunLayout
from agent_stdlib.statefile import (
    StateError,
    ensure_dir,
    load_record,
    read_bytes,
    write_json_atomic,
)
from control.errors import Conflict, InvalidInput
from control.runs.store import load_plan_view

CHUNK = 1 << 20
DEPTH = 4  # read buffers in flight while their blocks are hashed
FORMATS = ("jsonl", "parquet")


@dataclass(frozen=True)
class Source:
    """One file of one winner: where it is and what the winner says it holds."""

    shard: int
    path: Path
    sha256: str
    size: int


def winners(layout: RunLayout, count: int) -> Tuple[List[WinnerRecord], List[int]]:
    """The winners of shards ``0 .. count-1`` in order, and the shards without one."""
    found, missing = [], []
    for index in range(count):
        try:
            winner = load_record(layout.winner_json(index), WinnerRecord)
        except StateError as err:
            raise Conflict(f"shard {index}: {err}") from err
        if winner is None:
            missing.append(index)
        elif winner.shard != index:
            raise Conflict(f"{layout.winner_json(index)}: names shard {winner.shard}")
        else:
            found.append(winner)
    return found, missing


def shard_list(indices: List[int], limit: int = 20) -> str:
    """``1, 4, 7`` (at most ``limit`` shown, then ``and N more``)."""
    shown = ", ".join(str(i) for i in indices[:limit])
    return shown + (f" and {len(indices) - limit} more" if len(indices) > limit else "")


def sources(layout: RunLayout, found: List[WinnerRecord]) -> List[Source]:
    """Every file to read, in shard order; Conflict unless each exists with its size."""
    out = []
    for winner in found:
        base = layout.attempt(winner.shard, winner.attempt).output
        for entry in winner.files:
            path = base / entry.path
            try:
                info = os.lstat(path)
            except OSError as err:
                raise Conflict(f"shard {winner.shard}: {path}: {err.strerror}") from err
            if not path.is_file() or path.is_symlink() or info.st_size != entry.bytes:
                raise Conflict(f"shard {winner.shard}: {path}: not the {entry.bytes}-byte "
                               "regular file its winner names")
            out.append(Source(winner.shard, path, entry.sha256, entry.bytes))
    return out


def merge_run(layout: RunLayout, output: Optional[Path], allow_partial: bool,
              fmt: str = "jsonl") -> Dict[str, Any]:
    """Verify and concatenate every winner in shard order; return the merge manifest."""
    if fmt not in FORMATS:
        raise InvalidInput(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    writer: Writer = _parquet_writer() if fmt == "parquet" else _write_jsonl
    plan = load_plan_view(layout)
    plan_bytes = read_bytes(layout.plan_json) or b""
    found, missing = winners(layout, len(plan.shard_records))
    if missing and not allow_partial:
        raise Conflict(f"run {plan.run_id}: shards without a winner: {shard_list(missing)}",
                       hint="wait, retry them (synthbatch retry), or pass --allow-partial")
    files = sources(layout, found)
    target = output or layout.merged / f"records.{fmt}"
    ensure_dir(layout.merged)
    if not target.parent.is_dir():
        raise InvalidInput(f"--output {target}: {target.parent} is not a directory")
    digest, size = _publish(target, lambda handle: writer(files, handle))
    manifest = {
        "schema_version": 1,
        "run_id": plan.run_id,
        "plan_sha256": hashlib.sha256(plan_bytes).hexdigest(),
        "format": fmt,
        "output": str(target),
        "sha256": digest,
        "bytes": size,
        "records": sum(w.records for w in found),
        "complete": not missing,
        "missing_shards": missing,
        "shards": [{"shard": w.shard, "attempt": w.attempt, "records": w.records,
                    "result_sha256": w.result_sha256,
                    "files": [{"path": f.path, "sha256": f.sha256, "bytes": f.bytes,
                               "records": f.records} for f in w.files]} for w in found],
    }
    where = layout.merged / "manifest.json"
    write_json_atomic(where, manifest)
    return {**manifest, "manifest": str(where)}


class _Hashing:
    """A binary file wrapper that hashes and counts everything written through it."""

    closed = False

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        """Hash, count and write ``data``."""
        self.digest.update(data)
        self.size += len(data)
        return self.handle.write(data)

    def tell(self) -> int:
        """Bytes written so far (file-like, for pyarrow)."""
        return self.size

    def flush(self) -> None:
        """Flush the underlying file."""
        self.handle.flush()


Writer = Callable[[List[Source], BinaryIO], Tuple[str, int]]


def _publish(target: Path, write: Callable[[BinaryIO], Tuple[str, int]]) -> Tuple[str, int]:
    """Run ``write`` into a private temp file beside ``target``, fsync, rename onto it."""
    temp = target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp"
    try:
        with open(temp, "xb") as handle:
            digest, size = write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return digest, size


def _mismatch(source: Source) -> Conflict:
    return Conflict(f"shard {source.shard}: {source.path}: content does not match its "
                    "winner's digest; nothing was merged")


def _write_jsonl(files: List[Source], out: BinaryIO) -> Tuple[str, int]:
    """Copy every file in order (a file without a final newline gets one); return the
    output's sha256 and size.

    Each 1 MiB block is read once into one of ``DEPTH`` buffers and written from there;
    two single-thread pools hash it (the file's digest, the output's digest) in order
    while the next block is read (hashlib releases the GIL), so hashing overlaps I/O. A
    buffer is reused only after both hashes of its previous block are done.
    """
    slots = [bytearray(CHUNK) for _ in range(DEPTH)]
    busy: List[List[Future]] = [[] for _ in range(DEPTH)]
    whole, size, slot = hashlib.sha256(), 0, 0
    checks: List[Tuple[Source, Future, int]] = []
    with ThreadPoolExecutor(1) as per_file, ThreadPoolExecutor(1) as output:
        for source in files:
            digest, read, last = hashlib.sha256(), 0, 10
            with open(source.path, "rb") as handle:
                while True:
                    for future in busy[slot]:
                        future.result()
                    n = handle.readinto(slots[slot])
                    if not n:
                        break
                    view = memoryview(slots[slot])[:n]
                    out.write(view)
                    busy[slot] = [per_file.submit(digest.update, view),
                                  output.submit(whole.update, view)]
                    read, size, last = read + n, size + n, view[-1]
                    slot = (slot + 1) % DEPTH
            checks.append((source, per_file.submit(digest.hexdigest), read))
            if last != 10:
                out.write(b"\n")
                output.submit(whole.update, b"\n")
                size += 1
            while checks and checks[0][1].done():
                _check(*checks.pop(0))
        for check in checks:
            _check(*check)
        return output.submit(whole.hexdigest).result(), size


def _check(source: Source, digest: Future, read: int) -> None:
    if read != source.size or digest.result() != source.sha256:
        raise _mismatch(source)


def _verified_bytes(source: Source) -> bytes:
    with open(source.path, "rb") as handle:
        data = handle.read()
    if len(data) != source.size or hashlib.sha256(data).hexdigest() != source.sha256:
        raise _mismatch(source)
    return data


def _parquet_writer() -> Writer:
    """The parquet writer; InvalidInput with the install hint when pyarrow is missing."""
    try:
        import pyarrow as pa
        import pyarrow.json as pa_json
        import pyarrow.parquet as pq
    except ImportError as err:
        raise InvalidInput("--format parquet needs pyarrow, which is not installed",
                           hint="pip install 'synthbatch[parquet]' (or pip install "
                                "'pyarrow>=14'), or merge as jsonl") from err

    def write(files: List[Source], handle: BinaryIO) -> Tuple[str, int]:
        out = _Hashing(handle)
        writer = None
        schema = None
        try:
            for source in files:
                data = _verified_bytes(source)
                if not data.strip():
                    continue
                options = pa_json.ParseOptions(explicit_schema=schema,
                                               unexpected_field_behavior="error") \
                    if schema is not None else None
                try:
                    table = pa_json.read_json(pa.BufferReader(data), parse_options=options)
                except pa.ArrowInvalid as err:
                    raise Conflict(f"shard {source.shard}: {source.path}: cannot be "
                                   f"converted to parquet: {err}") from err
                if writer is None:
                    schema = table.schema
                    writer = pq.ParquetWriter(pa.PythonFile(out, mode="w"), schema)
                writer.write_table(table.cast(schema))
        finally:
            if writer is not None:
                writer.close()
        return out.digest.hexdigest(), out.size

    return write
