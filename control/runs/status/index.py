"""The settled index: the rows status has verified for shards that can no longer change.

``<run>/observer/settled.json`` keeps, per settled shard, its ``ShardRow`` (a verified
winner, or a ``failed``/``cancelled`` attempt older than the window in which Slurm's word
is still added to it, read without a problem in any of its records). Those records are
immutable (``winner.json`` is published once, terminal attempts never move), so a status
of a run whose shards are all settled reads this one file instead of two or three per
shard. The index also keeps the plan's shape, keyed by ``plan.json``'s identity (device,
inode, size, mtime, ctime), so a large plan is not decoded on every refresh.

Only ``retry`` makes a settled shard change (a new attempt after a failed or cancelled
one); ``cancel`` acts on open shards only, and wraps its writes the same way as a guard.
Every writer holds ``observer/settled.lock`` (``statefile.locked``) while it reads,
merges and replaces the file (temp + fsync + rename):

* an invalidator (``changing``) removes the shards' rows and marks them ``pending``,
  does its work, then moves them from ``pending`` to ``invalidated`` at a new
  ``generation``; it holds the lock the whole time;
* status reads the index without the lock and never uses the row of a ``pending`` shard.
  After reading the other shards it adds the newly settled ones under the lock
  (non-blocking: while another writer holds it, this refresh writes nothing), dropping
  every shard invalidated after the generation it read, and every pending one. A pending
  mark left by a writer that died (status holds the lock, so none is at work) becomes an
  invalidation then.

So a writer only ever adds rows it verified itself to what the latest index holds: two
status processes never lose each other's rows, and no row verified before a retry created
its attempt survives it. The index is derived data: a missing one is built by the next
status; a damaged one, one in an older format, or one of another run or run directory is
not used, named once in the notes and rebuilt from the records.

Format (JSON lines): a header line (the fields above, the run's facts, and what lets a
status of a run whose every shard is settled read nothing else: which shards have a row
(``shards``, as ranges), the rows' state codes, the sums of their counts, and a summary
of the submission records, ``submissions``: see ``refresh.submissions_summary``); then
one line per row, in shard order: the row as ``status --json`` prints it
(``json.dumps(row.to_dict(), sort_keys=True)``, so ``status --json`` writes the lines as
they are, newlines made ``, ``), decoded only when a status needs rows by shard; then
``#sha256=<digest of everything before it>``.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import (
    Any,
    Callable,
    Dict,
    FrozenSet,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import (
    StateError,
    ensure_dir,
    locked,
    read_bytes,
    write_bytes_atomic,
)
from synthbatch.control.errors import Conflict
from synthbatch.control.runs.status import verdict as norm
from synthbatch.control.runs.status.records import submissions_key
from synthbatch.control.runs.status.rows import ShardRow

SCHEMA = 4  # 4: JSON lines of ShardRows (3: header/columns/rows sections; older ones
# are rebuilt once, with the "not used" note)
MAX_INDEX = 1 << 30
DIGEST = b"#sha256="
DIGEST_TAIL = 128  # the digest line (73 bytes) is looked for in the file's last bytes
STATE_CODES = {state: report.code for state, report in norm.REPORT.items() if report.code}
CODE_STATES = {code: state for state, code in STATE_CODES.items()}
# ShardRow's counts between ``reason`` and ``log``, in its order
COLUMNS = ShardRow._fields[3:ShardRow._fields.index("log")]
SUMS = ("records_done", "tokens", "record_failures", "records_dropped")
LOCK_WAIT_S = 30.0  # an invalidator waits this long; status never waits
STATUS_WAIT_S = 0.05  # status: a few non-blocking tries, then it writes nothing
Identity = Tuple[int, ...]  # (dev, ino, size, mtime_ns, ctime_ns) of plan.json
MALFORMED = (ValueError, TypeError, KeyError, AttributeError)  # what bad JSON data raises


class Span(Mapping):
    """shard -> position for an index that holds shards ``0..count-1``: the identity,
    without a 100,000-entry dict."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __getitem__(self, shard: int) -> int:
        if type(shard) is not int or not 0 <= shard < self.count:
            raise KeyError(shard)
        return shard

    def __contains__(self, shard: object) -> bool:
        return type(shard) is int and 0 <= shard < self.count

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.count))

    def __len__(self) -> int:
        return self.count

    def values(self) -> range:  # type: ignore[override]
        """The positions: ``0..count-1``."""
        return range(self.count)


