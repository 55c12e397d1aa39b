"""The local scheduler with real supervisors running small batch scripts (no Slurm).

Each test submits a hand-written script the way ``submit`` submits a rendered one: held,
then released (which starts the job's detached supervisor), and reads the outcome as
status does, through ``queue`` and ``accounting``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import pytest

from synthbatch.agent_stdlib import localjob
from synthbatch.control.backends.local import proc
from synthbatch.control.backends.local.jobs import Table, supervisor_alive
from synthbatch.control.backends.local.scheduler import LocalScheduler, Settings
from synthbatch.control.errors import SchedulerRejected
from synthbatch.control.slurm.parsers import JobRow

NAME = "synthbatch-test"


def write_script(root: Path, body: str, **options: Optional[str]) -> Path:
    """``<root>/run/submissions/0001.sbatch`` with ``#SBATCH`` lines, as the renderer does."""
    options = {"time": "00:05:00", "output": f"{root}/run/logs/slurm-%A_%a.out", **options}
    lines = ["#!/bin/bash"] + [f"#SBATCH --{k}" if v is None else f"#SBATCH --{k}={v}"
                               for k, v in sorted(options.items())] + ["set -u", body, ""]
    path = root / "run" / "submissions" / "0001.sbatch"
    path.parent.mkdir(parents=True, exist_ok=True)
    (root / "run" / "logs").mkdir(exist_ok=True)
    path.write_text("\n".join(lines))
    return path


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalScheduler]:
    sched = LocalScheduler(str(tmp_path / "ws"),
                           settings=Settings(gpus_per_node=2, gpus=(5, 6), kill_wait_s=1.0))
    yield sched
    jobs = sched.table.root / "jobs"
    for job_id in os.listdir(jobs) if jobs.is_dir() else []:  # no supervisor outlives it
        record = sched.table.load_supervisor(job_id)
        deadline = time.monotonic() + 10
        while record and supervisor_alive(record) and time.monotonic() < deadline:
            time.sleep(0.05)
            record = sched.table.load_supervisor(job_id)
        if record and supervisor_alive(record):
            os.kill(record.pid, signal.SIGKILL)
            pytest.fail(f"the supervisor of job {job_id} was still running")


def wait_rows(sched: LocalScheduler, job_id: str, done: Callable[[List[JobRow]], bool],
              timeout_s: float = 30) -> List[JobRow]:
    deadline = time.monotonic() + timeout_s
    while True:
        rows = sched.queue([job_id])
        if rows and done(rows):
            return rows
        if time.monotonic() > deadline:
            log = sched.table.supervisor_log(job_id)
            pytest.fail(f"rows {rows}; supervisor log: {log.read_text() if log.exists() else ''}")
        time.sleep(0.05)


def wait_stopped(sched: LocalScheduler, job_id: str, timeout_s: float = 30) -> Dict:
    """The supervisor's view once it has stopped (it exits after its tasks' records)."""
    deadline = time.monotonic() + timeout_s
    while True:
        view = next(v for v in sched.describe(NAME)["supervisors"] if v["job_id"] == job_id)
        if view.get("stopped"):
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.05)


def ended(rows: List[JobRow]) -> bool:
    return all(r.terminal for r in rows)


def run(sched: LocalScheduler, script: Path, tasks: List[int], throttle: int = 0) -> str:
    job_id, argv = sched.submit_held_array(str(script), tasks, throttle, NAME)
    assert argv[:2] == ["synthbatch-local", "--hold"] and argv[-1] == str(script)
    sched.release(job_id)
    return job_id


def output(tmp_path: Path, job_id: str, task: int) -> str:
    return (tmp_path / "run" / "logs" / f"slurm-{job_id}_{task}.out").read_text()


