"""Restarts inside the allocation on the real Slurm testbed (issue 34): the client step's
task is killed mid-shard, the agent restarts the client step in the same allocation, the
new client resumes after the records already written, and the attempt succeeds."""

from __future__ import annotations

import json
import os
import re
import signal
from collections import Counter

import pytest

from synthbatch.agent_stdlib.statefile import read_json
from tests.integration.allocations import (
    assert_stopped_and_clean,
    make_plan,
    slurm_log,
    submit,
)
from tests.processes import processes_mentioning

pytestmark = pytest.mark.slurm

RECORDS = 40


def test_a_killed_client_is_restarted_in_the_allocation_and_resumes(
        slurm_cluster, tmp_path, agent_pyz, python_exe):
    model = "fake-restart"
    requests = tmp_path / "requests.jsonl"
    plan = make_plan(python_exe, model, ["--token-latency", "0.03", "--request-log",
                                         str(requests)], records=RECORDS)
    plan = plan.replace(restarts_in_allocation=2)
    job = submit(slurm_cluster, tmp_path, agent_pyz, python_exe, plan, model)
    try:
        slurm_cluster.wait_for(lambda: (read_json(job.paths.progress_json) or {})
                               .get("records_done", 0) >= 3, what="client progress")
        needle = f"generate --plan {job.layout.plan_json}"
        # the client step's task (not its srun): the process an OOM killer would take
        tasks = [line for line in processes_mentioning(needle)
                 if not line.split(": ", 1)[1].startswith("srun ")]
        assert len(tasks) == 1, tasks
        os.kill(int(tasks[0].split(":")[0]), signal.SIGKILL)
        assert job.wait_done(timeout=120) == ["COMPLETED"]
    finally:
        slurm_cluster.run("scancel", job.array_id, check=False)
    attempt = assert_stopped_and_clean(job, "succeeded")
    assert attempt.restarts == 0  # the same execution of the same job: no requeue
    readiness = job.readiness()
    assert readiness.execution == 1 and readiness.restarts == {"client": 1}
    log = slurm_log(job)
    assert "restarting client (restart 1 of 2 in this allocation)" in log, log
    restarted = (job.paths.execution_logs(1) / "client.restart-1.log").read_text()
    kept = int(re.search(r"resuming after the (\d+) records", restarted).group(1))
    assert kept >= 3
    asked = Counter(int(re.search(r"about (\d+)\.", json.dumps(e)).group(1))
                    for e in map(json.loads, requests.read_text().splitlines())
                    if e.get("status") == 200)
    assert all(asked[i] == 1 for i in range(kept)), asked  # not requested again
    assert sorted(asked) == list(range(RECORDS))
    output = sorted(job.paths.output.glob("records-*.jsonl"))
    indices = [json.loads(line)["index"] for path in output
               for line in path.read_text().splitlines()]
    assert indices == list(range(RECORDS))


def test_a_server_that_crashes_once_is_restarted_as_a_step_and_the_attempt_succeeds(
        slurm_cluster, tmp_path, agent_pyz, python_exe):
    model = "fake-restart-server"
    marker = tmp_path / "crashed-once"
    plan = make_plan(python_exe, model, ["--token-latency", "0.02", "--exit-after", "5",
                                         "--exit-once", str(marker)], records=RECORDS)
    job = submit(slurm_cluster, tmp_path, agent_pyz, python_exe,
                 plan.replace(restarts_in_allocation=2), model)
    try:
        assert job.wait_done(timeout=120) == ["COMPLETED"]
    finally:
        slurm_cluster.run("scancel", job.array_id, check=False)
    assert_stopped_and_clean(job, "succeeded")
    assert marker.exists()
    assert job.readiness().restarts == {"client": 1, "server tiny/0": 1}
    assert "restarting server tiny/0, client" in slurm_log(job)
    assert (job.paths.execution_logs(1) / "server-tiny-0.restart-1.log").exists()
