"""Crash consistency of the state store: SIGKILL at every write step (docs/reliability.md).

The scenario is a whole run of two shards through the real writers: submit (stage, commit,
sbatch, record, release), the allocation controller for each array task (attempt running,
readiness starting -> ready -> stopping -> stopped, progress after every record, output,
result, attempt succeeded, winner; shard 1's first client fails after 3 records), status,
retry (attempt 2, resuming attempt 1's records), cancel of that attempt while it is
pending, retry again (attempt 3), its allocation, status. Slurm is ``FileCluster``, a fake
whose jobs live in a file; the agent's servers, proxy and client processes are replaced
in-process (``tests.fakes.run_agent``), everything else is the product's code.

Each case runs the scenario in a forked child that is SIGKILLed: just before its k-th
write step (every k from 1 to the last), or at a random moment. Then:

* a fresh reader finds every record whole or absent (each parses with its contract; no
  shard shows damage) and ``status`` of the run (on a copy) answers without an error;
* the run converges: a forked child plays what happens next (the killed allocation is
  requeued or its job fails; ``status`` reconciles and recovers submissions, ``retry``
  resubmits, allocations run) until status says succeeded, with its clock 1000 s ahead;
* the result equals the uninterrupted run's: every shard succeeded with one verified
  winner, the merged records byte for byte; every attempt terminal, every readiness
  closed, no job left; a winner present at the kill is unchanged, no record went back.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple

import pytest

import synthbatch.agent_stdlib.allocation.controller  # noqa: F401 - imported once, not in every child
import synthbatch.agent_stdlib.client.generate  # noqa: F401
from synthbatch.agent_stdlib import states
from synthbatch.agent_stdlib.contracts import (
    AttemptRecord,
    Plan,
    ProgressRecord,
    ReadinessRecord,
    ResultManifest,
    RunRecord,
    SubmissionRecord,
)
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.publish import verify_winner
from synthbatch.agent_stdlib.statefile import load_record, read_json
from synthbatch.control.runs.cancel import cancel_run
from synthbatch.control.runs.merge import merge_run
from synthbatch.control.runs.retry import retry_run
from synthbatch.control.runs.status.records import scan_shard
from synthbatch.control.runs.status.refresh import observe
from synthbatch.control.runs.submit.arrays import remove_uncommitted
from synthbatch.control.slurm.scheduler import Scheduler
from tests import fakes
from tests.fakes import (
    FakeClient,
    FileCluster,
    KillSwitch,
    World,
    budget,
    drive,
    fork_call,
    harness_plan,
    run_jobs,
)

SHARDS, PER_SHARD = 2, 5
CLOCK_AHEAD_S = 1000.0  # the resumed writers run "later": past every grace period
ACTIVE = ("PENDING", "RUNNING")


PLAN = harness_plan(SHARDS, PER_SHARD)
PROFILE = fakes.testbed_profile()  # (imported by name, pytest would collect it)
CLIENT = FakeClient(fail=lambda shard, attempt: (shard, attempt) == (1, 1))


def scenario(world: World, cluster: FileCluster) -> None:
    """The whole run, as the user and Slurm drive it (see the module docstring)."""
    sched = Scheduler(runner=cluster)
    layout = world.layout
    world.submit(PLAN, cluster)
    run_jobs(world, cluster, CLIENT)
    observe(layout, sched)
    retry_run(layout, PROFILE, sched)
    cancel_run(layout, sched, [1], wait_s=5.0)
    retry_run(layout, PROFILE, sched)
    run_jobs(world, cluster, CLIENT)
    observe(layout, sched)


def converge(world: World, cluster: FileCluster, ahead_s: float = CLOCK_AHEAD_S) -> None:
    """What happens after the crash, until status says succeeded (clock ``ahead_s``)."""
    real = time.time
    time.time = lambda: real() + ahead_s  # type: ignore[assignment]
    layout = world.layout
    if not layout.run_json.exists():  # never committed: the user submits again
        if layout.root.exists():
            remove_uncommitted(layout)
        scenario(world, cluster)
    drive(world, cluster, CLIENT)


# ----------------------------------------------------------------------------- checks

RECORDS = {"run.json": RunRecord, "plan.json": Plan, "attempt.json": AttemptRecord,
           "readiness.json": ReadinessRecord, "progress.json": ProgressRecord,
           "result.json": ResultManifest}


def state_files(layout: RunLayout) -> Iterator[Path]:
    """Every JSON state file of the run (temp files of an interrupted write excluded)."""
    if not layout.root.exists():
        return
    for path in sorted(layout.root.rglob("*.json")):
        if "/output/" not in str(path) and not path.name.startswith(".tmp-"):
            yield path


def check_readable(world: World) -> Dict[str, Any]:
    """Every record whole or absent; no shard damaged; status answers. What was read."""
    layout = world.layout
    seen: Dict[str, Any] = {}
    committed = layout.run_json.exists()
    for path in state_files(layout):
        rel = str(path.relative_to(layout.root))
        if path.name == "settled.json":  # one row a line, not one JSON document
            from synthbatch.control.runs.status import index as settled

            index = settled.load(layout)
            assert index.problem is None, index.problem
            seen[rel] = path.read_bytes()
        elif path.parent.name == "submissions":
            seen[rel] = load_record(path, SubmissionRecord)
        elif path.name == "winner.json":
            shard = int(path.parent.name.split("-")[1])
            seen[rel] = verify_winner(path, shard)
            seen[rel + ".bytes"] = path.read_bytes()
        elif path.name in RECORDS:
            seen[rel] = load_record(path, RECORDS[path.name])
        else:  # cancels/, observer/: plain JSON objects
            seen[rel] = read_json(path)
    if not committed:
        return seen
    for shard in range(SHARDS):
        view = scan_shard(layout, shard)
        assert view.problem is None and view.winner_problem is None, view
        assert view.progress_problem is None, view
        succeeded = [a for key, a in seen.items() if key.startswith(f"shards/shard-{shard:05d}/")
                     and isinstance(a, AttemptRecord) and a.state == states.SUCCEEDED]
        assert len(succeeded) <= 1, succeeded  # never two winners in the making
    copy = world.root / "reader"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(world.root, copy, symlinks=True, ignore=shutil.ignore_patterns("reader"))
    view = World(copy)
    data = observe(view.layout, Scheduler(runner=view.cluster()))  # the status code path
    assert len(data["shards"]) == SHARDS and data["state"] in (
        "running", "failed", "cancelled", "succeeded"), data
    return seen


def final_state(world: World) -> Tuple[Any, ...]:
    """What must equal the uninterrupted run: states, records, the merged bytes."""
    layout = world.layout
    data = observe(layout, Scheduler(runner=world.cluster()))
    for shard in range(SHARDS):
        winner = verify_winner(layout.winner_json(shard), shard)
        assert winner is not None, shard
        record = load_record(layout.attempt(shard, winner.attempt).attempt_json, AttemptRecord)
        assert record.state == states.SUCCEEDED
        for attempt_json in (layout.shard_dir(shard) / "attempts").glob("*/attempt.json"):
            attempt = load_record(attempt_json, AttemptRecord)
            assert attempt.state in states.TERMINAL, attempt
            assert attempt.state != states.SUCCEEDED or attempt.attempt == winner.attempt
            readiness = load_record(attempt_json.parent / "readiness.json", ReadinessRecord)
            assert readiness is None or readiness.state in states.READINESS_CLOSED, readiness
    for job, info in world.cluster().jobs().items():
        assert all(t["state"] not in ACTIVE for t in info["tasks"].values()), (job, info)
    out = world.root / "merged.jsonl"
    merge_run(layout, out, allow_partial=False)
    return (data["state"], [(r["state"], r["records_done"]) for r in data["shards"]],
            out.read_bytes())


def reachable(old: str, new: str) -> bool:
    """True when attempt state ``new`` is ``old`` or follows it through the edge table."""
    seen, todo = {old}, [old]
    while todo:
        for nxt in states.ATTEMPT_EDGES[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return new in seen


def check_kept(world: World, before: Dict[str, Any]) -> None:
    """Nothing read at the kill went back: winners unchanged, revisions and states on."""
    layout = world.layout
    for rel, value in before.items():
        path = layout.root / rel
        if rel.endswith("winner.json.bytes"):
            assert Path(str(path)[:-6]).read_bytes() == value, rel
        elif isinstance(value, AttemptRecord) and path.exists():
            now = load_record(path, AttemptRecord)
            assert now.revision >= value.revision and reachable(value.state, now.state), \
                (value, now)
        elif isinstance(value, ReadinessRecord) and path.exists():
            assert load_record(path, ReadinessRecord).revision >= value.revision, rel


# ----------------------------------------------------------------------------- the cases


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where cases live: tmpfs when there is one (a SIGKILL loses no page cache, so the
    fsyncs the writers make matter for power loss only, not here)."""
    shm = Path("/dev/shm")
    root = Path(tmp_path_factory.mktemp("crash")) if not os.access(shm, os.W_OK) else \
        Path(shm / f"synthbatch-crash-{os.getpid()}")
    root.mkdir(exist_ok=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def new_world(base: Path, name: str) -> World:
    world = World(base / name)
    shutil.rmtree(world.root, ignore_errors=True)
    world.root.mkdir()
    return world


@pytest.fixture(scope="module")
def reference(base: Path) -> Dict[str, Any]:
    """The uninterrupted run: its final state, its number of write steps and duration."""
    world = new_world(base, "reference")
    counter = world.root / "steps"

    def count() -> None:
        kill = KillSwitch().install()
        scenario(world, world.cluster(kill))
        kill.paused += 1
        counter.write_text(str(kill.count))

    log = world.root / "children.log"
    started = time.monotonic()
    assert fork_call(count, log=log) == 0, log.read_text()
    duration = time.monotonic() - started
    assert fork_call(lambda: converge(world, world.cluster()), log=log) == 0, log.read_text()
    return {"final": final_state(world), "steps": int(counter.read_text()),
            "duration": duration}


def settle_killed(world: World, rng: random.Random) -> None:
    """The allocation that was running when its process died: requeued (a node failure)
    or its job fails (``kill -9`` of the batch script), at random."""
    cluster = world.cluster()
    for job, info in cluster.jobs().items():
        for task, entry in info["tasks"].items():
            if entry["state"] == "RUNNING":
                requeue = rng.random() < 0.5
                cluster.set(job, int(task), "PENDING" if requeue else "FAILED", requeue)


def play(base: Path, reference: Dict[str, Any], name: str, seed: int,
         at: Optional[int] = None, after_s: Optional[float] = None,
         again_at: Optional[int] = None) -> bool:
    """One case; False when the child finished before the kill came. ``again_at`` kills
    the first recovery too, at that write step (then a second recovery runs)."""
    world = new_world(base, name)
    rng = random.Random(seed)
    log = world.root / "children.log"

    def doomed() -> None:
        scenario(world, world.cluster(KillSwitch(at).install()))

    def recover(kill_at: Optional[int], ahead_s: float) -> int:
        def child() -> None:
            kill = KillSwitch(kill_at).install() if kill_at else None
            converge(world, world.cluster(kill), ahead_s)
        return fork_call(child, log=log)

    status = fork_call(doomed, kill_after_s=after_s, log=log)
    if status == 0:
        assert at is None, f"the kill at write step {at} never came"
        return False
    assert status == -9, f"the scenario failed by itself (exit {status}): {log.read_text()}"
    settle_killed(world, rng)
    seen = check_readable(world)
    status = recover(again_at, CLOCK_AHEAD_S)
    if again_at is not None and status == -9:  # later again: past the grace periods anew
        settle_killed(world, rng)
        check_readable(world)
        status = recover(None, 2 * CLOCK_AHEAD_S)
    assert status == 0, f"case {name}: the run did not converge: {log.read_text()[-3000:]}"
    check_kept(world, seen)
    assert final_state(world) == reference["final"], name
    return True


CHUNKS = 4  # the cases of each target in four tests: xdist spreads them over its workers
TWICE = (150, 2_000)  # double-kill cases in make test, and in the long mode


def test_the_uninterrupted_run_succeeds_with_every_record(reference: Dict[str, Any]) -> None:
    state, shards, merged = reference["final"]
    assert state == "succeeded" and shards == [("succeeded", PER_SHARD)] * SHARDS
    indices = [json.loads(line)["index"] for line in merged.splitlines()]
    assert indices == list(range(SHARDS * PER_SHARD))
    assert reference["steps"] > 100  # the scenario writes: the kills below land in it


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_a_kill_at_every_write_step_converges(base: Path, reference: Dict[str, Any],
                                              chunk: int) -> None:
    for step in range(1 + chunk, reference["steps"] + 1, CHUNKS):
        assert play(base, reference, f"step-{step}", seed=step, at=step)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_kills_at_random_moments_converge(base: Path, reference: Dict[str, Any],
                                          chunk: int) -> None:
    # with the every-step kills and the double kills, 1,000 kills in make test
    wanted = -(-budget(max(0, 1_000 - reference["steps"] - 2 * TWICE[0]), 10_000) // CHUNKS)
    rng, kills, tries = random.Random(7 + chunk), 0, 0
    span = 0.9 * reference["duration"]
    while kills < wanted:
        tries += 1
        assert tries < 3 * wanted + 10, "the kills keep missing the scenario"
        hit = play(base, reference, f"random-{chunk}-{tries}", seed=tries,
                   after_s=rng.uniform(0.0, span))
        kills += hit
        if not hit:  # the scenario runs faster now than the reference did (load moved)
            span *= 0.8


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_a_recovery_killed_too_converges(base: Path, reference: Dict[str, Any],
                                         chunk: int) -> None:
    # double kills: one in the scenario, one in the status/retry/allocation work that
    # recovers from it
    rng = random.Random(11 + chunk)
    for case in range(-(-budget(*TWICE) // CHUNKS)):
        at = rng.randint(1, reference["steps"])
        assert play(base, reference, f"twice-{chunk}-{case}", seed=case, at=at,
                    again_at=rng.randint(1, 120))