def test_a_held_job_runs_its_script_per_task_once_released(local, tmp_path):
    script = write_script(tmp_path, 'echo "task $SYNTHBATCH_LOCAL_ARRAY_TASK_ID cuda '
                                    '${CUDA_VISIBLE_DEVICES} slurm ${SLURM_JOB_ID:-none}"\n'
                                    '[ "$SYNTHBATCH_LOCAL_ARRAY_TASK_ID" != 2 ] || exit 3',
                          gres="gpu:1")
    job_id, _ = local.submit_held_array(str(script), [0, 2], 0, NAME)
    rows = local.queue(name=NAME)
    assert [(r.job_id, r.state, r.reason) for r in rows] == [
        (f"{job_id}_0", "PENDING", "JobHeldUser"), (f"{job_id}_2", "PENDING", "JobHeldUser")]
    assert local.jobs_named(NAME) == rows
    os.environ["SLURM_JOB_ID"] = "99"  # a submitter inside a Slurm job: not passed on
    try:
        local.release(job_id)
    finally:
        del os.environ["SLURM_JOB_ID"]
    rows = wait_rows(local, job_id, ended)
    assert [(r.job_id, r.state) for r in rows] == [(f"{job_id}_0", "COMPLETED"),
                                                  (f"{job_id}_2", "FAILED")]
    acct = {r.job_id: (r.state, r.exit_code, r.signal) for r in local.accounting([job_id])}
    assert acct == {f"{job_id}_0": ("COMPLETED", 0, 0), f"{job_id}_2": ("FAILED", 3, 0)}
    first, second = output(tmp_path, job_id, 0), output(tmp_path, job_id, 2)
    assert first.startswith("task 0 cuda ") and first.endswith(" slurm none\n")
    assert {first.split()[3], second.split()[3]} <= {"5", "6"}  # one GPU of the pool each
    assert local.jobs_named(NAME) == []
    view = wait_stopped(local, job_id)
    assert view["job_id"] == job_id and view["alive"] is False
    assert not local.table.active_jobs()
    local.release(job_id)  # idempotent: its supervisor ran, nothing starts again
    assert local.table.load_supervisor(job_id).pid == view["pid"]


def test_usage_is_each_task_s_elapsed_time_and_gpus(local, tmp_path):
    script = write_script(tmp_path, "sleep 1", gres="gpu:1")
    job_id = run(local, script, [0, 1])
    wait_rows(local, job_id, ended)
    used = {u.job_id: u for u in local.usage([job_id])}
    assert sorted(used) == [f"{job_id}_0", f"{job_id}_1"]
    assert all(u.gpus == 1 and 1 <= u.elapsed_s <= 30 for u in used.values())
    assert local.usage(["424242"]) == []  # a job the table does not hold
    wait_stopped(local, job_id)


def test_submit_refuses_what_this_machine_cannot_run(local, tmp_path):
    with pytest.raises(SchedulerRejected, match="asks for 2 nodes; it runs on this machine"):
        local.submit_held_array(str(write_script(tmp_path, "true", nodes="2")), [0], 0, NAME)
    with pytest.raises(SchedulerRejected, match=r"each task needs 3 GPU\(s\), this machine "
                                                r"has 2 \(5,6\)"):
        local.submit_held_array(str(write_script(tmp_path, "true", gres="gpu:3")), [0], 0,
                                NAME)
    with pytest.raises(SchedulerRejected, match="not a time limit"):
        local.submit_held_array(str(write_script(tmp_path, "true", time="soon")), [0], 0, NAME)
    with pytest.raises(SchedulerRejected, match="Invalid job id"):
        local.release("12345")


def test_tasks_wait_for_gpus_and_the_throttle(local, tmp_path):
    script = write_script(tmp_path, "sleep 0.3; echo $CUDA_VISIBLE_DEVICES", gres="gpu:2")
    job_id = run(local, script, [0, 1, 2])
    seen = set()
    rows = wait_rows(local, job_id, lambda rows: (seen.update(
        (r.state, r.reason) for r in rows), ended(rows))[1])
    assert ("PENDING", "Resources") in seen or ("PENDING", "Priority") in seen, seen
    assert ("RUNNING", None) in seen
    assert [r.state for r in rows] == ["COMPLETED"] * 3
    assert {output(tmp_path, job_id, t) for t in range(3)} == {"5,6\n"}


def test_a_time_limit_sends_usr1_at_the_lead_then_term_then_kill(local, tmp_path):
    # Slurm: --signal=B:USR1@lead reaches the batch shell ``lead`` seconds before the
    # limit; at the limit the job gets SIGCONT + SIGTERM, then SIGKILL after KillWait.
    body = ("trap 'echo usr1' USR1\ntrap 'echo term' TERM\n"
            "for i in $(seq 200); do sleep 0.05; done")  # TERM is trapped: only KILL ends it
    script = write_script(tmp_path, body, time="00:00:02", signal="B:USR1@1", requeue=None)
    job_id = run(local, script, [0])
    rows = wait_rows(local, job_id, ended)
    assert rows[0].state == "TIMEOUT"
    lines = output(tmp_path, job_id, 0).splitlines()
    assert [line for line in lines if line in ("usr1", "term")] == ["usr1", "term"], lines
    cause = json.loads((local.table.task_dir(job_id, 0) / localjob.CAUSE_FILE).read_text())
    assert cause["cause"] == localjob.TIME_LIMIT and cause["signal"] == "TERM"
    assert "CANCELLED DUE TO TIME LIMIT" in "".join(lines)
    acct = local.accounting([job_id])[0]
    assert (acct.state, acct.signal) == ("TIMEOUT", signal.SIGKILL)  # KillWait ran out
    record = local.table.load_job(job_id).tasks[0]
    assert record.usr1_at < record.term_at < record.kill_at