def _ranges(shards: Sequence[int]) -> List[List[int]]:
    """Ascending shards as ``[start, stop)`` ranges (the header's ``shards``)."""
    found: List[List[int]] = []
    for shard in shards:
        if found and found[-1][1] == shard:
            found[-1][1] = shard + 1
        else:
            found.append([shard, shard + 1])
    return found


def _shards_of(ranges: Any) -> List[int]:
    """The header's ranges as shards; ValueError unless ascending and disjoint."""
    if not isinstance(ranges, list) or not all(
            isinstance(r, list) and len(r) == 2 and type(r[0]) is int and type(r[1]) is int
            for r in ranges):
        raise ValueError("'shards' is not a list of [start, stop] ranges")
    last = -1
    for start, stop in ranges:
        if start <= last or stop <= start:
            raise ValueError("'shards' are not ascending")
        last = stop - 1
    return list(chain.from_iterable(range(a, b) for a, b in ranges))


def _checked(data: Any, shard: int, code: str) -> ShardRow:
    """One row line decoded, checked against the header's shard and state code."""
    if not isinstance(data, dict):
        raise ValueError(f"the row of shard {shard} is not an object")
    row = ShardRow.from_dict(data)
    if row.index != shard or STATE_CODES.get(row.state) != code or not can_keep(row) \
            or not all(isinstance(v, (str, type(None))) for v in (row.reason, row.log)):
        raise ValueError(f"the row of shard {shard} does not match the header")
    return row


