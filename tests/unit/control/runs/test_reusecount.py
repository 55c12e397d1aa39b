"""``status`` counts the cells a run took from reused runs apart (issue 31): "reused N of
M cells" at run level and in ``--json``; the average records/s counts generated records."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from synthbatch.agent_stdlib.contracts import Plan, ProgressRecord
from synthbatch.agent_stdlib.statefile import write_json_atomic
from synthbatch.control import api
from synthbatch.control.cli.render import status_text
from tests.fakes import NOW, Shard, invoke, make_run

RUN = "obs-20240101-000000-abcdef"


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)


def _progress(path: Path, done: int, reused: int, generated: int, whole: int) -> None:
    write_json_atomic(path, ProgressRecord(
        records_done=done, records_total=10, tokens=3 * generated, requests_per_s=1.0,
        updated_at=1.0, cells_reused=reused, cells_generated=generated,
        records_reused=whole).to_dict())


def _reusing(workspace: Path) -> Path:
    layout = make_run(workspace, [Shard("winner"),
                                  Shard("failed", reason="oom", updated_at=NOW + 100)])
    plan = Plan.from_dict(json.loads(layout.plan_json.read_text()))
    assert plan.client is not None
    os.chmod(layout.plan_json, 0o600)
    layout.plan_json.write_text(plan.replace(client=dataclasses.replace(
        plan.client, reuse={"old": "/w/runs/old"})).to_json())
    _progress(layout.attempt(0, 1).progress_json, 10, 30, 10, 6)
    _progress(layout.attempt(1, 1).progress_json, 4, 5, 3, 2)
    return layout.root


def test_status_says_how_many_cells_were_reused(workspace: Path, profile_file: Path) -> None:
    _reusing(workspace)
    status = api.status(RUN, profile_file)
    assert status.data["reuse"] == {"cells_reused": 35, "cells": 48, "records_reused": 8}
    assert "  reused 35 of 48 cells" in status_text(status.data).splitlines()
    done, active = status.records_done, status.data["totals"]["active_s"]
    assert active > 0 and done == 14
    assert status.records_per_s == round((done - 8) / active, 3)  # generated records only
    printed = invoke("status", RUN, "--profile", str(profile_file), "--json")
    assert json.loads(printed.output)["reuse"] == status.data["reuse"]


def test_a_run_that_reuses_nothing_reads_no_progress_for_it(workspace: Path,
                                                            profile_file: Path) -> None:
    layout = make_run(workspace, [Shard("winner")])
    _progress(layout.attempt(0, 1).progress_json, 10, 30, 10, 6)  # not a reusing plan
    status = api.status(RUN, profile_file)
    assert status.data["reuse"] is None
    assert not any("reused" in x for x in status_text(status.data).splitlines())
