"""The read model: one ShardRow per shard, the row ``status --json`` prints (issue 29)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synthbatch.control.runs.results import RunStatus
from synthbatch.control.runs.status import verdict as norm
from synthbatch.control.runs.status.refresh import observe, refresh
from synthbatch.control.runs.status.rows import ShardRow
from synthbatch.control.slurm.scheduler import Scheduler
from tests.fakes import NOW, FakeSlurm, Shard, make_run

ROWS = [
    ShardRow(0, norm.SUCCEEDED, None, 1, "5_0", 10, 10, 0, 40, 0),
    ShardRow(1, norm.FAILED, "boom (log /x: y)", 2, "6_1", 10, 3, 1, 12, 2, "/x"),
    ShardRow(2, norm.RUNNING, None, 1, "5_2", 10, 4, aliases={"gen": {"requests": 4}}),
    ShardRow(3, norm.LOST, "lost: gone", 1, None, 10),
    ShardRow(4, norm.PENDING, "Priority", 1, "5_4", 10),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.state for r in ROWS])
def test_a_row_reads_back_as_it_was_printed(row: ShardRow) -> None:
    data = json.loads(json.dumps(row.to_dict()))
    assert ShardRow.from_dict(data) == row
    assert ("log" in data) == (row.state in norm.MAYBE_FAILED)
    assert ("aliases" in data) == (row.aliases is not None)


def test_status_json_rows_and_the_api_shards_are_the_read_model(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("winner"), Shard("failed", "boom",
                                                        updated_at=NOW - 7200)])
    fresh = refresh(layout, Scheduler(runner=FakeSlurm()), now=NOW)
    assert [type(r) for r in fresh.rows()] == [ShardRow, ShardRow]
    data = observe(layout, Scheduler(runner=FakeSlurm()), now=NOW)  # from the index now
    assert data["shards"] == [r.to_dict() for r in fresh.rows()]
    assert RunStatus.from_dict(data).shards == tuple(fresh.rows())