@dataclass
class Index:
    """One read of the settled index (empty when missing or damaged: see ``problem``).

    The rows are kept as the JSON lines status prints (``texts``); ``row``/``rows`` make
    ShardRows of them, only for whoever needs them. The lines are split from the block
    (``expand``) only when first used: a status of a run whose every shard is settled uses
    the header's codes and sums and writes the block (``block``) as it is.
    """

    lineage: str = ""  # random id of this index's history; a new one after a rebuild
    generation: int = 0
    pending: FrozenSet[int] = frozenset()
    invalidated: Dict[int, int] = field(default_factory=dict)  # shard -> generation
    plan: Optional[Dict[str, Any]] = None  # cached plan view (``plan_identity`` names it)
    plan_identity: Optional[Identity] = None
    run_id: Optional[str] = None
    root: Optional[str] = None  # the run directory the rows were read in (log paths)
    ended_at: float = 0.0  # latest ``updated_at`` of the rows' attempts (0: none known)
    codes: str = ""
    sums: Dict[str, int] = field(default_factory=lambda: {c: 0 for c in SUMS})
    submissions: Optional[Dict[str, Any]] = None  # ``SubmissionsSummary`` data, or None
    last: int = -1  # the largest shard with a row (-1: none)
    raw: Optional[bytes] = None  # the bytes read (None: no file)
    problem: Optional[str] = None  # why the file on disk was not used
    ranges: Any = None  # the header's ``shards`` (not yet checked)
    section: Optional[bytes] = None  # the rows' lines, not split
    _rows: Optional[Tuple[List[int], List[str]]] = None
    _decoded: Optional[List[ShardRow]] = None
    _lines: Optional[List[bytes]] = None  # the rows' lines, for ``brief`` (not decoded:
    # a few are read, and ``json.loads`` takes UTF-8 bytes)

    def __post_init__(self) -> None:
        if self._rows is None and self.section is None:
            self._rows = ([], [])

    def invalidate(self, shards: Iterable[int]) -> None:
        """Mark ``shards`` invalidated at a new generation."""
        self.generation += 1
        self.invalidated.update((s, self.generation) for s in shards)

    def expand(self) -> Index:
        """Split the rows' lines (once); ValueError when they do not fit the header."""
        if self._rows is None:
            assert self.section is not None
            shards = _shards_of(self.ranges)
            texts = self.section.decode("utf-8").split("\n") if self.section else []
            if not len(shards) == len(texts) == len(self.codes):
                raise ValueError("shards, state codes and rows differ in length")
            if (shards[-1] if shards else -1) != self.last:
                raise ValueError("'last' does not match the shards")
            self._rows = (shards, texts)
        return self

    def _split(self) -> Tuple[List[int], List[str]]:
        try:
            return self.expand()._rows  # type: ignore[return-value]
        except MALFORMED as err:
            raise _malformed(self, err) from err

    @property
    def shards(self) -> List[int]:
        """The shards with a row, ascending."""
        return self._split()[0]

    @property
    def texts(self) -> List[str]:
        """Each row's JSON text, in ``shards`` order."""
        return self._split()[1]

    def _all(self) -> List[ShardRow]:
        """Every row, decoded once (one ``json.loads`` of all the lines)."""
        if self._decoded is None:
            shards, texts = self._split()
            try:
                data = json.loads("[" + ",".join(texts) + "]")
                self._decoded = list(map(_checked, data, shards, self.codes))
            except MALFORMED as err:
                raise _malformed(self, err) from err
        return self._decoded

    def column(self, name: str) -> List[Any]:
        """Every row's ``name`` field, in ``shards`` order."""
        return [getattr(row, name) for row in self._all()]

    def whole(self, count: int) -> bool:
        """True when the index holds a row for each of shards ``0..count-1`` (so shard i
        is at position i) and none is pending: nothing is read but the index."""
        return count > 0 and len(self.codes) == count and self.last == count - 1 \
            and not self.pending

    def block(self) -> bytes:
        """Every row's text, in shard order, joined by ``, `` (as ``json.dumps`` joins a
        list's items): the rows of ``status --json`` when the index is ``whole``."""
        if self._rows is None and self.section is not None:
            return self.section.replace(b"\n", b", ")
        return ", ".join(self.texts).encode("utf-8")

    def positions(self) -> Mapping[int, int]:
        """shard -> position of every row status may use (pending shards left out)."""
        if self.whole(len(self.codes)):
            return Span(len(self.codes))
        found = dict(zip(self.shards, range(len(self.shards))))
        for shard in self.pending:
            found.pop(shard, None)
        return found

    def row(self, pos: int) -> ShardRow:
        """The row at ``pos``."""
        if self._decoded is not None:
            return self._decoded[pos]
        shards, texts = self._split()
        try:
            return _checked(json.loads(texts[pos]), shards[pos], self.codes[pos])
        except MALFORMED as err:
            raise _malformed(self, err) from err

    def rows(self, positions: Sequence[int]) -> List[ShardRow]:
        """The rows at ``positions`` (many of them: every row decoded at once)."""
        if self._decoded is None and len(positions) * 8 < len(self.codes):
            return [self.row(p) for p in positions]
        every = self._all()
        return [every[p] for p in positions]

    def brief(self, pos: int) -> ShardRow:
        """The row at ``pos`` of an index that is ``whole`` (shard = position), read
        from its line alone (for a failure entry: the header's shards are not needed)."""
        if self._rows is not None:
            return self.row(pos)
        if self._lines is None:
            self._lines = self.section.split(b"\n") if self.section else []
        try:
            return _checked(json.loads(self._lines[pos]), pos, self.codes[pos])
        except (*MALFORMED, IndexError) as err:
            raise _malformed(self, err) from err


def _malformed(index: Index, err: Exception) -> StateError:
    """The one-line error of rows malformed behind a valid digest (only a hand edit that
    recomputed it can make them)."""
    return StateError(f"settled index of run {index.run_id}: {err} (remove "
                      "observer/settled.json: the next status rebuilds it)")


