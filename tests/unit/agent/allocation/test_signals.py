"""The termination signal coordinator and the classification of a SIGTERM."""

from __future__ import annotations

import os
import signal

import pytest

from synthbatch.agent_stdlib.allocation.signals import HANDLED, Interrupted, SignalCoordinator
from synthbatch.agent_stdlib.allocation.slurmjob import (
    CANCELLED,
    REQUEUED,
    TIME_LIMIT,
    classify_termination,
    identity,
    parse_show_job,
)


@pytest.fixture
def coordinator():
    saved = {s: signal.getsignal(s) for s in HANDLED}
    coord = SignalCoordinator()
    coord.install()
    yield coord
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_installs_once(coordinator):
    with pytest.raises(RuntimeError, match="already installed"):
        coordinator.install()


def test_handler_only_records_and_check_raises(coordinator):
    coordinator.check()  # nothing yet
    os.kill(os.getpid(), signal.SIGTERM)
    assert coordinator.received == [signal.SIGTERM] and coordinator.urgent
    with pytest.raises(Interrupted, match="SIGTERM") as info:
        coordinator.check()
    assert not info.value.soft


def test_usr1_is_a_soft_request(coordinator):
    os.kill(os.getpid(), signal.SIGUSR1)
    assert not coordinator.urgent
    with pytest.raises(Interrupted) as info:
        coordinator.check()
    assert info.value.soft


def test_signal_during_spawn_is_held_and_replayed(coordinator):
    with coordinator.critical():
        os.kill(os.getpid(), signal.SIGTERM)
        assert coordinator.received == []
        coordinator.check()  # never raises inside spawn + register
    assert coordinator.received == [signal.SIGTERM]
    with pytest.raises(Interrupted):
        coordinator.check()


def test_cleanup_defers_further_signals_but_notes_urgency(coordinator):
    os.kill(os.getpid(), signal.SIGUSR1)
    coordinator.defer()
    coordinator.check()
    os.kill(os.getpid(), signal.SIGTERM)
    coordinator.check()  # a second signal during cleanup changes nothing ...
    assert coordinator.urgent  # ... except that the remaining grace gets shorter
    assert coordinator.first == signal.SIGUSR1


SHOW_REQUEUED = ("JobId=131 JobName=exp5 UserId=root(0) JobState=COMPLETING Reason=None "
                 "Requeue=1 Restarts=1 BatchFlag=1 ExitCode=0:0")
SHOW_TIMEOUT = "JobId=132 JobState=COMPLETING Reason=TimeLimit Restarts=0 TimeLimit=00:01:00"
SHOW_CANCEL = "JobId=130 JobState=COMPLETING Reason=None Restarts=0 EndTime=2026-11-30T13:17:31"


@pytest.mark.parametrize("text, restarts, cause", [
    (SHOW_REQUEUED, 0, REQUEUED),
    (SHOW_REQUEUED, 1, CANCELLED),  # the count the execution started with: not a new requeue
    (SHOW_TIMEOUT, 0, TIME_LIMIT),
    (SHOW_CANCEL, 0, CANCELLED),
    ("", 0, CANCELLED),
    ("garbage Restarts=x", 0, CANCELLED),
])
def test_classify_termination_from_scontrol_show_job(text, restarts, cause):
    assert classify_termination(parse_show_job(text), restarts) == cause


def test_identity_of_an_array_task():
    ident = identity({"SLURM_JOB_ID": "37", "SLURM_ARRAY_JOB_ID": "36",
                      "SLURM_ARRAY_TASK_ID": "1", "SLURM_RESTART_COUNT": "2",
                      "SLURMD_NODENAME": "node1", "SLURM_JOB_NODELIST": "node1",
                      "SLURM_JOB_NUM_NODES": "1"})
    assert (ident.key, ident.job_id, ident.restart_count, ident.num_nodes) == ("36_1", "37", 2, 1)
    assert identity({}).key is None and identity({}).restart_count == 0
