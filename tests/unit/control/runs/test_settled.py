"""The settled index (issue 20): status through the index says exactly what a status that
reads every shard says, over random runs, damaged records, damaged indexes, retries,
retries that die half-way, and status processes that race each other.

The index trusts what the contracts make immutable (a published ``winner.json``, a
terminal attempt record): damage is done to records before they settle, or to shards that
are not settled, and to the index itself, never to a record the index has already
verified (that is tampering, which the index does not detect, see docs/observation.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import pytest

from synthbatch.agent_stdlib import states
from synthbatch.agent_stdlib.attempts import advance_attempt, load_attempt
from synthbatch.agent_stdlib.contracts import ProgressRecord, SubmissionRecord, WinnerRecord
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import (
    StateError,
    ensure_dir,
    publish_json_immutable,
    write_json_atomic,
)
from synthbatch.control.config.loader import load_model
from synthbatch.control.config.profile import Profile
from synthbatch.control.runs.retry import retry_run
from synthbatch.control.runs.status import index as settled
from synthbatch.control.runs.status import refresh as status
from synthbatch.control.runs.status.listing import durable_state
from synthbatch.control.runs.status.records import (
    Expected,
    load_plan_view,
    run_job_ids,
    submission_views,
    submissions_key,
)
from synthbatch.control.runs.status.refresh import observe, refresh
from synthbatch.control.runs.status.rows import ShardRow
from synthbatch.control.runs.status.totals import ended_at
from synthbatch.control.slurm.runner import CommandResult
from synthbatch.control.slurm.scheduler import Scheduler
from tests.fakes import (
    NOW,
    RUN_ID,
    TESTBED,
    Crash,
    Shard,
    crash_on_call,
    first_record,
    make_run,
)

GARBAGE = b"\x00\xff{not json"


class Cluster:
    """A scheduler whose queue and accounting the test sets; sbatch queues new arrays."""

    def __init__(self) -> None:
        self.queue: Dict[str, str] = {}  # job id -> squeue state
        self.acct: Dict[str, Tuple[str, str]] = {}  # job id -> (sacct state, exit code)
        self.next_id = 700
        self.calls: List[List[str]] = []
        self.lock = threading.Lock()

    def __call__(self, argv: List[str], timeout_s: float) -> CommandResult:
        name = argv[0].rsplit("/", 1)[-1]
        with self.lock:
            self.calls.append(list(argv))
            out = ""
            if name == "squeue":
                out = "".join(f"{job}|{state}|None\n" for job, state in self.queue.items())
            elif name == "sacct":
                asked = argv[argv.index("-j") + 1].split(",")
                out = "".join(f"{job}|{state}|{code}\n" for job, (state, code)
                              in self.acct.items() if job.split("_")[0] in asked)
            elif name == "sbatch":
                self.next_id += 1
                spec = next(a for a in argv if a.startswith("--array="))[8:].split("%")[0]
                for part in spec.split(","):
                    first, _, last = part.partition("-")
                    for task in range(int(first), int(last or first) + 1):
                        self.queue[f"{self.next_id}_{task}"] = "PENDING"
                out = f"{self.next_id}\n"
            else:
                assert name == "scontrol", argv
            return CommandResult(list(argv), 0, out, "")


def scheduler(cluster: Cluster) -> Scheduler:
    return Scheduler(runner=cluster)


KINDS = ["winner", "failed-old", "failed-recent", "cancelled-old", "lost-old", "running",
         "pending", "created", "gone", "succeeded-no-winner", "bad-attempt", "winner-symlink",
         "winner-other-shard", "winner-bad-progress", "failed-bad-progress",
         "implied-pending", "implied-gone"]  # implied: no folder, the submission implies it


def random_run(workspace: Path, rng: random.Random) -> Tuple[RunLayout, Cluster]:
    """A run of 5-25 shards, each one of KINDS, and the cluster that goes with it."""
    kinds = [rng.choice(KINDS) for _ in range(rng.randint(5, 25))]
    shards = []
    for kind in kinds:
        if kind.startswith("winner"):
            shards.append(Shard("winner", progress=10))
        elif kind in ("failed-old", "failed-bad-progress"):
            shards.append(Shard("failed", "boom", progress=3, updated_at=NOW - 3600))
        elif kind == "failed-recent":
            shards.append(Shard("failed", "client exited 1", updated_at=NOW - 30))
        elif kind == "cancelled-old":
            shards.append(Shard("cancelled", rng.choice([None, "stop"]), updated_at=NOW - 3600))
        elif kind == "lost-old":
            shards.append(Shard("failed", "lost: gone", updated_at=NOW - 3600))
        elif kind in ("running", "gone"):
            shards.append(Shard("running", progress=rng.randint(0, 9)))
        elif kind == "succeeded-no-winner":
            shards.append(Shard("succeeded", updated_at=NOW - 3600))
        elif kind == "bad-attempt":
            shards.append(Shard("failed", "boom", updated_at=NOW - 3600))
        elif kind.startswith("implied"):
            shards.append(Shard("implied"))
        else:
            shards.append(Shard({"pending": "submitted", "created": "created"}[kind]))
    layout = make_run(workspace, shards)
    cluster = Cluster()
    for index, kind in enumerate(kinds):
        job = f"500_{index}"
        if kind == "running":
            cluster.queue[job] = "RUNNING"
        elif kind in ("failed-old", "cancelled-old") and rng.random() < 0.5:
            # squeue still shows the job (a long MinJobAge): settled all the same
            cluster.queue[job] = rng.choice(["COMPLETED", "CANCELLED", "FAILED"])
        elif kind in ("pending", "implied-pending"):
            cluster.queue[job] = "PENDING"
        elif kind in ("gone", "implied-gone"):
            cluster.acct[job] = ("FAILED", "1:0")
        elif kind == "failed-recent":
            cluster.acct[job] = ("FAILED", "1:0")
        elif kind == "bad-attempt":
            path = layout.attempt(index, 1).attempt_json
            path.write_text(path.read_text()[:40])
        elif kind == "winner-symlink":
            target = workspace / f"elsewhere-{index}.json"
            os.replace(layout.winner_json(index), target)
            layout.winner_json(index).symlink_to(target)
        elif kind == "winner-other-shard":
            os.unlink(layout.winner_json(index))
            publish_json_immutable(layout.winner_json(index), WinnerRecord(
                shard=index + 1, attempt=1, records=10, result_sha256="0" * 64, files=(),
                created_at=NOW).to_dict())
        elif kind.endswith("bad-progress"):
            layout.attempt(index, 1).progress_json.write_bytes(GARBAGE)
    return layout, cluster


def compare(layout: RunLayout, cluster: Cluster, now: float) -> Dict[str, Any]:
    """Indexed status == from-scratch status (and ``--json`` text == its data); so are
    the end of the run that ``totals`` uses and what ``runs`` says without Slurm."""
    fresh = refresh(layout, scheduler(cluster), now)
    indexed = fresh.data()
    assert fresh.json_text() == json.dumps(indexed, sort_keys=True)
    scratch = observe(layout, scheduler(cluster), now, use_index=False)
    notes = [n for n in indexed["notes"] if not n.startswith("settled index not used")]
    assert {**indexed, "notes": notes} == scratch
    count = len(indexed["shards"])
    assert fresh.ended_at == (ended_at(layout, count) or None)
    assert fresh.column("job_id") == [row["job_id"] for row in indexed["shards"]]
    try:  # the job ids totals counts, from the index's summary of the submission records
        jobs = run_job_ids(submission_views(layout))
    except StateError:
        jobs = None  # a damaged record: totals reads them itself (and names it)
    assert fresh.job_ids == jobs
    sizes = [row["records"] for row in indexed["shards"]]
    assert durable_state(layout, count, sizes, RUN_ID) == durable_state(layout, count, sizes)
    return indexed


def dying_retry(layout: RunLayout, cluster: Cluster, shards: List[int]) -> None:
    """A retry of ``shards`` that dies after creating its attempts, before the index
    hears of it (its second index write: the invalidation)."""
    real = settled.write_bytes_atomic
    settled.write_bytes_atomic = crash_on_call(real, 2)
    try:
        with pytest.raises(Crash):
            retry_run(layout, load_model(TESTBED, Profile), scheduler(cluster), shards,
                      lock_wait_s=0)
    finally:
        settled.write_bytes_atomic = real


def late_refresh(layout: RunLayout, cluster: Cluster, now: float) -> List[Tuple[Any, ...]]:
    """A refresh whose index write is held back: the arguments of its ``settled.add``
    (``settled.add(*args)`` makes it happen later, as a slow status process would)."""
    captured: List[Tuple[Any, ...]] = []
    real = settled.add
    settled.add = lambda *args: captured.append(args) or False
    try:
        refresh(layout, scheduler(cluster), now)
    finally:
        settled.add = real
    return captured


def open_shards(data: Dict[str, Any], wanted: Tuple[str, ...]) -> List[int]:
    return [row["index"] for row in data["shards"] if row["state"] in wanted]


class Scenario:
    """Random steps on one run, comparing indexed and from-scratch status after each."""

    def __init__(self, tmp_path: Path, seed: int) -> None:
        self.rng = random.Random(seed)
        self.workspace = tmp_path / f"ws-{seed}"
        self.layout, self.cluster = random_run(self.workspace, self.rng)
        self.now = NOW
        self.profile = load_model(TESTBED, Profile)
        self.deferred: List[Tuple[Any, ...]] = []  # index writes of a "slow" status
        self.data = compare(self.layout, self.cluster, self.now)

    def step(self) -> None:
        action = self.rng.choice([self.advance, self.advance, self.retry, self.retry,
                                  self.dying_retry, self.later, self.damage_index,
                                  self.damage_open_record, self.slow_status,
                                  self.finish_slow_status])
        action()
        self.data = compare(self.layout, self.cluster, self.now)

    def advance(self) -> None:
        """A running or pending shard moves on, as its agent would move it."""
        live = open_shards(self.data, ("running", "pending"))
        if not live:
            return
        index = self.rng.choice(live)
        row = self.data["shards"][index]
        path = self.layout.attempt(index, row["attempt"]).attempt_json
        first = None if path.exists() else first_record(self.layout, index)  # implied
        record = load_attempt(path) or first
        assert record is not None and record.job_id
        outcome = self.rng.choice(["running", "failed", "succeeded"])
        if record.state in (states.SUBMITTED, states.PENDING):
            advance_attempt(path, states.RUNNING, first=first)
            self.cluster.queue[record.job_id] = "RUNNING"
            if outcome == "running":
                return
        advance_attempt(path, outcome if outcome != "running" else states.FAILED,
                        reason=None if outcome == "succeeded" else "client exited 2")
        write_json_atomic(self.layout.attempt(index, row["attempt"]).progress_json,
                          ProgressRecord(records_done=5, records_total=10, tokens=35,
                                         requests_per_s=1.0, updated_at=self.now,
                                         failures=self.rng.randint(0, 3),
                                         records_dropped=self.rng.randint(0, 2)).to_dict())
        if outcome == "succeeded":
            publish_json_immutable(self.layout.winner_json(index), WinnerRecord(
                shard=index, attempt=row["attempt"], records=10, result_sha256="0" * 64,
                files=(), created_at=self.now).to_dict())
        self.cluster.queue[record.job_id] = "COMPLETED" if outcome == "succeeded" \
            else "FAILED"

    def _retriable(self) -> List[int]:
        return open_shards(self.data, ("failed", "cancelled", "lost"))

    def retry(self) -> None:
        """``retry`` of some shards that ended without a winner (attempt N+1, submitted)."""
        shards = self._retriable()
        if not shards:
            return
        chosen = self.rng.sample(shards, self.rng.randint(1, len(shards)))
        retry_run(self.layout, self.profile, scheduler(self.cluster), chosen, lock_wait_s=0)

    def dying_retry(self) -> None:
        """A retry that dies after creating its attempts, before the index hears of it."""
        shards = self._retriable()
        if not shards:
            return
        dying_retry(self.layout, self.cluster, shards[:2])

    def later(self) -> None:
        """Time passes: recent failures leave the window in which Slurm is asked."""
        self.now += self.rng.choice([5.0, 700.0])

    def damage_index(self) -> None:
        path = self.layout.settled_json
        if not path.exists():
            return
        raw = path.read_bytes()
        how = self.rng.choice(["truncate", "flip", "garbage", "other-run", "moved"])
        if how == "truncate":
            path.write_bytes(raw[: len(raw) // 2])
        elif how == "flip":
            at = self.rng.randrange(len(raw) - 80)
            path.write_bytes(raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1:])
        elif how == "garbage":
            path.write_bytes(GARBAGE)
        else:  # a sound index of another run, or written in another directory
            index = settled.load(self.layout)
            if how == "moved":
                other = RunLayout(self.layout.root.parent / "elsewhere")
                path.write_bytes(settled.encode(index, other, RUN_ID))
            else:
                path.write_bytes(settled.encode(index, self.layout, "another-run"))
        assert "settled index not used" in " ".join(
            refresh(self.layout, scheduler(self.cluster), self.now).summary["notes"])

    def damage_open_record(self) -> None:
        """Damage the attempt or progress record of a shard that has not settled."""
        live = open_shards(self.data, ("running", "pending", "created"))
        if not live:
            return
        index = self.rng.choice(live)
        paths = self.layout.attempt(index, self.data["shards"][index]["attempt"])
        target = self.rng.choice([paths.attempt_json, paths.progress_json])
        ensure_dir(paths.root)  # an implied first attempt has no folder yet
        target.write_bytes(GARBAGE)

    def slow_status(self) -> None:
        """A status that reads now and writes its index rows only at a later step."""
        self.deferred.extend(late_refresh(self.layout, self.cluster, self.now))

    def finish_slow_status(self) -> None:
        while self.deferred:
            settled.add(*self.deferred.pop(0))


@pytest.mark.parametrize("seed", range(60))
def test_indexed_status_equals_from_scratch_status(tmp_path: Path, seed: int) -> None:
    scenario = Scenario(tmp_path, seed)
    for _ in range(12):
        scenario.step()
    scenario.finish_slow_status()
    scenario.now += 700.0
    compare(scenario.layout, scenario.cluster, scenario.now)


def test_two_status_processes_and_retries_racing(tmp_path: Path) -> None:
    """Threads (each lock is its own open file, as in separate processes): status refreshes
    in two threads while a third retries shard after shard; afterwards the index agrees
    with a from-scratch status and holds every settled shard."""
    layout = make_run(tmp_path, [Shard("winner", progress=10) if i % 3 else
                                 Shard("failed", "boom", updated_at=NOW - 3600)
                                 for i in range(30)])
    cluster, profile = Cluster(), load_model(TESTBED, Profile)
    errors: List[BaseException] = []
    stop = threading.Event()

    def guarded(work: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                work()
            except BaseException as err:  # noqa: BLE001 - reported by the test
                errors.append(err)
        return run

    def refreshing() -> None:
        while not stop.is_set():
            refresh(layout, scheduler(cluster), NOW)

    def retrying() -> None:
        for shard in range(0, 30, 3):
            retry_run(layout, profile, scheduler(cluster), [shard], lock_wait_s=30)
            job = max(cluster.queue)  # the retry's job fails at once, long ago
            path = layout.attempt(shard, 2).attempt_json
            advance_attempt(path, states.RUNNING)
            advance_attempt(path, states.FAILED, reason="again")
            data = json.loads(path.read_text())
            data["updated_at"] = NOW - 3600
            write_json_atomic(path, data)
            cluster.queue[job] = "FAILED"

    threads = [threading.Thread(target=guarded(refreshing)) for _ in range(2)]
    for thread in threads:
        thread.start()
    guarded(retrying)()
    stop.set()
    for thread in threads:
        thread.join()
    assert not errors, errors
    data = compare(layout, cluster, NOW)
    assert [(r["attempt"], r["reason"]) for r in data["shards"][::3]] == [(2, "again")] * 10
    compare(layout, cluster, NOW)  # the second refresh reads no shard record
    assert len(settled.load(layout).shards) == 30


# ----------------------------------------------------------------------------- what is read


class Opens:
    """Counts ``os.open`` calls under a folder (state files are opened with ``os.open``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
        self.paths: List[str] = []
        real = os.open

        def counted(path: Any, *args: Any, **kwargs: Any) -> int:
            if str(path).startswith(str(root)):
                self.paths.append(str(path))
            return real(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", counted)


def test_a_settled_run_opens_a_handful_of_files(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    layout = make_run(tmp_path, [Shard("winner", progress=10)] * 40 +
                      [Shard("failed", "boom", updated_at=NOW - 3600)] * 10)
    cluster = Cluster()
    first = compare(layout, cluster, NOW)
    opens = Opens(monkeypatch, layout.root)
    again = refresh(layout, scheduler(cluster), NOW).data()
    assert again == first and cluster.calls == []
    assert opens.paths == [str(layout.settled_json)]  # not even plan.json


def test_an_active_run_opens_one_file_per_open_shard(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    layout = make_run(tmp_path, [Shard("winner", progress=10)] * 40 +
                      [Shard("submitted")] * 5 + [Shard("running", progress=2)] * 3)
    cluster = Cluster()
    cluster.queue.update({f"500_{i}": "PENDING" for i in range(40, 45)})
    cluster.queue.update({f"500_{i}": "RUNNING" for i in range(45, 48)})
    compare(layout, cluster, NOW)
    opens = Opens(monkeypatch, layout.root)
    refresh(layout, scheduler(cluster), NOW)
    names = sorted(Path(p).name for p in opens.paths)
    # the index, the submission record, the lag ledger, an attempt record a shard, and
    # progress when it runs
    assert names == sorted(["settled.json", "0001.json", "lag.json"] +
                           ["attempt.json"] * 8 + ["progress.json"] * 3)


# ----------------------------------------------------------------------------- the index


def test_a_damaged_index_is_named_and_rebuilt(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("winner")] * 3)
    cluster = Cluster()
    compare(layout, cluster, NOW)
    layout.settled_json.write_bytes(GARBAGE)
    data = compare(layout, cluster, NOW)
    assert any("settled index not used" in n and "digest missing or wrong" in n
               for n in data["notes"])
    assert compare(layout, cluster, NOW)["notes"] == []  # rebuilt by the refresh before
    assert len(settled.load(layout).shards) == 3


def test_a_retry_that_died_half_way_is_cleaned_up_by_status(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("failed", "boom", updated_at=NOW - 3600),
                                 Shard("winner")])
    cluster = Cluster()
    compare(layout, cluster, NOW)
    assert settled.load(layout).shards == [0, 1]
    dying_retry(layout, cluster, [0])
    left = settled.load(layout)
    assert left.pending == {0} and left.shards == [1]
    data = compare(layout, cluster, NOW)  # attempt 2 is shown, the mark cleared
    assert (data["shards"][0]["state"], data["shards"][0]["attempt"]) == ("created", 2)
    cleaned = settled.load(layout)
    assert cleaned.pending == frozenset() and 0 in cleaned.invalidated


def test_a_row_verified_before_a_retry_is_dropped_after_it(tmp_path: Path) -> None:
    """The race the generations are for: a status reads shard 0 settled, a retry creates
    attempt 2, then the slow status adds what it had read."""
    layout = make_run(tmp_path, [Shard("failed", "boom", updated_at=NOW - 30),
                                 Shard("winner")])
    cluster = Cluster()
    compare(layout, cluster, NOW)  # the index holds shard 1; shard 0 failed just now
    assert settled.load(layout).shards == [1]
    captured = late_refresh(layout, cluster, NOW + 700)  # shard 0 settles: not written
    assert [row.index for row in captured[0][2]] == [0]
    retry_run(layout, load_model(TESTBED, Profile), scheduler(cluster), [0])
    assert not settled.add(*captured[0])  # nothing it read may be kept now
    assert settled.load(layout).shards == [1]
    data = compare(layout, cluster, NOW + 700)
    assert (data["shards"][0]["state"], data["shards"][0]["attempt"]) == ("pending", 2)


def test_a_row_read_before_a_retry_that_died_is_not_kept(tmp_path: Path) -> None:
    """A status reads shard 0 settled; a retry marks it pending, creates attempt 2 and
    dies before it can invalidate the row; then the slow status adds what it had read.
    The pending mark is the only trace of the retry: the row must not be kept."""
    layout = make_run(tmp_path, [Shard("failed", "boom", updated_at=NOW - 30),
                                 Shard("winner")])
    cluster = Cluster()
    compare(layout, cluster, NOW)
    captured = late_refresh(layout, cluster, NOW + 700)  # shard 0 settles: not written
    dying_retry(layout, cluster, [0])
    assert settled.load(layout).pending == {0}
    settled.add(*captured[0])
    assert 0 not in settled.load(layout).shards
    data = compare(layout, cluster, NOW + 700)
    assert (data["shards"][0]["state"], data["shards"][0]["attempt"]) == ("created", 2)


def test_the_submission_records_summary_is_kept_and_checked(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """The index keeps the job ids of the submission records (what totals counts), named
    by the records' identities: used while they are the same files, read again (and kept
    again) after a record is replaced, not kept when one changes while it is read."""
    layout = make_run(tmp_path, [Shard("winner")] * 3)
    cluster = Cluster()
    compare(layout, cluster, NOW)  # every shard settles: the summary is kept too
    kept = settled.load(layout).submissions
    assert kept == {"key": submissions_key(layout), "job_ids": ["500"]}
    opens = Opens(monkeypatch, layout.root)
    assert refresh(layout, scheduler(cluster), NOW).job_ids == ["500"]
    assert opens.paths == [str(layout.settled_json)]  # no submission record read
    record = json.loads((layout.submissions / "0001.json").read_text())
    write_json_atomic(layout.submissions / "0001.json", {**record, "job_id": "501"})
    assert compare(layout, cluster, NOW)  # job ids read again: 501
    assert settled.load(layout).submissions == {"key": submissions_key(layout),
                                                "job_ids": ["501"]}
    real = status.submission_views

    def racing(layout_: RunLayout) -> Any:  # a submit writes a record while it is read
        views = real(layout_)
        write_json_atomic(layout.submissions / "0002.json", {**record, "number": 2,
                                                             "job_id": "502"})
        return views

    monkeypatch.setattr(status, "submission_views", racing)
    write_json_atomic(layout.submissions / "0001.json", {**record, "job_id": "503"})
    assert refresh(layout, scheduler(cluster), NOW).job_ids == ["503"]  # what it read
    assert settled.load(layout).submissions["job_ids"] == ["501"]  # but not kept
    monkeypatch.setattr(status, "submission_views", real)
    assert compare(layout, cluster, NOW)
    assert settled.load(layout).submissions["job_ids"] == ["502", "503"]


def test_rows_malformed_behind_a_valid_digest_are_named(tmp_path: Path) -> None:
    """Only a hand edit that recomputes the digest can make the header's shards wrong: a
    status that needs the rows by shard rebuilds the index with the note; one that only
    needs the header's codes and sums says which file to remove, in one line."""
    def forge(layout: RunLayout) -> None:
        path = layout.settled_json
        head, _, rest = path.read_bytes().partition(b"\n")
        body = json.dumps({**json.loads(head), "shards": "x"}).encode() + b"\n" + \
            rest[:rest.rindex(b"#")]
        path.write_bytes(body + b"#sha256=" + hashlib.sha256(body).hexdigest().encode())

    layout = make_run(tmp_path / "a", [Shard("winner")] * 3 + [Shard("running")])
    cluster = Cluster()
    cluster.queue["500_3"] = "RUNNING"
    compare(layout, cluster, NOW)
    forge(layout)
    data = compare(layout, cluster, NOW)
    assert any("settled index not used" in n and "'shards' is not a list" in n
               for n in data["notes"])
    whole = make_run(tmp_path / "b", [Shard("winner")] * 3 +
                     [Shard("failed", "boom", updated_at=NOW - 3600)])
    compare(whole, cluster, NOW)
    forge(whole)
    fresh = refresh(whole, scheduler(cluster), NOW)
    assert json.loads(fresh.json_bytes())["counts"] == {"failed": 1, "succeeded": 3}
    with pytest.raises(StateError, match="remove observer/settled.json"):
        fresh.column("job_id")


def test_the_plan_is_read_again_when_plan_json_is_another_file(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("winner")] * 2)
    cluster = Cluster()
    compare(layout, cluster, NOW)
    data = json.loads(layout.plan_json.read_text())
    data["name"] = "renamed"
    layout.plan_json.chmod(0o600)
    os.unlink(layout.plan_json)
    layout.plan_json.write_text(json.dumps(data))
    assert compare(layout, cluster, NOW)["name"] == "renamed"


def test_settled_means_only_a_retry_can_change_it(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [
        Shard("winner"), Shard("failed", "boom", updated_at=NOW - 3600),
        Shard("failed", "boom", updated_at=NOW - 30), Shard("succeeded"),
        Shard("running"), Shard("cancelled", updated_at=NOW - 3600)])
    first = Expected(1, None, 0.0)
    views = status._rescan(layout, [status.scan_shard(layout, i, first) for i in range(6)],
                           lambda i: first)
    assert [status.settles(v, NOW) for v in views] == [True, True, False, False, False, True]


def test_a_settled_shard_is_judged_by_its_records_whether_or_not_squeue_is_asked(
        tmp_path: Path) -> None:
    """A long-failed shard whose job squeue still lists as COMPLETED: failed, as the index
    keeps it, also in a refresh that asks squeue about another shard (was: a conflict,
    ``unknown``, only in the refreshes that happened to call squeue)."""
    layout = make_run(tmp_path, [Shard("failed", "boom", updated_at=NOW - 3600),
                                 Shard("running", progress=1)])
    cluster = Cluster()
    cluster.queue.update({"500_0": "COMPLETED", "500_1": "RUNNING"})
    data = compare(layout, cluster, NOW)
    assert [c[0].rsplit("/", 1)[-1] for c in cluster.calls][:1] == ["squeue"]
    assert (data["shards"][0]["state"], data["shards"][0]["reason"]) == ("failed", "boom")


def test_cancel_leaves_the_index_agreeing(tmp_path: Path) -> None:
    from synthbatch.control.runs.cancel import cancel_run

    layout = make_run(tmp_path, [Shard("winner")] * 3 + [Shard("submitted")] * 2)
    cluster = Cluster()
    cluster.queue.update({"500_3": "PENDING", "500_4": "PENDING"})
    compare(layout, cluster, NOW)
    original = cluster.__call__

    def with_scancel(argv: List[str], timeout_s: float) -> CommandResult:
        if argv[0].endswith("scancel"):
            cluster.queue.update({"500_3": "CANCELLED", "500_4": "CANCELLED"})
            return CommandResult(list(argv), 0, "", "")
        return original(argv, timeout_s)

    cancel_run(layout, Scheduler(runner=with_scancel), wait_s=0)
    data = compare(layout, cluster, NOW + 1)
    assert [r["state"] for r in data["shards"]] == ["succeeded"] * 3 + ["cancelled"] * 2


# ----------------------------------------------------------------------------- large records


def test_a_submission_record_of_100000_shards_is_read(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("winner")])
    record = SubmissionRecord(number=2, argv=("sbatch",), job_id="600",
                              attempts={str(i): 1 for i in range(100_000)},
                              submitted_at=NOW, released=True)
    write_json_atomic(layout.submission_json(2), record.to_dict())
    assert layout.submission_json(2).stat().st_size > 1 << 20
    assert len(submission_views(layout)[1].attempts) == 100_000


def test_rows_with_fields_beyond_the_columns_are_kept_as_they_are(tmp_path: Path) -> None:
    """A row's reason and log (no column of their own) are kept in ``extra`` and come back
    the same, as ShardRow and as text; a row with figures of a running shard is never
    kept."""
    layout = make_run(tmp_path, [Shard("winner")] * 3)
    rows = [ShardRow(0, "succeeded", "odd", 1, None, 10, 10),
            ShardRow(1, "lost", "lost: x", 1, "5_1", 10, 2, 2, 4, 1, "/l")]
    running = ShardRow(2, "succeeded", None, 1, None, 10, 10, aliases={"m": {"tokens": 3}})
    assert settled.add(layout, settled.Index(), rows + [running], RUN_ID, 3)
    index = settled.load(layout)
    assert index.rows([0, 1]) == rows and [index.row(0), index.row(1)] == rows
    assert index.shards == [0, 1]
    assert index.texts == [json.dumps(r.to_dict(), sort_keys=True) for r in rows]


def test_an_index_the_old_code_wrote_is_rebuilt_once_and_said_once(tmp_path: Path) -> None:
    """The settled index is derived data: one in the format before ShardRow lines
    (schema 3: header, a columns line, the rows, a digest) breaks nothing; the first
    status says it was not used, rebuilds it from the records, and the next one reads the
    rebuilt index without a note."""
    layout = make_run(tmp_path, [Shard("winner"), Shard("failed", "boom",
                                                        updated_at=NOW - 7200)])
    rows = [{"index": 0, "state": "succeeded", "reason": None, "attempt": 1,
             "job_id": "500_0", "records": 10, "records_done": 10, "tokens": 0,
             "record_failures": 0, "records_dropped": 0},
            {"index": 1, "state": "failed", "reason": "boom", "attempt": 1,
             "job_id": "500_1", "records": 10, "records_done": 0, "tokens": 0,
             "record_failures": 0, "records_dropped": 0, "log": None}]
    header = {"schema_version": 3, "run_id": RUN_ID, "root": str(layout.root),
              "lineage": "0123456789abcdef", "generation": 0, "pending": [],
              "invalidated": {}, "plan": None, "plan_identity": None, "ended_at": NOW,
              "state": "sf", "last": 1, "extra": {"1": {"reason": "boom"}},
              "sums": {"records_done": 10, "tokens": 0, "record_failures": 0,
                       "records_dropped": 0}, "submissions": None}
    columns = {"shards": [0, 1], "columns": {
        name: [row[name] for row in rows] for name in
        ("attempt", "job_id", "records", "records_done", "tokens", "record_failures",
         "records_dropped")}}
    body = b"\n".join([json.dumps(header, separators=(",", ":")).encode(),
                       json.dumps(columns, separators=(",", ":")).encode(),
                       *(json.dumps(r, sort_keys=True).encode() for r in rows), b""])
    path = layout.settled_json
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body + b"#sha256=" + hashlib.sha256(body).hexdigest().encode() + b"\n")
    cluster = Cluster()
    first = compare(layout, cluster, NOW)
    said = [n for n in first["notes"] if n.startswith("settled index not used")]
    assert len(said) == 1 and "not a schema_version 4 settled index" in said[0]
    assert first["shards"] == rows and first["counts"] == {"failed": 1, "succeeded": 1}
    assert json.loads(path.read_bytes().partition(b"\n")[0])["schema_version"] == 4
    again = compare(layout, cluster, NOW)
    assert again == {**first, "notes": [n for n in first["notes"] if n not in said]}
    assert settled.load(layout).rows([0, 1]) == [ShardRow.from_dict(r) for r in rows]


