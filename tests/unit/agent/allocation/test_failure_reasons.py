"""Failure reasons put the cause first, and ``synthbatch status`` shows it (issue 28.1, 28.6).

One attempt per failure class runs under the agent with local processes; then ``status``
(text, ``--json``, ``--shard``) and ``api.status().failures`` are read as a user would.
Each log is padded so that the cause sits behind more than 300 characters of other text:
where a reason was cut to its first 300 characters the cause fell off.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
from click.testing import CliRunner

from synthbatch.agent_stdlib import localjob
from synthbatch.agent_stdlib.allocation.ranks import RankId, exit_line
from synthbatch.agent_stdlib.allocation.reasons import cause, ended
from synthbatch.agent_stdlib.allocation.serving import Services, exit_reason
from synthbatch.agent_stdlib.attempts import load_attempt
from synthbatch.agent_stdlib.contracts import RunRecord
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import publish_immutable
from synthbatch.control import api
from synthbatch.control.cli.main import cli
from tests.agent_runs import (
    TESTBED,
    local_plan,
    run_allocation,
    server_argv,
    stage,
    start_local_task,
    wait_for_progress,
)
from tests.conftest import FAKE_SERVER

BANNER = "INFO engine banner " + "x" * 180  # a long startup line, printed a few times


class Shown:
    """What a user sees of one failed shard: ``status``, ``--json``, the API, ``--shard``."""

    def __init__(self, tmp_path: Path, workspace: Path, run_id: str) -> None:
        profile = tmp_path / "profile.toml"
        profile.write_text(TESTBED.read_text().replace('"/tmp/synthbatch-workspace"',
                                                       json.dumps(str(workspace))))
        layout = RunLayout(workspace / "runs" / run_id)
        record = RunRecord(run_id=run_id, name="test", created_at=time.time(),
                           plan_sha256="0" * 64, agent_pyz="agent.pyz", agent_sha256="0" * 64,
                           backend="slurm", job_name=f"synthbatch-{run_id}", shard_count=1)
        publish_immutable(layout.run_json, record.to_json().encode("utf-8"))  # committed
        self.text = self._cli(["status", run_id, "--profile", str(profile)])
        self.json: Dict[str, Any] = json.loads(
            self._cli(["status", run_id, "--profile", str(profile), "--json"]))
        self.api = api.status(run_id, str(profile)).failures
        self.shard = self._cli(["status", run_id, "--profile", str(profile), "--shard", "0"])
        self.shard_json: Dict[str, Any] = json.loads(
            self._cli(["status", run_id, "--profile", str(profile), "--shard", "0", "--json"]))
        self.reason = load_attempt(layout.attempt(0, 1).attempt_json).reason or ""

    @staticmethod
    def _cli(argv: List[str]) -> str:
        result = CliRunner().invoke(cli, argv)
        assert result.exit_code == 0, (argv, result.output)
        return result.stdout

    def shows(self, words: str) -> None:
        """``words`` in every view: the status summary, --json, the API, --shard."""
        assert words in self.text, self.text
        assert words in self.json["failures"][0]["reason"]
        assert words in (self.api[0].reason or "")
        assert f"reason: {self.reason}" in self.shard  # the whole reason
        assert self.shard_json["shard"]["reason"] == self.reason  # --json: the whole reason


def _attempt(tmp_path: Path, pyz: Path, python: str, run_id: str, command: List[str],
             **plan: Any) -> Shown:
    """Run shard 0 of a local plan to its end; what status shows of it."""
    workspace = tmp_path / "ws"
    args = stage(workspace / "runs" / run_id,
                 local_plan(python, command, run_id=run_id, **plan))
    assert run_allocation(python, pyz, args).returncode == 1
    return Shown(tmp_path, workspace, run_id)


def _script(lines: str) -> str:
    return f"import sys, time\nfor _ in range(4): print({BANNER!r}, flush=True)\n{lines}"


def test_client_http_errors_show_the_status_and_message_first(tmp_path, agent_pyz, python_exe):
    shown = _attempt(tmp_path, agent_pyz, python_exe, "http-20240101-000000-abcdef",
                     server_argv(python_exe, "--fail-every", "1"), records=20)
    assert shown.reason.startswith("client exited with status 1: ")
    shown.shows("HTTP 500")
    shown.shows("injected failure (--fail-every)")
    assert "generate: records 0..19" in shown.shard  # the client log's last lines
    assert "log: " in shown.shard and "client.log" in shown.shard


def test_a_server_that_exits_shows_its_last_error_first(tmp_path, agent_pyz, python_exe):
    source = _script("print('ValueError: model config has no layers', flush=True)\n"
                     "print('INFO shutting down', flush=True); sys.exit(3)")
    shown = _attempt(tmp_path, agent_pyz, python_exe, "exit-20240101-000000-abcdef",
                     [python_exe, "-c", source, "{port}"], startup_timeout_s=60)
    assert shown.reason.startswith("server-tiny-0 exited with status 3: ValueError: ")
    shown.shows("ValueError: model config has no layers")
    assert "INFO shutting down" in shown.shard


def test_a_server_never_ready_shows_the_traceback_cause(tmp_path, agent_pyz, python_exe):
    source = _script("print('Traceback (most recent call last):', flush=True)\n"
                     "print('  File \"worker.py\", line 1', flush=True)\n"
                     "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                     "2.00 GiB', flush=True)\n"
                     "print('RuntimeError: Engine core initialization failed. See root cause "
                     "above.', flush=True)\ntime.sleep(60)")
    shown = _attempt(tmp_path, agent_pyz, python_exe, "ready-20240101-000000-abcdef",
                     [python_exe, "-c", source, "{port}"], startup_timeout_s=2)
    assert shown.reason.startswith("deployment tiny: not ready after 2s: "
                                   "torch.OutOfMemoryError: CUDA out of memory")
    shown.shows("torch.OutOfMemoryError: CUDA out of memory")
    shown.shows("not ready after 2s")


def test_preflight_shows_what_is_missing(tmp_path, agent_pyz, python_exe):
    missing = tmp_path / "models--org--name" / "snapshots" / ("0" * 40) / "missing-model"
    workspace = tmp_path / "ws"
    run_id = "pre-20240101-000000-abcdef"
    plan = local_plan(python_exe, server_argv(python_exe), records=3, run_id=run_id)
    dep = dataclasses.replace(plan.deployments[0], model=str(missing))
    args = stage(workspace / "runs" / run_id, plan.replace(deployments=(dep,)))
    assert run_allocation(python_exe, agent_pyz, args).returncode == 1
    shown = Shown(tmp_path, workspace, run_id)
    shown.shows("preflight: paths: ")
    shown.shows("missing-model is missing")


def test_a_time_limit_shows_as_the_cause(tmp_path, agent_pyz, python_exe):
    workspace = tmp_path / "ws"
    run_id = "limit-20240101-000000-abcdef"
    plan = local_plan(python_exe, server_argv(python_exe, "--token-latency", "0.05"), records=30,
                      run_id=run_id)
    args = stage(workspace / "runs" / run_id, plan)
    proc = start_local_task(tmp_path, python_exe, agent_pyz, args)
    wait_for_progress(RunLayout(workspace / "runs" / run_id).attempt(0, 1), proc)
    localjob.write_cause(tmp_path / "task", localjob.TIME_LIMIT, "TERM")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    shown = Shown(tmp_path, workspace, run_id)
    shown.shows("time limit reached")


# ----------------------------------------------------------------------------- 28.6


def test_a_server_that_died_before_the_client_failed_is_the_cause(tmp_path, agent_pyz,
                                                                   python_exe):
    """The engine dies; its step takes a while to end (as ``srun`` ending a replica's
    other ranks does); the client fails on the proxy's 502s meanwhile. The server is named
    first, the client's status after it."""
    source = ("import subprocess, sys, time\n"
              f"engine = subprocess.Popen([sys.executable, {str(FAKE_SERVER)!r}, '--host', "
              "sys.argv[1], '--port', sys.argv[2], '--model', 'fake-model', "
              "'--exit-after', '2'])\n"
              "code = engine.wait()\n"
              "print('engine: RuntimeError: rank 0 died', flush=True)\n"
              "time.sleep(6); sys.exit(code)")
    shown = _attempt(tmp_path, agent_pyz, python_exe, "first-20240101-000000-abcdef",
                     [python_exe, "-c", source, "{host}", "{port}"], records=30)
    assert shown.reason.startswith("server-tiny-0 exited with status 3: "
                                   "engine: RuntimeError: rank 0 died"), shown.reason
    assert "then the client exited with status 1" in shown.reason
    shown.shows("server-tiny-0 exited with status 3")


