"""Runs split into several arrays on a cluster with a small MaxArraySize (real Slurm).

The no-accounting testbed has ``MaxArraySize=4`` (Makefile: NOACCT_MAX_ARRAY_SIZE), so a
run of 6 shards goes out as two arrays: shards 0-3 are tasks 0-3 of the first, shards 4-5
tasks 0-1 of the second. A submit that dies after the second ``sbatch`` leaves that array
held with no attempt records yet (submit writes each once, ``submitted``, after every
sbatch); ``status`` recovers it, and must record each attempt under its own task's job id
(``<job>_0``, ``<job>_1``), or the agents refuse to run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.control import api
from synthbatch.control.runs.status import records as status_records
from synthbatch.control.runs.status.records import shard_scanner
from synthbatch.control.runs.submit import arrays as submit
from tests.fakes import Crash, crash_on_call
from tests.integration.runs import cli_json, wait_final, write_profile, write_run

pytestmark = pytest.mark.slurm


def test_recovery_of_a_crashed_split_submit_runs_every_shard(slurm_cluster_noacct, tmp_path,
                                                              python_exe, monkeypatch):
    config = slurm_cluster_noacct.run("scontrol", "show", "config").stdout
    max_size = int(re.search(r"^MaxArraySize\s*=\s*(\d+)", config, re.M).group(1))
    assert max_size <= 4, "the no-accounting testbed must have a small MaxArraySize"
    shards = max_size + 2
    profile = write_profile(tmp_path, python_exe)
    run_file = write_run(tmp_path, records=2 * shards, shards=shards, latency=0.01)
    real = submit._release_held  # dies after both arrays' sbatch, before any release
    monkeypatch.setattr(submit, "_release_held", crash_on_call(real, 1))
    with pytest.raises(Crash):
        api.submit(run_file, str(profile))
    monkeypatch.setattr(submit, "_release_held", real)
    (root,) = (tmp_path / "workspace" / "runs").iterdir()
    layout = RunLayout(root)
    records = submit.load_submissions(layout)
    assert [r.released for r in records] == [False, False]
    first, second = records[0].job_id, records[1].job_id
    assert first is not None and second is not None

    monkeypatch.setattr(status_records, "RECOVERY_GRACE_S", 0.0)  # the crashed submit is long gone
    monkeypatch.setattr(submit, "RECOVERY_GRACE_S", 0.0)
    status = cli_json("status", root.name, "--profile", str(profile))
    assert f"submission 1: job {first} released" in status["notes"]
    assert f"submission 2: job {second} released" in status["notes"]
    scan = shard_scanner(layout)  # implied by the records, or written by agents since
    jobs = [scan(s).attempt.job_id for s in range(shards)]
    assert jobs == [f"{first}_{s}" for s in range(max_size)] + [f"{second}_0", f"{second}_1"]

    final = wait_final(root.name, Path(profile), timeout_s=180)
    assert final["state"] == "succeeded", final["failures"]
    assert final["counts"] == {"succeeded": shards}
