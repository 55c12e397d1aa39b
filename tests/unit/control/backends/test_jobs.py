"""The local job table: the one row rule, the one liveness rule, records and damage."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

from synthbatch.agent_stdlib.statefile import StateError
from synthbatch.control.backends.local import proc
from synthbatch.control.backends.local.jobs import (
    CANCELLED,
    COMPLETED,
    COMPLETING,
    ENDED,
    FAILED,
    HELD,
    NODE_FAIL,
    PENDING,
    RUNNING,
    TIMEOUT,
    Job,
    Supervisor,
    Table,
    Task,
    job_from_dict,
    supervisor_alive,
    task_row,
)
from synthbatch.control.runs.status import verdict as norm
from synthbatch.control.slurm.parsers import ACTIVE_STATES, TERMINAL_STATES


def job(**changes: object) -> Job:
    base = Job(job_id="40", name="synthbatch-r", script="/r/submissions/0001.sbatch",
               workdir="/r", output="/r/logs/slurm-%A_%a.out", time_limit_s=600,
               signal_lead_s=30, requeue=True, gpus=1, pool=("0", "1"), max_concurrent=2,
               throttle=0, kill_wait_s=30.0, submitted_at=1.0,
               tasks={0: Task(task=0, raw_id=40), 1: Task(task=1, raw_id=41)})
    return dataclasses.replace(base, **changes)


@pytest.fixture(scope="module")
def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def me() -> Task:
    pid = os.getpid()
    return Task(task=0, raw_id=40, state=RUNNING, pid=pid, ticks=proc.start_ticks(pid))


def test_a_process_is_its_pid_and_its_start_time(dead_pid: int) -> None:
    pid = os.getpid()
    assert proc.alive(pid, proc.start_ticks(pid))
    assert not proc.alive(pid, (proc.start_ticks(pid) or 0) + 1)  # the pid, reused
    assert not proc.alive(dead_pid, None) and not proc.alive(None, None)


def test_a_zombie_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while proc._stat(child.pid) and proc._stat(child.pid)[0] != "Z":  # type: ignore[index]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not proc.alive(child.pid, None)  # not reaped yet: a zombie, not alive
    child.wait()


def supervisor(**changes: object) -> Supervisor:
    pid = os.getpid()
    base = Supervisor(job_id="40", pid=pid, ticks=proc.start_ticks(pid),
                      host=socket.gethostname(), boot_id=proc.boot_id(), started_at=1.0,
                      heartbeat_at=1.0, log="/x.log")
    return dataclasses.replace(base, **changes)


def test_a_supervisor_is_alive_while_its_process_runs(dead_pid: int) -> None:
    assert supervisor_alive(None) is None
    assert supervisor_alive(supervisor()) is True
    assert supervisor_alive(supervisor(pid=dead_pid)) is False
    assert supervisor_alive(supervisor(stopped_at=2.0)) is False
    far = supervisor(host="elsewhere", pid=dead_pid)  # another host: only the heartbeat
    assert supervisor_alive(far, now=far.heartbeat_at + 1) is True
    assert supervisor_alive(far, now=far.heartbeat_at + 60) is False


def test_rows_in_slurms_words(dead_pid: int) -> None:
    held, released = job(), job(held=False)
    gone = supervisor(pid=dead_pid)

    def row(j: Job, t: Task, alive: Optional[bool], acct: bool = False):  # type: ignore[no-untyped-def]
        return task_row(j, t, alive, gone, acct)

    pending = held.tasks[0]
    assert row(held, pending, None) == row(held, pending, False)
    assert (row(held, pending, None).job_id, row(held, pending, None).state,
            row(held, pending, None).reason) == ("40_0", PENDING, HELD)
    assert row(released, dataclasses.replace(pending, reason="Resources"), True).reason == \
        "Resources"
    assert row(released, me(), True).state == RUNNING
    exited = dataclasses.replace(me(), pid=dead_pid)
    assert row(released, exited, True).state == COMPLETING  # recorded at the next poll
    lost = row(released, exited, False)
    assert lost.state == NODE_FAIL and f"pid {dead_pid}" in lost.reason
    assert row(released, exited, False, acct=True) is None  # nothing recorded that end
    assert row(released, me(), False).state == RUNNING  # a process left: not ended yet
    asked = dataclasses.replace(exited, cancel_requested_at=5.0, reason="by 1000")
    assert (row(released, asked, False).state, row(released, asked, False).reason) == \
        (CANCELLED, "by 1000")
    done = dataclasses.replace(pending, state=FAILED, exit_code=3, signal=0)
    assert row(released, done, True).exit_code is None
    assert (row(released, done, True, acct=True).exit_code,
            row(released, done, True, acct=True).signal) == (3, 0)


def test_every_row_is_a_state_status_understands(dead_pid: int) -> None:
    """The property that lets status, cancel and reconcile run unchanged: each task record,
    in every liveness, gives a Slurm state, and an ended one only without a process."""
    gone = supervisor(pid=dead_pid)
    for state, held, alive, running, cancel, acct in itertools.product(
            [PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT], [True, False],
            [None, True, False], [True, False], [None, 3.0], [False, True]):
        pid = os.getpid() if running else dead_pid
        task = Task(task=0, raw_id=40, state=state, pid=pid, ticks=proc.start_ticks(pid)
                    if running else None, cancel_requested_at=cancel)
        row = task_row(job(held=held), task, alive, gone, acct)
        if row is None:
            assert acct and not alive and state in (PENDING, RUNNING)
            continue
        assert row.state in ACTIVE_STATES | TERMINAL_STATES
        if row.terminal and state not in ENDED:
            assert not (state == RUNNING and running), (state, alive, running)
        verdict = norm.normalize(norm.Evidence(attempt_state="running", queue=row))
        assert verdict.state in norm.SHARD_STATES


def test_a_job_record_round_trips_and_damage_names_the_file(tmp_path: Path) -> None:
    table = Table(tmp_path)
    record = job()
    path = table.job_json("40")
    path.parent.mkdir(parents=True)
    with table.locked():
        saved = table.save_job(record)
    assert saved.revision == record.revision + 1
    assert table.load_job("40") == saved
    assert table.load_job("41") is None
    data = json.loads(path.read_text())
    for broken in ({**data, "schema_version": 2}, {**data, "tasks": []},
                   {**data, "surprise": 1}, {**data, "tasks": {"0": {"task": 0}}}):
        path.write_text(json.dumps(broken))
        with pytest.raises(StateError, match=str(path)):
            table.load_job("40")
    with pytest.raises(ValueError, match="not a local job id"):
        table.job_json("../x")
    assert job_from_dict(saved.to_dict(), "x") == saved


def test_ids_are_reserved_in_one_counter(tmp_path: Path) -> None:
    table = Table(tmp_path)
    with table.locked():
        first = table.next_ids(3, first=500)
        second = table.next_ids(2, first=1)
    assert (first, second) == (500, 503)
    table.add_name("synthbatch-r", "500")
    table.add_name("synthbatch-r", "503")
    table.add_name("synthbatch-other", "505")
    assert table.jobs_named("synthbatch-r") == ["500", "503"]
    table.mark_active("503", True)
    assert table.active_jobs() == ["503"]
    table.mark_active("503", False)
    assert table.active_jobs() == []
