"""Restarts inside the allocation, end to end with the agent and the fake server (local
launcher): a killed client is restarted and resumes, a crashed server is restarted, a
configuration error is not, and the bound ends it."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import time
from collections import Counter
from pathlib import Path
from typing import List

from click.testing import CliRunner

from synthbatch.agent_stdlib.attempts import load_attempt, load_readiness
from synthbatch.agent_stdlib.contracts import RunRecord
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import publish_immutable
from synthbatch.control.cli.main import cli
from tests.agent_runs import (
    TESTBED,
    local_plan,
    logged,
    records,
    run_allocation,
    server_argv,
    stage,
    start_allocation,
    wait_for_progress,
)
from tests.processes import processes_mentioning

RESUMED = re.compile(r"resuming after the (\d+) records already in the output")


def _plan(python: str, *server: str, records: int = 12, bound: int = 2):  # noqa: ANN202
    plan = local_plan(python, server_argv(python, *server), records=records)
    return dataclasses.replace(plan, restarts_in_allocation=bound)


def _indices(request_log: Path) -> List[int]:
    return [int(re.search(r"about (\d+)\.", str(e)).group(1)) for e in logged(request_log)
            if e.get("status") == 200]


def test_a_killed_client_is_restarted_and_resumes(tmp_path, agent_pyz, python_exe):
    requests = tmp_path / "requests.jsonl"
    plan = _plan(python_exe, "--token-latency", "0.05", "--request-log", str(requests))
    args = stage(tmp_path / "run", plan)
    layout = RunLayout(tmp_path / "run")
    paths = layout.attempt(0, 1)
    proc = start_allocation(python_exe, agent_pyz, args)
    wait_for_progress(paths, proc)
    clients = processes_mentioning(f"generate --plan {layout.plan_json}")
    assert len(clients) == 1, clients
    os.kill(int(clients[0].split(":")[0]), signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert load_attempt(paths.attempt_json).state == "succeeded"
    assert load_readiness(paths.readiness_json).restarts == {"client": 1}
    assert "restarting client (restart 1 of 2 in this allocation): the client was killed " \
           "by signal 9" in err
    logs = paths.execution_logs(1)
    kept = int(RESUMED.search((logs / "client.restart-1.log").read_text()).group(1))
    assert kept >= 2  # the records written before the kill
    # every record written before the kill was requested once: the restart resumed after
    # them (only the requests in flight at the kill were asked again)
    asked = Counter(_indices(requests))
    assert all(asked[i] == 1 for i in range(kept)), asked
    assert sorted(asked) == list(range(12))
    assert [r["index"] for r in records(paths.output)] == list(range(12))


def test_a_server_that_exits_once_is_restarted_and_the_attempt_succeeds(tmp_path, agent_pyz,
                                                                          python_exe):
    requests = tmp_path / "requests.jsonl"
    marker = tmp_path / "exited-once"
    plan = _plan(python_exe, "--token-latency", "0.02", "--exit-after", "4", "--exit-once",
                 str(marker), "--request-log", str(requests))
    args = stage(tmp_path / "run", plan)
    result = run_allocation(python_exe, agent_pyz, args)
    assert result.returncode == 0, result.stderr
    paths = RunLayout(tmp_path / "run").attempt(0, 1)
    assert marker.exists() and load_attempt(paths.attempt_json).state == "succeeded"
    assert load_readiness(paths.readiness_json).restarts == {"client": 1,
                                                              "server tiny/0": 1}
    logs = paths.execution_logs(1)
    assert (logs / "server-tiny-0.restart-1.log").exists()
    assert "restarting server tiny/0, client" in result.stderr
    assert "server tiny/0 ended after it was ready" in result.stderr
    kept = int(RESUMED.search((logs / "client.restart-1.log").read_text()).group(1))
    asked = Counter(_indices(requests))
    assert all(asked[i] == 1 for i in range(kept)), asked
    assert [r["index"] for r in records(paths.output)] == list(range(12))


def test_the_bound_ends_restarts_and_status_shows_them(tmp_path, agent_pyz, python_exe):
    run_id = "bound-20240101-000000-abcdef"
    workspace = tmp_path / "ws"
    layout = RunLayout(workspace / "runs" / run_id)
    plan = dataclasses.replace(_plan(python_exe, "--exit-after", "2", bound=1), run_id=run_id)
    args = stage(layout.root, plan)
    result = run_allocation(python_exe, agent_pyz, args)
    assert result.returncode == 1
    paths = layout.attempt(0, 1)
    attempt = load_attempt(paths.attempt_json)
    assert attempt.state == "failed"
    assert attempt.reason.startswith("server-tiny-0 exited with status 3")
    assert "after 1 restart(s) in the allocation (client 1, server tiny/0 1)" in attempt.reason
    assert load_readiness(paths.readiness_json).restarts == {"client": 1, "server tiny/0": 1}
    # status --shard 0 counts them
    profile = tmp_path / "profile.toml"
    profile.write_text(TESTBED.read_text().replace('"/tmp/synthbatch-workspace"',
                                                   json.dumps(str(workspace))))
    record = RunRecord(run_id=run_id, name="test", created_at=time.time(),
                       plan_sha256="0" * 64, agent_pyz="agent.pyz", agent_sha256="0" * 64,
                       backend="slurm", job_name=f"synthbatch-{run_id}", shard_count=1)
    publish_immutable(layout.run_json, record.to_json().encode("utf-8"))
    shown = CliRunner().invoke(cli, ["status", run_id, "--profile", str(profile), "--shard",
                                     "0"])
    assert shown.exit_code == 0, shown.output
    assert "restarts: client 1, server tiny/0 1" in shown.stdout.splitlines()


def test_a_configuration_error_of_the_client_is_not_restarted(tmp_path, agent_pyz,
                                                               python_exe):
    plan = _plan(python_exe)
    plan = dataclasses.replace(plan, client=dataclasses.replace(
        plan.client, prompt_template="Tell me about {no_such_column}."))
    args = stage(tmp_path / "run", plan)
    result = run_allocation(python_exe, agent_pyz, args)
    assert result.returncode == 1
    paths = RunLayout(tmp_path / "run").attempt(0, 1)
    attempt = load_attempt(paths.attempt_json)
    assert attempt.state == "failed" and "client exited with status 2" in attempt.reason
    assert "no_such_column" in attempt.reason
    assert "restarting" not in result.stderr
    assert load_readiness(paths.readiness_json).restarts == {}
    assert not list(paths.execution_logs(1).glob("client.restart-*"))


def _not_restarted(result, paths) -> str:  # noqa: ANN001
    """The attempt failed at once: no restart, no restart's log; its reason."""
    assert result.returncode == 1, result.stderr
    attempt = load_attempt(paths.attempt_json)
    assert attempt.state == "failed", attempt
    assert "restarting" not in result.stderr and "restart(s) in the allocation" not in \
        attempt.reason
    assert not list(paths.root.rglob("*.restart-*.log"))
    return attempt.reason


