"""The fast read path of a run's records for status: the shard views, read tolerantly.

``status`` reads every shard of runs with 10,000+ shards from a fresh process. The
contract classes check every field and build nested dataclasses (measured: an attempt
record 7.3 us against 4.8 us here, a progress record 13.7 us against 1.7 us, the JSON
already read), so this path reads only the fields it shows, checks their types, and
reports a record that does not fit as the shard's problem (never raising). The views are
named tuples: a frozen dataclass costs twice as much to build, 30,000 times per refresh.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import (
    Any,
    Callable,
    Dict,
    FrozenSet,
    Iterable,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
)

from synthbatch.agent_stdlib import states
from synthbatch.agent_stdlib.arrays import ArrayError, is_job_id, task_finder, task_job_id
from synthbatch.agent_stdlib.layout import (
    ATTEMPTS,
    FIRST_ATTEMPT,
    WINNER_JSON,
    RunLayout,
    attempt_number,
    attempt_path,
    shard_name,
)
from synthbatch.agent_stdlib.statefile import StateError, read_json
from synthbatch.control.errors import NotFound
from synthbatch.control.runs.cachestats import cache_figures

SUBMISSION = re.compile(r"^[0-9]{4}\.json$")

MAX_RECORD = 1 << 20
MAX_PLAN = 1 << 28  # plan.json grows ~90 bytes a shard: 100,000 shards are ~9 MiB
# A submission record maps every shard it submitted to its attempt (~16 bytes a shard as
# written): one of 100,000 shards is ~1.6 MiB, more than any other record.
MAX_SUBMISSION = 1 << 26
# retry adds an attempt only after these
RETRIED_STATES = frozenset({states.FAILED, states.CANCELLED})
# The agent records ``running`` before its client can write progress, and states never move
# back: an attempt read in one of these states has no progress file to read.
NOT_STARTED = frozenset({states.CREATED, states.SUBMITTED, states.PENDING})


class AttemptView(NamedTuple):
    """The fields of ``attempt.json`` that status shows."""

    number: int
    state: str
    job_id: Optional[str]
    reason: Optional[str]
    updated_at: float


class ProgressView(NamedTuple):
    """The fields of ``progress.json`` that status shows."""

    records_done: int
    tokens: int
    rate: float  # records per second, as the client measured it
    updated_at: float
    dropped: int = 0
    failures: int = 0  # records the client gave up on so far (0 when it does not say)
    aliases: Optional[Dict[str, Dict[str, Any]]] = None  # the built-in generator's, per alias


class ShardView(NamedTuple):
    """One shard for status: verified winner, latest attempt, its progress, and problems.

    Each record is read on its own, so a damaged one never hides the others: ``problem``
    is the attempt record's (or the shard folder's), ``winner_problem`` a ``winner.json``
    that is there but not a verified winner, ``progress_problem`` an unreadable
    ``progress.json`` (advisory only: it never outranks a winner or an attempt).
    """

    index: int
    winner: bool  # winner.json verified by publish.load_winner
    attempt: Optional[AttemptView]
    progress: Optional[ProgressView]
    problem: Optional[str] = None
    winner_problem: Optional[str] = None
    progress_problem: Optional[str] = None
    winner_attempt: Optional[int] = None  # the attempt the verified winner names


def damaged_beside_winner(shards: Iterable[ShardView]) -> List[str]:
    """A note per shard whose verified winner decides (``succeeded``) while its attempt
    record is damaged: the verdict stands, the damage is still reported."""
    return [f"shard {s.index}: succeeded (its winner, attempt {s.winner_attempt}, decides), "
            f"but its attempt record is damaged: {s.problem}"
            for s in shards if s.winner and s.problem]


class SubmissionView(NamedTuple):
    """The fields of ``submissions/NNNN.json`` that status uses."""

    number: int
    job_id: Optional[str]
    attempts: Dict[str, int]  # shard (as a string) -> attempt
    submitted_at: float
    released: bool
    job_name: Optional[str] = None  # a shared array's job name (None: the run's own)
    tasks: Tuple[int, ...] = ()  # this run's task ids in that shared array

    def task_jobs(self) -> List[str]:
        """The job ids (``12_3``) of this run's tasks in a shared array (else none)."""
        return [task_job_id(self.job_id, t) for t in self.tasks] if self.job_id else []


