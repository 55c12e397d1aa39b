"""Supervisor: process groups, O_EXCL logs, graceful stop, SIGKILL, confirmation."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from synthbatch.agent_stdlib.allocation.signals import SignalCoordinator
from synthbatch.agent_stdlib.allocation.steps import StepControl, parse_steps, step_argv
from synthbatch.agent_stdlib.allocation.supervisor import Supervisor, wait_group_gone
from tests.agent_runs import local_plan
from tests.conftest import REPO

IGNORES_TERM = ("import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "subprocess.Popen(['sleep', '60']); print('up', flush=True); time.sleep(60)")
GRACEFUL = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: "
            "(print('bye', flush=True), sys.exit(0))); print('up', flush=True); time.sleep(60)")


def _wait_log(path: Path, text: str) -> None:
    deadline = time.monotonic() + 20
    while text not in path.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_graceful_child_gets_sigterm_and_is_confirmed_gone(tmp_path):
    sup = Supervisor(SignalCoordinator())
    child = sup.start("g", [sys.executable, "-c", GRACEFUL], {}, tmp_path / "g.log")
    _wait_log(child.log_path, "up")
    assert sup.stop_all(grace_s=10)
    assert child.exit_code() == 0 and "bye" in child.log_path.read_text()
    assert (child.log_path.stat().st_mode & 0o777) == 0o600


def test_term_ignoring_group_is_killed_after_the_grace(tmp_path):
    sup = Supervisor(SignalCoordinator())
    argv = [sys.executable, "-c", IGNORES_TERM]
    child = sup.start("stubborn", argv, {"PATH": os.environ["PATH"]}, tmp_path / "s.log")
    _wait_log(child.log_path, "up")
    assert sup.stop_all(grace_s=0.3)
    assert child.exit_code() == -9 and wait_group_gone(child.pid, 0)
    assert wait_group_gone(child.pid, 0)  # grandchild in the group is gone too


def test_stop_is_idempotent_and_refuses_new_children(tmp_path):
    sup = Supervisor(SignalCoordinator())
    sup.start("g", [sys.executable, "-c", GRACEFUL], {}, tmp_path / "g.log")
    assert sup.stop_all(grace_s=5) and sup.stop_all(grace_s=5)
    with pytest.raises(RuntimeError, match="has stopped"):
        sup.start("late", ["true"], {}, tmp_path / "late.log")


def test_log_files_are_never_reused(tmp_path):
    sup = Supervisor(SignalCoordinator())
    (tmp_path / "x.log").write_text("earlier execution")
    with pytest.raises(FileExistsError):
        sup.start("x", ["true"], {}, tmp_path / "x.log")
    assert sup.children == []


def test_children_die_with_the_agent(tmp_path):
    agent = (
        "import sys, os; from pathlib import Path; "
        "from synthbatch.agent_stdlib.allocation.signals import SignalCoordinator; "
        "from synthbatch.agent_stdlib.allocation.supervisor import Supervisor; "
        "s = Supervisor(SignalCoordinator()); "
        f"c = s.start('sleeper', ['sleep', '60'], {{'PATH': os.environ['PATH']}}, "
        f"Path({str(tmp_path / 'sleep.log')!r})); print(c.pid, flush=True); os._exit(0)")
    out = subprocess.run([sys.executable, "-c", agent], capture_output=True, text=True,
                         check=True, cwd=REPO, timeout=30)
    assert wait_group_gone(int(out.stdout.strip()), 10)


def test_srun_argv_asks_for_explicit_gpus_and_memory():
    plan = local_plan(sys.executable, ["serve"])
    runtime = dataclasses.replace(plan.runtime, launcher="srun")
    resources = dataclasses.replace(plan.resources, gpus=2)
    server = step_argv(runtime, resources, "server-a-0", ["serve"], 2)
    client = step_argv(runtime, resources, "client", ["gen"], 0)
    assert server[:3] == ["srun", "--overlap", "--exact"] and "--gres=gpu:2" in server
    assert "--mem=128" in server and "--job-name=server-a-0" in server
    assert "--gres=none" in client and client[-2:] == ["--", "gen"]
    assert step_argv(plan.runtime, resources, "c", ["gen"], 0) == ["gen"]  # local launcher


def test_parse_steps_of_squeue():
    text = "129.0|server-tiny-0\n129.1|proxy\n129.batch|batch\n129.extern|extern\n\nbad\n"
    assert parse_steps(text) == {"server-tiny-0": "129.0", "proxy": "129.1",
                                 "batch": "129.batch", "extern": "129.extern"}


def test_parse_steps_keeps_only_this_array_task():
    # squeue -s -j <raw id of the last task> also lists the sibling tasks' steps (22.05)
    text = "460_1.0|server-tiny-0\n460_1.batch|batch\n460_0.0|server-tiny-0\n"
    assert parse_steps(text, "460_0") == {"server-tiny-0": "460_0.0"}
    assert parse_steps(text, "460_1") == {"server-tiny-0": "460_1.0", "batch": "460_1.batch"}


def test_step_control_names_the_array_task(monkeypatch):
    from synthbatch.agent_stdlib.allocation.steps import step_control

    monkeypatch.setenv("SLURM_JOB_ID", "461")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "460")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    runtime = SimpleNamespace(launcher="srun")
    assert step_control(runtime).job_id == "460_0"


def test_step_control_without_slurm_reports_it_cannot_ask(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    control = StepControl("1")
    assert control.steps() is None and control.alive(["x"]) is None
    assert control.signal(["x"], "TERM") == []


def test_a_step_is_signalled_unless_scancel_names_it_in_an_error():
    import subprocess

    from synthbatch.agent_stdlib.allocation.steps import signalled

    steps = {"server-big-0": "460_0.1", "server-judge-0": "460_0.2"}
    ok = subprocess.CompletedProcess([], 0, "", "")
    assert signalled(steps, ok) == ["server-big-0", "server-judge-0"]
    # measured on 22.05 in a 2-node allocation: the tasks got the signal, scancel said this
    quirk = subprocess.CompletedProcess([], 225, "", "scancel: error: Kill job error on job "
                                        "step id 460: Invalid job id specified\n" * 2)
    assert signalled(steps, quirk) == ["server-big-0", "server-judge-0"]
    gone = subprocess.CompletedProcess([], 1, "", "scancel: error: Kill job error on job "
                                       "step id 460_0.2: Invalid job id specified\n")
    assert signalled(steps, gone) == ["server-big-0"]


class _SlurmctldDown:
    """A StepControl whose squeue never answers (slurmctld stopped); counts the asks."""

    def __init__(self):
        self.asked = 0

    def try_signal(self, names, signame):
        self.asked += 1
        return None

    def alive(self, names):
        self.asked += 1
        return None


def test_an_unanswered_squeue_is_not_called_a_survivor(tmp_path):
    """Issue 22 (slurmctld restarted mid-run, on the testbed): with slurmctld down every
    process was gone, yet readiness said 'a managed process or step survived SIGKILL'."""
    control = _SlurmctldDown()
    sup = Supervisor(SignalCoordinator(), steps=control)
    child = sup.start("server-tiny-0", [sys.executable, "-c", GRACEFUL], {},
                      tmp_path / "g.log", step=True)
    _wait_log(child.log_path, "up")
    assert not sup.stop_all(grace_s=5)
    assert child.exit_code() is not None and wait_group_gone(child.pid, 0)
    assert sup.unconfirmed == ("every process is gone, but squeue could not be asked "
                               "whether their steps are (is slurmctld up?)")
    # asked once, not at the TERM, the KILL and the confirmation (~10 s each on 22.05)
    assert control.asked == 1
