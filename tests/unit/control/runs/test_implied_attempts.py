"""First attempts without records: submit writes nothing per shard, every reader sees
each one as its submission record implies it, and the first writer makes its folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from synthbatch.agent_stdlib.attempts import load_attempt
from synthbatch.control.runs.cancel import cancel_run
from synthbatch.control.runs.retry import select
from synthbatch.control.runs.status.records import shard_scanner
from synthbatch.control.runs.status.refresh import observe
from synthbatch.control.runs.store import load_plan
from synthbatch.control.slurm.scheduler import Scheduler
from tests.fakes import World, harness_plan

SHARDS = 4


@pytest.fixture
def world(tmp_path: Path) -> World:
    world = World(tmp_path)
    world.submit(harness_plan(SHARDS, 5), world.cluster())
    return world


def _shards(world: World) -> list:
    return sorted(p.name for p in (world.layout.root / "shards").iterdir())


def test_a_fresh_submit_is_seen_pending_and_nothing_per_shard_is_written(world) -> None:
    data = observe(world.layout, Scheduler(runner=world.cluster()))
    job = next(iter(world.cluster().jobs()))
    assert [(s["state"], s["job_id"], s["attempt"]) for s in data["shards"]] == [
        ("pending", f"{job}_{i}", 1) for i in range(SHARDS)]
    assert _shards(world) == []  # status wrote nothing either


def test_a_job_gone_before_its_agent_started_is_recorded_by_status(world) -> None:
    cluster = world.cluster()
    job = next(iter(cluster.jobs()))
    cluster.set(job, 2, "CANCELLED")  # scancel-ed outside synthbatch while pending
    data = observe(world.layout, Scheduler(runner=cluster))
    assert data["shards"][2]["state"] == "cancelled"
    record = load_attempt(world.layout.attempt(2, 1).attempt_json)
    assert (record.state, record.revision, record.job_id) == ("cancelled", 2, f"{job}_2")
    assert _shards(world) == ["shard-00002"]
    choice, = select(world.layout, load_plan(world.layout)).choices
    assert (choice.shard, choice.attempt, choice.previous) == (2, 2, 1)


def test_cancel_of_pending_shards_scancels_them_and_records_each(world) -> None:
    cluster = world.cluster()
    job = next(iter(cluster.jobs()))
    data = cancel_run(world.layout, Scheduler(runner=cluster), [1, 3], wait_s=5.0)
    assert data["scancelled"] == [f"{job}_1", f"{job}_3"]
    assert data["converged"] and data["states"] == {"1": "cancelled", "3": "cancelled"}
    assert [load_attempt(world.layout.attempt(i, 1).attempt_json).state
            for i in (1, 3)] == ["cancelled"] * 2
    assert _shards(world) == ["shard-00001", "shard-00003"]
    scan = shard_scanner(world.layout)
    assert [scan(i).attempt.state for i in (0, 2)] == ["submitted"] * 2


def test_a_named_retry_of_a_pending_shard_is_refused_in_status_words(world) -> None:
    selection = select(world.layout, load_plan(world.layout), [0])
    assert selection.refused == {0: "shard 0 is submitted (attempt 1)"}
    assert _shards(world) == []


def test_status_lists_the_shards_once_instead_of_a_lookup_each(world, monkeypatch) -> None:
    from synthbatch.control.runs.status import records as store

    looked: list = []
    real = store._exists
    monkeypatch.setattr(store, "_exists", lambda path: looked.append(path) or real(path))
    data = observe(world.layout, Scheduler(runner=world.cluster()))
    assert data["counts"] == {"pending": SHARDS} and looked == []


def test_a_shard_read_again_after_a_write_is_not_taken_from_the_listing(world) -> None:
    from synthbatch.agent_stdlib import states
    from synthbatch.agent_stdlib.attempts import advance_attempt
    from synthbatch.control.runs.status import records as store
    from synthbatch.control.runs.status import refresh as status
    from tests.fakes import first_record

    layout = world.layout
    expected = store.expected_lookup(store.submission_views(layout),
                                     store.load_plan_view(layout).arrays,
                                     store.committed_at(layout), store.shard_folders(layout))
    before = [store.scan_shard(layout, i, expected(i)) for i in range(SHARDS)]
    advance_attempt(layout.attempt(1, 1).attempt_json, states.RUNNING,
                    first=first_record(layout, 1))  # its agent starts, as status reconciles
    after = status._rescan(layout, before, expected)
    assert [v.attempt.state for v in after] == ["submitted", "running", "submitted",
                                                "submitted"]
