"""Which pending local tasks start: first come first served, GPUs, limits, throttle."""

from __future__ import annotations

import dataclasses
from typing import Dict, Tuple

from synthbatch.control.backends.local.jobs import CANCELLED, PENDING, RUNNING, Job, Task
from synthbatch.control.backends.local.schedule import LIMIT, PRIORITY, RESOURCES, plan_starts


def job(job_id: str, tasks: int, gpus: int = 1, pool: Tuple[str, ...] = ("0", "1", "2", "3"),
        limit: int = 8, throttle: int = 0, **states: Task) -> Job:
    made: Dict[int, Task] = {t: Task(task=t, raw_id=int(job_id) + t) for t in range(tasks)}
    made.update({int(k[1:]): v for k, v in states.items()})
    return Job(job_id=job_id, name="n", script="/s", workdir="/", output="/o", time_limit_s=None,
               signal_lead_s=None, requeue=True, gpus=gpus, pool=pool, max_concurrent=limit,
               throttle=throttle, kill_wait_s=1.0, submitted_at=0.0, held=False, tasks=made)


def running(task: int, gpus: Tuple[str, ...]) -> Task:
    return Task(task=task, raw_id=task, state=RUNNING, pid=1, gpus=gpus)


def test_tasks_take_free_gpus_in_order_until_none_is_left() -> None:
    a = job("10", 5)
    starts, waits = plan_starts([a], {"10"}, set())
    assert starts == {("10", 0): ("0",), ("10", 1): ("1",), ("10", 2): ("2",),
                      ("10", 3): ("3",)}
    assert waits == {("10", 4): RESOURCES}


def test_running_tasks_hold_their_gpus_only_while_their_process_runs() -> None:
    a = job("10", 3, t0=running(0, ("0", "1")))
    a = dataclasses.replace(a, gpus=2)
    starts, waits = plan_starts([a], {"10"}, {("10", 0)})
    assert starts == {("10", 1): ("2", "3")} and waits == {("10", 2): RESOURCES}
    starts, _ = plan_starts([a], {"10"}, set())  # its process is gone: GPUs are free
    assert starts[("10", 1)] == ("0", "1")


def test_first_come_first_served_across_jobs_without_backfill() -> None:
    big = job("10", 2, gpus=3)
    small = job("20", 2, gpus=1)
    starts, waits = plan_starts([small, big], {"10", "20"}, set())
    assert starts == {("10", 0): ("0", "1", "2")}
    assert waits == {("10", 1): RESOURCES, ("20", 0): PRIORITY, ("20", 1): PRIORITY}
    starts, _ = plan_starts([small, big], {"20"}, set())  # job 10 cannot start: skipped
    assert set(starts) == {("20", 0), ("20", 1)}


def test_without_gpus_the_limit_decides() -> None:
    a = job("10", 3, gpus=0, pool=(), limit=1)
    starts, waits = plan_starts([a], {"10"}, set())
    assert starts == {("10", 0): ()} and waits == {("10", 1): RESOURCES, ("10", 2): PRIORITY}
    other = job("5", 1, gpus=0, pool=(), t0=running(0, ()))
    starts, _ = plan_starts([a, other], {"10"}, {("5", 0)})  # the workspace's one slot
    assert starts == {}


def test_the_array_throttle_leaves_room_for_other_jobs() -> None:
    a = job("10", 3, throttle=1)
    b = job("20", 1)
    starts, waits = plan_starts([a, b], {"10", "20"}, set())
    assert set(starts) == {("10", 0), ("20", 0)}
    assert waits == {("10", 1): LIMIT, ("10", 2): LIMIT}


def test_only_pending_tasks_start() -> None:
    a = job("10", 2, t0=Task(task=0, raw_id=10, state=CANCELLED),
            t1=Task(task=1, raw_id=11, state=PENDING))
    starts, _ = plan_starts([a], {"10"}, set())
    assert starts == {("10", 1): ("0",)}
