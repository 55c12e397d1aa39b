"""The local backend's contract with the agent: identity, cause, requeue (no Slurm)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from synthbatch.agent_stdlib import localjob
from synthbatch.agent_stdlib.allocation import slurmjob
from synthbatch.agent_stdlib.allocation.errors import AllocationFailure
from synthbatch.agent_stdlib.allocation.invocation import resolve_shard
from tests.agent_runs import local_plan

ENV = {localjob.JOB_ID: "1203", localjob.ARRAY_JOB_ID: "1200",
       localjob.ARRAY_TASK_ID: "3", localjob.RESTART_COUNT: "1"}


def test_the_local_identity_is_read_from_its_own_variables(tmp_path: Path) -> None:
    ident = slurmjob.local_identity({**ENV, localjob.TASK_DIR: str(tmp_path),
                                     "SLURM_JOB_ID": "99"})
    assert (ident.key, ident.job_id, ident.restart_count, ident.num_nodes) == \
        ("1200_3", "1203", 1, 1)
    assert ident.local_dir == str(tmp_path) and ident.node == ident.nodelist
    outside = slurmjob.local_identity({"SLURM_JOB_ID": "99", "SLURM_ARRAY_TASK_ID": "1"})
    assert outside.job_id is None and outside.key is None and outside.local_dir is None
    # a Slurm allocation never reads the local variables
    assert slurmjob.identity({**ENV, localjob.TASK_DIR: str(tmp_path)}).job_id is None


def test_the_cause_the_supervisor_wrote_answers_why_sigterm_came(tmp_path: Path) -> None:
    ident = slurmjob.local_identity({**ENV, localjob.TASK_DIR: str(tmp_path)})
    assert slurmjob.termination_cause(ident) == slurmjob.CANCELLED  # nothing written: cancel
    localjob.write_cause(tmp_path, localjob.TIME_LIMIT, "TERM")
    assert slurmjob.termination_cause(ident) == slurmjob.TIME_LIMIT
    (tmp_path / localjob.CAUSE_FILE).write_text("{half")
    assert slurmjob.termination_cause(ident) == slurmjob.CANCELLED
    with pytest.raises(ValueError, match="unknown cause"):
        localjob.write_cause(tmp_path, "reboot", "TERM")


def test_a_requeue_is_a_request_file_refused_once_sigterm_was_sent(tmp_path: Path) -> None:
    ident = slurmjob.local_identity({**ENV, localjob.TASK_DIR: str(tmp_path)})
    assert slurmjob.requeue(ident) is True
    assert localjob.requeue_requested(tmp_path)
    localjob.clear(tmp_path)
    assert not localjob.requeue_requested(tmp_path)
    localjob.write_cause(tmp_path, localjob.CANCELLED, "TERM")
    assert slurmjob.requeue(ident) is False and not localjob.requeue_requested(tmp_path)
    plain = slurmjob.local_identity({})  # the local launcher without the local backend
    assert slurmjob.requeue(plain) is False
    assert slurmjob.termination_cause(plain) == slurmjob.CANCELLED


def test_the_shard_of_a_local_array_task() -> None:
    plan = local_plan("/usr/bin/python3", ["x"], records=5, shards=5)
    assert resolve_shard(plan, {localjob.ARRAY_TASK_ID: "3"}, None, None) == (3, 3)
    srun = plan.replace(runtime=dataclasses.replace(plan.runtime, launcher="srun"))
    with pytest.raises(AllocationFailure, match="SLURM_ARRAY_TASK_ID is not set"):
        resolve_shard(srun, {localjob.ARRAY_TASK_ID: "3"}, None, None)