def json_object(path: str, limit: int = MAX_RECORD) -> Optional[Dict[str, Any]]:
    """A schema_version 1 record as a dict, None when absent; StateError when damaged."""
    data = read_json(path, limit)
    if data is not None and data.get("schema_version") != 1:
        raise StateError(f"{path}: not a schema_version 1 record")
    return data


def _field(data: Dict[str, Any], name: str, kinds: Tuple[type, ...], path: str) -> Any:
    value = data.get(name)
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise StateError(f"{path}: field {name!r} has the wrong type")
    return value


JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")  # an argument of squeue -n


def _optional_text(data: Dict[str, Any], names: Tuple[str, ...], path: str) -> List[Any]:
    values = [data.get(name) for name in names]
    if not all(isinstance(v, (str, type(None))) for v in values):
        raise StateError(f"{path}: {'/'.join(names)} have the wrong type")
    return values


def checked_job_id(value: Optional[str], path: str) -> Optional[str]:
    """A record's job id, checked: it becomes an argument of squeue, sacct and scancel."""
    if value is not None and not is_job_id(value):
        raise StateError(f"{path}: field 'job_id' is not a Slurm job id ({value[:40]!r})")
    return value


def _attempt_view(path: str) -> Optional[AttemptView]:
    data = json_object(path)
    if data is None:
        return None
    job_id, reason = _optional_text(data, ("job_id", "reason"), path)
    return AttemptView(_field(data, "attempt", (int,), path),
                       _field(data, "state", (str,), path), checked_job_id(job_id, path), reason,
                       float(_field(data, "updated_at", (int, float), path)))


ALIAS_FIELDS = ("requests", "tokens_in", "tokens_out", "concurrency", "in_flight")


def _aliases(data: Dict[str, Any], path: str) -> Optional[Dict[str, Dict[str, Any]]]:
    """The per-alias figures of a running generator (``AliasProgress``), checked."""
    aliases = data.get("aliases")
    if aliases is None:
        return None
    if not isinstance(aliases, dict) or not all(isinstance(a, dict) for a in aliases.values()):
        raise StateError(f"{path}: field 'aliases' has the wrong type")
    out = {}
    for alias, figures in aliases.items():
        errors = figures.get("errors", {})
        if not isinstance(errors, dict) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in errors.values()):
            raise StateError(f"{path}: field 'aliases.{alias}.errors' has the wrong type")
        out[str(alias)] = {**{k: _field(figures, k, (int,), path) for k in ALIAS_FIELDS},
                           "errors": {str(k): v for k, v in errors.items()}}
        cache = cache_figures(figures, str(alias), path)  # issue 30: reuse and affinity
        if cache is not None:
            out[str(alias)]["cache"] = cache
    return out


def _submission_names(folder: str) -> List[str]:
    """The submission records' names in ``folder``, oldest first (none: no folder)."""
    try:
        return sorted(n for n in os.listdir(folder) if SUBMISSION.match(n))
    except FileNotFoundError:
        return []


def submission_views(layout: RunLayout) -> List[SubmissionView]:
    """Every submission record's status fields, oldest first; StateError names a bad one.

    ``load_submissions`` validates whole records (submit, retry and merge use it); this
    reads the one 10,000-entry shard map of a large run in ~2 ms instead of ~30 ms.
    """
    folder = str(layout.submissions)
    found = []
    for name in _submission_names(folder):
        path = f"{folder}/{name}"
        data = json_object(path, MAX_SUBMISSION)
        if data is None:
            continue
        job_id, = _optional_text(data, ("job_id",), path)
        job_id = checked_job_id(job_id, path)
        attempts = _field(data, "attempts", (dict,), path)
        # type(v) is int: a bool (its own type) is refused, as the contract refuses it
        if not set(map(type, attempts.values())) <= {int}:
            raise StateError(f"{path}: field 'attempts' has the wrong type")
        released = data.get("released")
        if not isinstance(released, bool):
            raise StateError(f"{path}: field 'released' has the wrong type")
        shared, = _optional_text(data, ("job_name",), path)
        if shared is not None and not JOB_NAME.fullmatch(shared):
            raise StateError(f"{path}: field 'job_name' is not a job name ({shared[:40]!r})")
        tasks = data.get("tasks") or []
        if not isinstance(tasks, list) or not all(type(t) is int for t in tasks):
            raise StateError(f"{path}: field 'tasks' has the wrong type")
        found.append(SubmissionView(_field(data, "number", (int,), path), job_id, attempts,
                                    float(_field(data, "submitted_at", (int, float), path)),
                                    released, shared, tuple(tasks)))
    return found