class _Process:
    def __init__(self, code: Any) -> None:
        self.code = code

    def poll(self) -> Any:
        return self.code


def _child(tmp_path: Path, code: Any, log: str, ranks: int = 1, step: bool = True) -> Any:
    from synthbatch.agent_stdlib.allocation.supervisor import Managed

    path = tmp_path / "server-big-0.log"
    path.write_text(log)
    child = Managed(name="server-big-0", argv=["srun"], process=_Process(code),  # type: ignore
                    log_path=path, step="server-big-0" if step else None)
    child.ranks = ranks
    return child


def test_a_killed_srun_is_said_in_words(tmp_path):
    reason = exit_reason(_child(tmp_path, -9, "loading\n"), -9)
    assert reason.startswith("server-big-0 ended: srun was killed by signal 9 (SIGKILL)")
    assert "status -9" not in reason
    assert ended(-9) == "was killed by signal 9 (SIGKILL)"  # a local child: no srun
    assert ended(137, srun=True) == "exited with status 137"
    who = RankId("server-big-0", "node2", 1, 2)
    log = f"1: {exit_line(who, -9, 0.0)}\n"
    assert "(srun was killed by signal 9 (SIGKILL); log " in \
        exit_reason(_child(tmp_path, -9, log, ranks=2), -9)
    assert "(srun status 137; log " in exit_reason(_child(tmp_path, 137, log, ranks=2), 137)