def identity(path: Path) -> Optional[Identity]:
    """The identity of a file by ``stat`` (None if it cannot be stat-ed)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


# ----------------------------------------------------------------------------- reading


def decode(raw: bytes, expand: bool = True) -> Index:
    """Parse index bytes; ValueError naming the first thing that is wrong. Without
    ``expand`` the rows are checked and split only when first used."""
    end = raw.rfind(DIGEST, max(0, len(raw) - DIGEST_TAIL))  # the digest line is last
    if end < 0 or raw[end + len(DIGEST):].strip().decode("ascii", "replace") != \
            hashlib.sha256(memoryview(raw)[:end]).hexdigest():
        raise ValueError("digest missing or wrong (truncated or edited)")
    first = raw.find(b"\n", 0, end)
    if first < 0 or raw[end - 1:end] != b"\n":
        raise ValueError("header or rows missing")
    data = json.loads(raw[:first])
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA:
        raise ValueError(f"not a schema_version {SCHEMA} settled index")
    run_id, root = data.get("run_id"), data.get("root")
    lineage, generation = data.get("lineage"), data.get("generation")
    if not isinstance(run_id, str) or not isinstance(root, str) or \
            not isinstance(lineage, str) or type(generation) is not int:
        raise ValueError("run_id/root/lineage/generation have the wrong type")
    codes, last, sums = data.get("state"), data.get("last"), data.get("sums")
    if not isinstance(codes, str) or not set(codes) <= set(CODE_STATES):
        raise ValueError("'state' is not a string of state codes")
    if type(last) is not int or last < len(codes) - 1:
        raise ValueError("'last' is not the largest shard")
    if not isinstance(sums, dict) or set(sums) != set(SUMS) or \
            not all(type(v) is int for v in sums.values()):
        raise ValueError(f"'sums' are not {', '.join(SUMS)}")
    invalidated = data.get("invalidated")
    if not isinstance(invalidated, dict) or not all(
            k.isdigit() and type(v) is int for k, v in invalidated.items()):
        raise ValueError("'invalidated' is not a shard -> generation map")
    ended = data.get("ended_at")
    if type(ended) not in (int, float):
        raise ValueError("'ended_at' is not a number")
    plan, plan_identity = data.get("plan"), data.get("plan_identity")
    if plan is not None and (not isinstance(plan, dict) or not isinstance(plan_identity, list)):
        raise ValueError("'plan' is malformed")
    section = raw[first + 1:end - 1] if end - 1 > first else b""
    if not codes and section:
        raise ValueError("shards, state codes and rows differ in length")
    pending, summary = data.get("pending"), data.get("submissions")
    if not isinstance(pending, list) or not set(map(type, pending)) <= {int}:
        raise ValueError("'pending' is not a list of integers")
    if summary is not None and (
            not isinstance(summary, dict) or not isinstance(summary.get("key"), list)
            or not isinstance(summary.get("job_ids"), list)
            or not all(isinstance(j, str) for j in summary["job_ids"])):
        raise ValueError("'submissions' is malformed")
    index = Index(lineage, generation, frozenset(pending),
                  {int(k): v for k, v in invalidated.items()}, plan,
                  tuple(plan_identity) if plan is not None else None, run_id, root,
                  float(ended), codes, sums, summary,
                  last, raw, ranges=data.get("shards"), section=section)
    return index.expand() if expand else index


def load(layout: RunLayout, expand: bool = True) -> Index:
    """The index as it is on disk; an empty Index (with ``problem``) if it is damaged or
    in another format.

    The caller checks it against the plan (``check``) once it knows the plan. Without
    ``expand`` only the header is decoded; ``expanded`` splits the rows when needed.
    """
    path = layout.settled_json
    try:
        raw = read_bytes(path, MAX_INDEX)
    except (StateError, OSError) as err:
        return Index(problem=str(err))
    if raw is None:
        return Index()
    try:
        return decode(raw, expand)
    except MALFORMED as err:
        return Index(raw=raw, problem=f"{path}: {err}")


def expanded(layout: RunLayout, index: Index) -> Index:
    """``index`` with its rows split; an empty Index naming the problem when they do not
    fit its header (as ``load`` would have returned)."""
    try:
        return index.expand()
    except MALFORMED as err:
        return Index(raw=index.raw, problem=f"{layout.settled_json}: {err}")


def check(layout: RunLayout, index: Index, run_id: str, shard_count: int) -> Index:
    """``index`` if it belongs to this run, directory and plan, else an empty one naming
    why."""
    if not index.lineage:
        return index
    why = None
    if index.run_id != run_id:
        why = f"names run {index.run_id!r}"
    elif index.root != str(layout.root):
        why = f"was written in {index.root!r} (the run directory moved)"
    elif index.last >= shard_count:
        why = f"names shard {index.last} of a {shard_count}-shard run"
    if why is None:
        return index
    return Index(raw=index.raw, problem=f"{layout.settled_json}: {why}")


# ----------------------------------------------------------------------------- writing


def encode(index: Index, layout: RunLayout, run_id: str) -> bytes:
    """The index file: header line, one row a line, digest line."""
    if index._rows is None and index.section is not None:  # rows as they were read
        ranges, block = index.ranges, index.section
    else:
        ranges, block = _ranges(index.shards), "\n".join(index.texts).encode("utf-8")
    data = {
        "schema_version": SCHEMA, "run_id": run_id, "root": str(layout.root),
        "lineage": index.lineage, "generation": index.generation,
        "pending": sorted(index.pending),
        "invalidated": {str(k): v for k, v in sorted(index.invalidated.items())},
        "plan": index.plan,
        "plan_identity": list(index.plan_identity) if index.plan is not None else None,
        "ended_at": index.ended_at, "state": index.codes, "last": index.last,
        "shards": ranges, "sums": index.sums, "submissions": index.submissions,
    }
    head = json.dumps(data, separators=(",", ":")).encode("utf-8")
    payload = head + b"\n" + (block + b"\n" if index.codes else b"")
    return payload + DIGEST + hashlib.sha256(payload).hexdigest().encode("ascii") + b"\n"


def _merge(index: Index, rows: Sequence[ShardRow], drop: FrozenSet[int] = frozenset()
           ) -> None:
    """Replace ``index``'s rows by its rows minus ``drop`` plus ``rows`` (shard order);
    the header's sums follow (only the rows dropped are decoded)."""
    old_shards, old_texts = index.shards, index.texts
    new = {row.index: row for row in rows}
    sums = dict(index.sums)
    gone = [p for p, s in enumerate(old_shards) if s in drop or s in new]
    for row in (index.rows(gone) if gone else []):
        for name in SUMS:
            sums[name] -= getattr(row, name)
    out = [(s, index.codes[p], old_texts[p]) for p, s in enumerate(old_shards)
           if s not in drop and s not in new]
    for shard, row in new.items():
        out.append((shard, STATE_CODES[row.state], json.dumps(row.to_dict(), sort_keys=True)))
        for name in SUMS:
            sums[name] += getattr(row, name)
    out.sort(key=lambda item: item[0])
    shards = [s for s, _, _ in out]
    index._rows, index.section, index._decoded = (shards, [t for _, _, t in out]), None, None
    index.codes = "".join(c for _, c, _ in out)
    index.last = shards[-1] if shards else -1
    index.sums = sums