def test_a_settled_runs_cost_reads_the_plan_the_index_keeps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost's plan facts (partition, GPUs per alias) come from the settled index's copy
    of the plan: a later status of a settled run opens no ``plan.json`` (~9 MiB at 100,000
    shards, ~120 ms to parse); an index kept before the copy had them is rewritten once."""
    from synthbatch.control.runs.observed import observed

    layout = make_run(tmp_path, [Shard("winner", progress=10)] * 4)
    cluster = Cluster()
    profile = tmp_path / "p.toml"
    profile.write_text("schema_version = 1\nworkspace = '/x'\n[pricing]\nper_gpu_hour = 2.0\n")
    first = observed(layout, scheduler(cluster), profile).summary["cost"]
    index = settled.load(layout)
    assert index.plan is not None and index.plan["gpus"] and "partition" in index.plan
    older = {k: v for k, v in index.plan.items() if k not in ("partition", "gpus")}
    index.plan = older  # as an index written before the cost facts were kept
    layout.settled_json.chmod(0o600)
    layout.settled_json.write_bytes(settled.encode(index, layout, index.run_id))
    assert observed(layout, scheduler(cluster), profile).summary["cost"] == first
    assert settled.load(layout).plan == {**older, "partition": index_plan_facts(layout)[0],
                                         "gpus": index_plan_facts(layout)[1]}
    opens = Opens(monkeypatch, layout.root)
    assert observed(layout, scheduler(cluster), profile).summary["cost"] == first
    assert str(layout.plan_json) not in opens.paths


def index_plan_facts(layout: RunLayout) -> Tuple[Any, Any]:
    """The partition and GPUs per alias of the run's plan, read from ``plan.json``."""
    plan = load_plan_view(layout)
    return plan.partition, plan.gpus