def test_cancel_ends_pending_tasks_at_once_and_running_ones_by_sigterm(local, tmp_path):
    body = 'trap \'echo "term $SYNTHBATCH_LOCAL_ARRAY_TASK_ID"; exit 143\' TERM\n' \
           'echo started; while true; do sleep 0.05; done'
    script = write_script(tmp_path, body, gres="gpu:2")
    job_id = run(local, script, [0, 1])
    wait_rows(local, job_id, lambda rows: rows[0].state == "RUNNING")
    pid = local.table.load_job(job_id).tasks[0].pid
    local.cancel([job_id])
    rows = wait_rows(local, job_id, ended)
    assert [(r.state, r.reason) for r in rows] == [("CANCELLED", f"by {os.getuid()}")] * 2
    assert output(tmp_path, job_id, 0).splitlines()[-1] == "term 0"
    assert not (tmp_path / "run" / "logs" / f"slurm-{job_id}_1.out").exists()  # never ran
    assert not proc.alive(pid, None)
    local.cancel([job_id, f"{job_id}_1", "99999", "junk"])  # ended or unknown: fine


def test_a_requeue_request_runs_the_task_again(local, tmp_path):
    body = ('echo "restart $SYNTHBATCH_LOCAL_RESTART_COUNT"\n'
            'if [ "$SYNTHBATCH_LOCAL_RESTART_COUNT" = 0 ]; then\n'
            '  echo "{}" > "$SYNTHBATCH_LOCAL_TASK_DIR/requeue.json"; fi')
    job_id = run(local, write_script(tmp_path, body, requeue=None), [0])
    rows = wait_rows(local, job_id, ended)
    assert rows[0].state == "COMPLETED"
    text = output(tmp_path, job_id, 0)
    assert text.startswith("restart 0\n") and "REQUEUED" in text and \
        text.endswith("restart 1\n")
    assert local.table.load_job(job_id).tasks[0].restarts == 1


def test_kill_9_of_the_supervisor_ends_its_tasks_as_a_node_failure(local, tmp_path):
    job_id = run(local, write_script(tmp_path, "echo up; sleep 60"), [0, 1], throttle=1)
    wait_rows(local, job_id, lambda rows: rows[0].state == "RUNNING")
    task_pid = local.table.load_job(job_id).tasks[0].pid
    record = local.table.load_supervisor(job_id)
    os.kill(record.pid, signal.SIGKILL)
    rows = wait_rows(local, job_id, ended)
    assert [r.state for r in rows] == ["NODE_FAIL", "NODE_FAIL"]
    assert f"local supervisor (pid {record.pid} on {record.host}) is gone" in rows[0].reason
    assert local.accounting([job_id]) == []  # nothing recorded those ends
    deadline = time.monotonic() + 10
    while proc.alive(task_pid, None):  # PR_SET_PDEATHSIG: the task dies with it
        assert time.monotonic() < deadline, "the task outlived its supervisor"
        time.sleep(0.05)
    assert local.describe(NAME)["supervisors"][0]["alive"] is False


def test_the_supervisor_is_detached_and_says_where_it_is(local, tmp_path):
    job_id = run(local, write_script(tmp_path, "sleep 1"), [0])
    record = local.table.load_supervisor(job_id)
    assert record.pid != os.getpid() and os.getsid(record.pid) != os.getsid(0)
    assert os.getsid(record.pid) != record.pid  # not a session leader: never gets a tty
    view: Dict = local.describe(NAME)["supervisors"][0]
    assert view["alive"] is True and view["pid"] == record.pid
    assert view["log"] == str(Table(Path(local.workspace) / "local").supervisor_log(job_id))
    wait_rows(local, job_id, ended)


@pytest.mark.parametrize("bad", ["²", "1²", "12_³", "x", "--state=RUNNING", "12_"])
def test_words_that_are_not_job_ids_are_absent_not_a_crash(local: LocalScheduler,
                                                            bad: str) -> None:
    # '²'.isdigit() holds and int('²') raises ValueError: queue, accounting and usage
    # sorted such ids with key=int (found by the control-character fuzz target's ids).
    assert local.queue([bad]) == []
    assert local.accounting([bad]) == []
    assert local.usage([bad]) == []
    local.cancel([bad])
    with pytest.raises(ValueError, match="not a local job id"):
        local.table.job_dir(bad)