def can_keep(row: ShardRow) -> bool:
    """True when ``row`` fits the index: a final state, column fields of their types."""
    return row.state in STATE_CODES and all(
        type(getattr(row, name)) is int for name in COLUMNS if name != "job_id") and \
        isinstance(row.job_id, (str, type(None))) and row.aliases is None


@contextmanager
def _locked(layout: RunLayout, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold ``settled.lock``: Conflict when it cannot be had within ``wait_s`` (status
    waits STATUS_WAIT_S, a few non-blocking tries, and takes the Conflict as "write
    nothing"; a writer that changes shards waits LOCK_WAIT_S)."""
    ensure_dir(layout.settled_lock.parent)
    with locked(layout.settled_lock, wait_s) as fd:
        if fd is None:
            raise Conflict(f"{layout.settled_lock}: the settled index is locked by another "
                           "process", hint="wait a moment and try again")
        yield


def _current(layout: RunLayout, run_id: str, shard_count: int) -> Index:
    """The index under the lock; a fresh lineage when it is missing or damaged."""
    index = check(layout, load(layout), run_id, shard_count)
    if not index.lineage:
        return Index(lineage=os.urandom(8).hex(), raw=index.raw, problem=index.problem)
    return index


def _trusted(latest: Index, base: Index) -> Callable[[int], bool]:
    """Which shards verified after ``base`` was read may be added to ``latest``."""
    if latest.raw == base.raw:  # nobody wrote since
        return lambda shard: True
    if latest.problem is not None or latest.raw is None:
        # removed or damaged since: its invalidations are lost, nothing earlier is trusted
        return lambda shard: False
    if latest.lineage == base.lineage:
        return lambda shard: latest.invalidated.get(shard, -1) <= base.generation
    return lambda shard: shard not in latest.invalidated  # rebuilt by another writer since


def add(layout: RunLayout, base: Index, rows: Sequence[ShardRow], run_id: str,
        shard_count: int,
        plan: Optional[Tuple[Identity, Dict[str, Any]]] = None, ended_at: float = 0.0,
        submissions: Optional[Dict[str, Any]] = None) -> bool:
    """Add the newly settled ``rows`` (verified after ``base`` was read); True if written.

    ``submissions``, when given, is a summary of the submission records to keep
    (``status.submissions_summary``: it names the records' identities, ``submissions_key``;
    kept only if they are still the folder's, and a reader checks them before use).
    ``ended_at`` is the latest ``updated_at`` of their attempts: the header keeps the
    largest, so a finished run's end is known without reading its shards (a shard
    invalidated since only ever gets a later attempt, so the largest stays right).

    Under the lock the latest index is read again: rows of shards invalidated since
    ``base`` (or pending) are dropped, every row already there is kept, and a pending
    mark left by a writer that died becomes an invalidation. Nothing is written when
    there is nothing new, or while another writer holds the lock.
    """
    rows = [r for r in rows if can_keep(r)]
    if not rows and base.problem is None and not base.pending and plan is None and \
            submissions is None:
        return False  # nothing to add: not even the lock is taken
    try:
        with _locked(layout, STATUS_WAIT_S):
            latest = _current(layout, run_id, shard_count)
            valid, there = _trusted(latest, base), set(latest.shards)
            # (a pending shard's row is dropped below, with its pending mark)
            fresh = [r for r in rows if r.index not in there and valid(r.index)
                     and r.index not in latest.pending]
            changed = bool(fresh) or latest.problem is not None or bool(latest.pending)
            if plan is not None and (latest.plan_identity, latest.plan) != plan:
                latest.plan_identity, latest.plan = plan
                changed = True
            if submissions is not None and latest.submissions != submissions and \
                    submissions.get("key") == submissions_key(layout):  # still current
                latest.submissions = submissions
                changed = True
            if not changed:
                return False
            leftover = latest.pending  # we hold the lock: whoever marked them is gone
            if leftover:
                latest.invalidate(leftover)
                latest.pending = frozenset()
            if fresh or leftover:  # else the rows' sections are written as they were read
                _merge(latest, fresh, leftover)
            if fresh:
                latest.ended_at = max(latest.ended_at, ended_at)
            write_bytes_atomic(layout.settled_json, encode(latest, layout, run_id))
            return True
    except (OSError, StateError, Conflict):  # Conflict: another writer holds the lock
        return False  # a read-only run directory, a full disk: status still answered


def forget(layout: RunLayout, run_id: str, shard_count: int, shards: Sequence[int]) -> None:
    """Drop ``shards``' rows, if the index holds any, at a new generation (``cancel``).

    ``cancel`` only changes shards that are not settled (no winner, attempt not terminal),
    which the index never holds, and what it records stays out of it (a cancelled attempt
    with a job id is not settled for ENRICH_WINDOW_S); so this writes nothing unless the
    index holds a row that it should not.
    """
    wanted = frozenset(shards)
    current = check(layout, load(layout), run_id, shard_count)
    if not wanted & set(current.shards):
        return
    with _locked(layout):
        index = _current(layout, run_id, shard_count)
        index.invalidate(wanted)
        _merge(index, [], wanted)
        write_bytes_atomic(layout.settled_json, encode(index, layout, run_id))


@contextmanager
def changing(layout: RunLayout, run_id: str, shard_count: int,
             shards: Sequence[int]) -> Iterator[None]:
    """Around a change to ``shards``' records that may unsettle them (a new attempt).

    Their rows are removed and marked pending before the body runs, and invalidated at a
    new generation after it (also when it fails). Raises Conflict when the lock cannot
    be had within LOCK_WAIT_S: the change must not happen behind the index's back.
    """
    wanted = frozenset(shards)
    if not wanted:
        yield
        return
    path = layout.settled_json
    with _locked(layout):
        index = _current(layout, run_id, shard_count)
        # We hold the lock: a pending mark already there was left by a writer that died.
        index.invalidate(index.pending)
        index.pending = wanted
        _merge(index, [], wanted)
        write_bytes_atomic(path, encode(index, layout, run_id))
        try:
            yield
        finally:
            index.pending = frozenset()
            index.invalidate(wanted)
            write_bytes_atomic(path, encode(index, layout, run_id))