def test_a_rank_that_ended_is_the_cause_before_its_step_ends(tmp_path):
    """The replica's log already tells that rank 0 was killed while srun still runs: the
    server is named at once, without waiting for the step."""
    who = RankId("server-big-0", "node2", 0, 2)
    log = f"0: INFO serving\n1: INFO serving\n0: {exit_line(who, -9, time.time())}\n"
    services = Services.__new__(Services)
    services.servers = {"big": [_child(tmp_path, None, log, ranks=2)]}
    started = time.monotonic()
    reason = services.ended_server(settle_s=30.0)
    assert reason is not None and time.monotonic() - started < 30.0
    assert reason.startswith("server-big-0 (2 nodes) ended: rank 0 on node2: "
                             "the engine was killed by signal 9 (SIGKILL)")


@pytest.mark.parametrize("text, found", [
    ("INFO a\nTraceback (most recent call last):\n  File x\nKeyError: 'x'\nINFO bye\n",
     "KeyError: 'x'"),
    ("torch.OutOfMemoryError: CUDA out of memory\nRuntimeError: failed. See root cause above.",
     "torch.OutOfMemoryError: CUDA out of memory | RuntimeError: failed. See root cause above."),
    ("generate: record 3: HTTP 502: all backends failed (attempt 3 of 3)\n",
     "generate: record 3: HTTP 502: all backends failed (attempt 3 of 3)"),
    ("INFO starting\nINFO serving\n", None),
    ("generate: record 1: HTTP 500: injected failure\n"
     "srun: error: node1: task 0: Exited with exit code 1\n",
     "generate: record 1: HTTP 500: injected failure"),  # srun's exit report is the how
    ("1: srun: error: Unable to create step for job 12: Invalid generic resource\n",
     "1: srun: error: Unable to create step for job 12: Invalid generic resource"),
    ("ERROR \x1b[2J screen\n", "ERROR \\x1b[2J screen"),
    # slurmstepd's word on a cancelled step, with or without its node in its name: the how
    ("serve: rank 0 of 2: the engine exited with status 3; the replica ends\n"
     "slurmstepd-node1: error: *** STEP 329.1 ON node1 CANCELLED AT 2026-12-04T11:38:30 ***\n",
     None),
    ("HTTP 500: boom\nslurmstepd: error: *** JOB 12 ON node1 CANCELLED AT 2026 ***\n",
     "HTTP 500: boom"),
])
def test_cause_is_the_last_error_line(text, found):
    assert cause(text) == found


def test_the_whole_reason_is_kept_by_status_and_shown_cut_in_the_summary():
    from synthbatch.control.cli.render import REASON_SHOWN, failure_lines
    from synthbatch.control.runs.status import verdict as norm

    reason = "client exited with status 1: HTTP 500 " + "y" * 2000
    evidence = norm.Evidence(attempt_state="failed", attempt_reason=reason)
    assert norm.normalize(evidence).reason == reason
    lines = failure_lines({"run_id": "r", "failures": [
        {"shard": 4, "state": "failed", "reason": reason, "log": None}]})
    assert len(lines[1]) < REASON_SHOWN + 30 and "HTTP 500" in lines[1]
    assert lines[2].strip() == "whole reason: synthbatch status r --shard 4"



def test_the_log_of_a_replica_reason_is_found(tmp_path):
    """status's ``log`` (and ``logs``' default step) come from the reason's ``log PATH``:
    also in a replica's ``(srun status N; log PATH, rank R: ...)``."""
    from synthbatch.control.runs.status.rows import LOG_IN_REASON

    who = RankId("server-big-0", "node2", 1, 2)
    child = _child(tmp_path, 137, f"1: {exit_line(who, -9, 0.0)}\n", ranks=2)
    for reason in (exit_reason(child, 137), exit_reason(_child(tmp_path, 3, "x\n"), 3)):
        match = LOG_IN_REASON.search(reason)
        assert match and match.group(1) == str(child.log_path), reason