def run_job_ids(submissions: Iterable[SubmissionView]) -> List[str]:
    """The job ids a run's numbers count, sorted: each submission's job, or in a shared
    array (which holds other runs' tasks too) only this run's tasks."""
    return sorted({job for s in submissions if s.job_id
                   for job in (s.task_jobs() if s.job_name else [s.job_id])})


def submissions_key(layout: RunLayout) -> Optional[List[List[Any]]]:
    """The identity of every submission record (name, inode, size, mtime and ctime in
    ns), by one listing and a ``stat`` each, no record opened; None when it cannot be
    taken. Records are replaced by rename, never written in place, so an unchanged key
    means unchanged records: a summary read between two equal keys stays right for as
    long as the key does (the settled index keeps one: ``status.submissions_summary``)."""
    folder = str(layout.submissions)
    try:
        key = []
        for name in _submission_names(folder):
            info = os.lstat(f"{folder}/{name}")
            key.append([name, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns])
    except FileNotFoundError:
        return []
    except OSError:
        return None
    return key


class Expected(NamedTuple):
    """The newest attempt of a shard that a submission record names, and what that record
    implies of it while it has no ``attempt.json`` (``attempts.implied_attempt``: a
    submit's first attempts get none until they start)."""

    attempt: int
    job_id: Optional[str]  # its task's job id once the record holds the array's; else None
    submitted_at: float
    folder: Optional[bool] = None  # the shard's folder exists (None: not known, lstat it)


def committed_at(layout: RunLayout) -> Optional[float]:
    """When ``run.json`` was published (its mtime: one ``lstat``), None before the commit."""
    try:
        return os.lstat(layout.run_json).st_mtime
    except FileNotFoundError:
        return None


def shard_folders(layout: RunLayout) -> Optional[FrozenSet[str]]:
    """The names in the run's ``shards/`` (one listing), None when it cannot be listed.

    For a refresh that reads many shards: a first attempt that has not started has no
    folder, and one listing (a few readdir calls, whatever the count) says which have
    started, where an ``lstat`` a shard would cost a metadata round trip each."""
    try:
        return frozenset(os.listdir(f"{layout.root}/shards"))
    except FileNotFoundError:
        return frozenset()
    except OSError:
        return None


def expected_lookup(submissions: Sequence[Any], arrays: Sequence[Any] = (),
                    committed: Optional[float] = None,
                    folders: Optional[FrozenSet[str]] = None
                    ) -> Callable[[int], Optional[Expected]]:
    """shard -> ``Expected``, without building a map of every shard: status asks only
    about the shards its settled index does not hold. ``submissions`` are SubmissionViews
    or SubmissionRecords, ``arrays`` the plan's (``ArrayView`` or ``ArraySpec``: they give
    each shard's task id). A shard no record names is None, or, with ``committed`` (the
    run's commit time, ``committed_at``), attempt 1 ``created`` as of then: a committed
    run has a first attempt of every shard (a submit that died before its submission
    record left them so; ``retry`` submits them)."""
    unnamed = None if committed is None else Expected(FIRST_ATTEMPT, None, committed)
    find = task_finder(arrays)

    def task(shard: int) -> Optional[int]:
        try:
            return find(shard)[1]
        except ArrayError:  # a damaged plan: no job id is implied
            return None

    def lookup(shard: int) -> Optional[Expected]:
        key = str(shard)
        best, record = 0, None
        for candidate in submissions:
            attempt = candidate.attempts.get(key, 0)
            if attempt > best:
                best, record = attempt, candidate
        folder = None if folders is None else shard_name(shard) in folders
        if record is None:
            return unnamed if unnamed is None or folder is None else \
                unnamed._replace(folder=folder)
        number = task(shard) if record.job_id else None
        job_id = task_job_id(record.job_id, number) if number is not None else None
        return Expected(best, job_id, record.submitted_at, folder)

    return lookup


RECOVERY_GRACE_S = 120.0  # a submission younger than this may still be in flight