def test_a_model_that_does_not_exist_is_not_restarted(tmp_path, agent_pyz, python_exe):
    requests = tmp_path / "requests.jsonl"
    # the server serves another model: every request is refused with HTTP 404
    plan = _plan(python_exe, "--model", "another-model", "--request-log", str(requests))
    args = stage(tmp_path / "run", plan)
    result = run_allocation(python_exe, agent_pyz, args)
    reason = _not_restarted(result, RunLayout(tmp_path / "run").attempt(0, 1))
    assert "HTTP 404" in reason and "does not exist" in reason
    assert {e.get("status") for e in logged(requests)} == {404}


def _loader(tmp_path: Path, python: str, *serve: str) -> List[str]:
    """A server command that counts its starts in ``starts``, then runs the fake server,
    or, once ``oom`` exists, fails at load as an engine out of GPU memory does."""
    from tests.conftest import FAKE_SERVER

    script = tmp_path / "loader.py"
    script.write_text(
        "import os, sys\n"
        "starts, oom = sys.argv[1], sys.argv[2]\n"
        "with open(starts, 'a') as f:\n    f.write('start\\n')\n"
        "if os.path.exists(oom):\n"
        "    sys.exit('torch.OutOfMemoryError: CUDA out of memory while loading weights')\n"
        "open(oom, 'w').close()\n"
        "os.execv(sys.executable, [sys.executable, *sys.argv[3:]])\n")
    return [python, str(script), str(tmp_path / "starts"), str(tmp_path / "oom"),
            str(FAKE_SERVER), "--host", "{host}", "--port", "{port}", "--model",
            "fake-model", *serve]


def test_a_server_out_of_memory_at_load_is_not_restarted(tmp_path, agent_pyz, python_exe):
    (tmp_path / "oom").touch()  # every start fails at load
    plan = dataclasses.replace(local_plan(python_exe, _loader(tmp_path, python_exe)),
                               restarts_in_allocation=2)
    args = stage(tmp_path / "run", plan)
    result = run_allocation(python_exe, agent_pyz, args)
    reason = _not_restarted(result, RunLayout(tmp_path / "run").attempt(0, 1))
    assert "CUDA out of memory" in reason, reason
    assert (tmp_path / "starts").read_text().splitlines() == ["start"]  # started once


def test_a_restarted_server_out_of_memory_again_ends_the_restarts(tmp_path, agent_pyz,
                                                                   python_exe):
    # the first start serves 3 requests and crashes (a restart may cure that); the
    # restarted server runs out of memory at load: that is not restarted again, although
    # the bound (2) would allow another restart
    plan = dataclasses.replace(local_plan(python_exe, _loader(
        tmp_path, python_exe, "--exit-after", "3"), records=12), restarts_in_allocation=2)
    args = stage(tmp_path / "run", plan)
    result = run_allocation(python_exe, agent_pyz, args)
    assert result.returncode == 1, result.stderr
    paths = RunLayout(tmp_path / "run").attempt(0, 1)
    attempt = load_attempt(paths.attempt_json)
    assert attempt.state == "failed"
    assert (tmp_path / "starts").read_text().splitlines() == ["start", "start"]
    assert result.stderr.count("agent: shard 0 attempt 1: restarting") == 1, result.stderr
    assert load_readiness(paths.readiness_json).restarts == {"client": 1, "server tiny/0": 1}


def test_a_preflight_failure_is_not_restarted(tmp_path, agent_pyz, python_exe):
    missing = tmp_path / "no-such-engine"
    plan = dataclasses.replace(local_plan(python_exe, [str(missing), "--port", "{port}"]),
                               restarts_in_allocation=2)
    args = stage(tmp_path / "run", plan)
    result = run_allocation(python_exe, agent_pyz, args)
    reason = _not_restarted(result, RunLayout(tmp_path / "run").attempt(0, 1))
    assert "preflight" in reason and str(missing) in reason, reason
    assert not list(RunLayout(tmp_path / "run").attempt(0, 1).root.rglob("server-*.log"))