def needs_recovery(records: Iterable[Any], committed: bool, now: float) -> bool:
    """True when a submission lacks its job id or release, or the run never committed.

    ``records`` are SubmissionRecords or SubmissionViews (``submitted_at``, ``job_id``,
    ``released``).
    """
    records = list(records)
    settled = all(now - r.submitted_at >= RECOVERY_GRACE_S for r in records)
    unfinished = any(r.job_id is None or not r.released for r in records)
    return settled and bool(records) and (unfinished or not committed)


def latest_attempt_dir(layout: RunLayout, shard: int) -> Tuple[bool, Optional[str]]:
    """(winner.json exists, the newest ``attempt-NNNN`` folder with a record) of a shard.

    Plain strings and two ``listdir`` calls; ``scan_shard`` falls back to it when the
    submission records do not name the shard's latest attempt. A newer folder without
    ``attempt.json`` is not an attempt yet (a retry is creating it, or died doing so:
    the next retry submits it), so the attempt before it is the shard's latest; without
    any record the newest folder is returned (``scan_shard`` shows it ``created``: a
    first attempt whose submit has not written its record yet).
    """
    folder = f"{layout.root}/shards/{shard_name(shard)}"
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return False, None
    winner = WINNER_JSON in names
    if ATTEMPTS not in names:
        return winner, None
    numbers = sorted((n for n in map(attempt_number, os.listdir(f"{folder}/{ATTEMPTS}"))
                      if n is not None), reverse=True)
    if not numbers:
        return winner, None
    recorded = next((n for n in numbers
                     if _exists(f"{attempt_path(folder, n)}/attempt.json")), numbers[0])
    return winner, attempt_path(folder, recorded)


UNRECORDED = "not recorded yet (its submission has not written it)"
UNSUBMITTED = "not submitted yet (no job id recorded)"


def _unrecorded(folder: str, expected: Optional[Expected]) -> AttemptView:
    """The view of an attempt folder without a record: as its submission implies it when
    it is the ``expected`` attempt (a first attempt whose agent is making its record),
    else ``created`` (a retry making the record, or one that died doing so), dated by the
    folder itself."""
    number = int(os.path.basename(folder)[8:])
    if expected is not None and expected.attempt == number == FIRST_ATTEMPT:
        return implied_view(expected)
    return AttemptView(number, states.CREATED, None, UNRECORDED, os.lstat(folder).st_mtime)


def implied_view(expected: Expected) -> AttemptView:
    """An attempt without a record, as its submission record implies it
    (``attempts.implied_attempt``): ``submitted`` with its task's job id, dated by the
    submission, or ``created`` while the record has no job id."""
    if expected.job_id is None:
        return AttemptView(expected.attempt, states.CREATED, None, UNSUBMITTED,
                           expected.submitted_at)
    return AttemptView(expected.attempt, states.SUBMITTED, expected.job_id, None,
                       expected.submitted_at)


def _exists(path: str) -> bool:
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    return True


def _winner(folder: str, shard: int, present: bool
            ) -> Tuple[bool, Optional[str], Optional[int]]:
    """(verified, problem, the attempt it names) of the ``winner.json`` in shard ``folder``;
    ``present``: there is one. Verified as everywhere else (``publish.verify_winner``):
    only a shard that has one costs the contract classes' import and a full record check
    (~30 us).
    """
    if not present:
        return False, None, None
    from synthbatch.agent_stdlib.publish import verify_winner

    try:
        winner = verify_winner(f"{folder}/winner.json", shard)
    except StateError as err:
        return False, str(err), None
    return winner is not None, None, winner.attempt if winner is not None else None


def _progress(base: str, running: bool) -> Tuple[Optional[ProgressView], Optional[str]]:
    """(progress, problem) of an attempt folder: a bad progress file is only a problem.
    ``running``: also the per-alias figures (read only for running shards)."""
    path = f"{base}/progress.json"
    try:
        data = json_object(path)
        if data is None:
            return None, None
        dropped = data.get("records_dropped", 0)
        failures = _field(data, "failures", (int,), path) if "failures" in data else 0
        return ProgressView(_field(data, "records_done", (int,), path),
                            _field(data, "tokens", (int,), path),
                            float(_field(data, "requests_per_s", (int, float), path)),
                            float(_field(data, "updated_at", (int, float), path)),
                            _field({"records_dropped": dropped}, "records_dropped", (int,),
                                   path),
                            failures, _aliases(data, path) if running else None), None
    except (StateError, OSError) as err:
        return None, str(err)


def _scan_expected(layout: RunLayout, shard: int, expected: Expected) -> Optional[ShardView]:
    """The shard read at attempt ``expected`` without listing, or None to list instead.

    ``expected`` is the newest attempt a submission record names. It is the latest
    attempt unless a retry has created the next one and not yet recorded its submission:
    retry numbers attempts 1, 2, ... without gaps and creates attempt N+1 only once N is
    ``failed`` or ``cancelled`` (states never move back), so only then is the next folder
    looked for. A first attempt without a shard folder is as its submission implies it:
    one ``lstat`` (none when ``expected.folder`` says, from ``shard_folders``), nothing
    opened or listed. Anything unexpected (no record, another number, a damaged record)
    falls back to listing.
    """
    folder = f"{layout.root}/shards/{shard_name(shard)}"
    if expected.attempt == FIRST_ATTEMPT and not (
            _exists(folder) if expected.folder is None else expected.folder):
        return ShardView(shard, False, implied_view(expected), None)
    present = _exists(f"{folder}/winner.json")
    base = attempt_path(folder, expected.attempt)
    try:
        attempt = _attempt_view(f"{base}/attempt.json")
    except StateError:
        return None
    if attempt is None or attempt.number != expected.attempt:
        return None
    if attempt.state in RETRIED_STATES and \
            _exists(attempt_path(folder, expected.attempt + 1)):
        return None
    progress, progress_problem = (None, None) if attempt.state in NOT_STARTED else \
        _progress(base, attempt.state == states.RUNNING)
    winner, winner_problem, won = _winner(folder, shard, present)
    return ShardView(shard, winner, attempt, progress, None, winner_problem, progress_problem,
                     won)


def scan_shard(layout: RunLayout, shard: int, expected: Optional[Expected] = None
               ) -> ShardView:
    """One shard's status records, tolerant: each bad record becomes its own problem.

    ``expected`` (``expected_lookup``) is what the submission records say of the shard's
    newest attempt: the shard's folders are not listed unless the records disagree with it
    (two ``listdir`` calls a shard were ~70 ms of a 10,000-shard status), and an attempt
    without a record is shown as its submission implies it. Without it, an attempt that
    has no folder yet is not seen.
    """
    try:
        if expected is not None:
            view = _scan_expected(layout, shard, expected)
            if view is not None:
                return view
        present, folder = latest_attempt_dir(layout, shard)
    except OSError as err:
        return ShardView(shard, False, None, None, problem=str(err))
    winner, winner_problem, won = _winner(f"{layout.root}/shards/{shard_name(shard)}", shard,
                                          present)
    attempt, problem = None, None
    progress, progress_problem = None, None
    if folder:
        try:
            attempt = _attempt_view(f"{folder}/attempt.json") or _unrecorded(folder, expected)
        except (StateError, OSError) as err:
            problem = str(err)
        progress, progress_problem = _progress(folder, attempt is not None
                                               and attempt.state == states.RUNNING)
    elif expected is not None and expected.attempt == FIRST_ATTEMPT:
        attempt = implied_view(expected)
    return ShardView(shard, winner, attempt, progress, problem, winner_problem,
                     progress_problem, won)


def shard_scanner(layout: RunLayout, arrays: Optional[Sequence[Any]] = None,
                  many: bool = False) -> Callable[[int], ShardView]:
    """``scan_shard`` with each shard's ``Expected`` from the run's submission records
    (read once, here). ``arrays``: the plan's (``load_plan_view`` is read when None), for
    the job ids the records imply; ``many``: most shards will be read (``shard_folders``
    is listed once). Damaged submission records give no hints: every shard is then read
    by listing its folders, and a first attempt that has not started is not seen (never
    taken for ``created``: the damaged record may name its job)."""
    try:
        submissions: Sequence[Any] = submission_views(layout)
        if arrays is None:
            arrays = load_plan_view(layout).arrays
        commit = committed_at(layout)
        folders = shard_folders(layout) if many else None
    except StateError:  # nothing is implied: a damaged record may name submitted attempts
        submissions, arrays, commit, folders = [], (), None, None
    expected = expected_lookup(submissions, arrays, commit, folders)
    return lambda shard: scan_shard(layout, shard, expected(shard))


class ArrayView(NamedTuple):
    """One of ``plan.arrays`` (``agent_stdlib.arrays`` maps shards to its tasks)."""

    index: int
    first_shard: int
    count: int
    first_task: int = 0


@dataclass(frozen=True)
class PlanView:
    """What status needs from ``plan.json``: run id, name, records per shard, arrays, and
    for the cost figures the partition (None: the cluster's default) and each alias's
    GPUs (its replicas x GPUs per replica)."""

    run_id: str
    name: str
    total_records: int
    shard_records: Tuple[int, ...]
    arrays: Tuple[ArrayView, ...] = ()
    partition: Optional[str] = None
    gpus: Optional[Dict[str, int]] = None  # None: the plan's deployments are unreadable


def plan_view_data(plan: PlanView) -> Dict[str, Any]:
    """A PlanView as plain data, records per shard run-length encoded (for the settled
    index, which keeps it so that a large plan is not decoded on every refresh)."""
    sizes: List[List[int]] = []
    for size in plan.shard_records:
        if sizes and sizes[-1][0] == size:
            sizes[-1][1] += 1
        else:
            sizes.append([size, 1])
    return {"run_id": plan.run_id, "name": plan.name, "total_records": plan.total_records,
            "sizes": sizes, "arrays": [list(a) for a in plan.arrays],
            "partition": plan.partition, "gpus": plan.gpus}


def plan_view_from_data(data: Any) -> PlanView:
    """The inverse of ``plan_view_data``; ValueError when ``data`` is not such a view."""
    try:
        sizes: List[int] = []
        for size, count in data["sizes"]:
            if type(size) is not int or type(count) is not int or count < 1:
                raise ValueError("bad run of shard sizes")
            sizes.extend([size] * count)
        arrays = tuple(ArrayView(*(int(v) for v in a)) for a in data["arrays"])
        view = PlanView(run_id=data["run_id"], name=data["name"],
                        total_records=data["total_records"], shard_records=tuple(sizes),
                        arrays=arrays, partition=data["partition"], gpus=data["gpus"])
    except (KeyError, TypeError) as err:  # (an index kept before the cost facts: re-read)
        raise ValueError(f"malformed plan view ({err})") from err
    if not isinstance(view.run_id, str) or not isinstance(view.name, str) or \
            type(view.total_records) is not int or \
            not isinstance(view.partition, (str, type(None))) or \
            not (view.gpus is None or isinstance(view.gpus, dict) and all(
                isinstance(k, str) and type(v) is int for k, v in view.gpus.items())):
        raise ValueError("malformed plan view")
    return view


def load_plan_view(layout: RunLayout) -> PlanView:
    """The plan's shape without full contract validation (merge and submit validate)."""
    try:
        data = json_object(str(layout.plan_json), MAX_PLAN)
        if data is None:
            raise NotFound(f"{layout.plan_json}: missing")
        shards = data["shards"]
        sizes = tuple(int(s["num_records"]) for s in shards)
        if [s["index"] for s in shards] != list(range(len(shards))):
            raise StateError(f"{layout.plan_json}: shard indices are not 0..n-1")
        arrays = tuple(ArrayView(int(a["index"]), int(a["first_shard"]), int(a["count"]),
                                 int(a.get("first_task", 0)))
                       for a in data.get("arrays", ()))
        return PlanView(run_id=str(data["run_id"]), name=str(data["name"]),
                        total_records=int(data["total_records"]), shard_records=sizes,
                        arrays=arrays, **_cost_facts(data))
    except (KeyError, TypeError, ValueError) as err:
        raise StateError(f"{layout.plan_json}: malformed plan ({err})") from err


def _cost_facts(data: Dict[str, Any]) -> Dict[str, Any]:
    """The plan's partition (a string, else None) and each alias's GPUs (None when the
    deployments cannot be read: the cost figures say so, status does not fail)."""
    try:
        partition = data["resources"].get("partition")
        gpus = {str(d["alias"]): int(d["replicas"]) * int(d["gpus_per_replica"])
                for d in data["deployments"]}
    except (KeyError, TypeError, ValueError, AttributeError):
        return {"partition": None, "gpus": None}
    return {"partition": partition if isinstance(partition, str) else None, "gpus": gpus}
