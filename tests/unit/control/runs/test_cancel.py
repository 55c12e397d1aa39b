"""Cancel: only recorded jobs are scancelled, states converge, a second call does nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import pytest

from synthbatch.control.errors import InvalidInput
from synthbatch.control.runs.cancel import BY_CANCEL, cancel_run
from synthbatch.control.runs.status.ledger import cancel_requested
from synthbatch.control.slurm.scheduler import Scheduler
from tests.fakes import FakeSlurm, Shard, make_run


class Clock:
    """A fake monotonic clock that sleeping advances."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: List[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds


def attempt(layout, shard: int) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(layout.attempt(shard, 1).attempt_json.read_text())


def test_cancel_whole_run_scancels_the_array_and_converges(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("winner"), Shard("running"), Shard("submitted")])
    fake, clock = FakeSlurm(), Clock()
    fake.on("scancel")
    fake.on("squeue", stdout="500_1|CANCELLED|None\n500_2|CANCELLED|JobHeldUser\n")
    data = cancel_run(layout, Scheduler(runner=fake), [], 30, clock, clock.sleep)
    assert [c for c in fake.calls if c[0] == "scancel"] == [["scancel", "500_1", "500_2"]]
    assert data["converged"] and data["waiting_for"] == []
    assert data["states"] == {"0": "succeeded", "1": "cancelled", "2": "cancelled"}
    assert attempt(layout, 2)["reason"] == BY_CANCEL
    assert cancel_requested(layout) == {0, 1, 2}


def test_cancel_folds_a_whole_open_submission_into_the_array_id(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("submitted"), Shard("running")])
    fake, clock = FakeSlurm(), Clock()
    fake.on("scancel")
    fake.on("squeue", stdout="")  # gone from squeue entirely: ended
    data = cancel_run(layout, Scheduler(runner=fake), None, 30, clock, clock.sleep)
    assert data["scancelled"] == ["500"]
    assert data["states"] == {"0": "cancelled", "1": "cancelled"}


def test_cancel_one_shard_leaves_the_others(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("running"), Shard("running")])
    fake, clock = FakeSlurm(), Clock()
    fake.on("scancel")
    fake.on("squeue", stdout="500_0|RUNNING|None\n500_1|CANCELLED|None\n")
    data = cancel_run(layout, Scheduler(runner=fake), [1], 30, clock, clock.sleep)
    assert data["scancelled"] == ["500_1"] and data["states"] == {"1": "cancelled"}
    assert attempt(layout, 0)["state"] == "running"


def test_cancel_is_idempotent(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("submitted")])
    fake, clock = FakeSlurm(), Clock()
    fake.on("scancel")
    fake.on("squeue", stdout="500_0|CANCELLED|None\n")
    first = cancel_run(layout, Scheduler(runner=fake), [], 30, clock, clock.sleep)
    calls = len(fake.calls)
    second = cancel_run(layout, Scheduler(runner=fake), [], 30, clock, clock.sleep)
    assert second["states"] == first["states"] == {"0": "cancelled"}
    assert second["scancelled"] == [] and second["converged"]
    assert len(fake.calls) == calls  # the second call asked Slurm nothing
    assert len(list((layout.root / "cancels").iterdir())) == 1


def test_created_attempts_are_cancelled_without_slurm(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("created")], job_id=None)
    fake, clock = FakeSlurm(), Clock()
    data = cancel_run(layout, Scheduler(runner=fake), [], 30, clock, clock.sleep)
    assert fake.calls == [] and data["states"] == {"0": "cancelled"}
    assert attempt(layout, 0)["reason"] == f"{BY_CANCEL} before submission"


def test_slow_jobs_are_not_settled_and_polling_backs_off(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("running")])
    fake, clock = FakeSlurm(), Clock()
    fake.on("scancel")
    fake.on("squeue", stdout="500_0|COMPLETING|None\n")
    data = cancel_run(layout, Scheduler(runner=fake), [], 20, clock, clock.sleep)
    assert not data["converged"] and data["waiting_for"] == ["500_0"]
    assert attempt(layout, 0)["state"] == "running"  # the agent may still write it
    assert clock.now == pytest.approx(20)
    assert clock.sleeps[:3] == [1.0, 1.5, 2.25] and max(clock.sleeps) <= 10
    assert len(clock.sleeps) < 12


def test_agent_outcome_stands(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("running")])
    fake, clock = FakeSlurm(), Clock()
    fake.on("scancel")

    def squeue(args: List[str]):  # type: ignore[no-untyped-def]
        # the agent records its own outcome before Slurm reports the job ended
        path = layout.attempt(0, 1).attempt_json
        data = json.loads(path.read_text())
        data.update(state="cancelled", reason="received SIGTERM", revision=data["revision"] + 1)
        path.write_text(json.dumps(data))
        return 0, "500_0|CANCELLED|None\n", ""

    fake.replies["squeue"] = squeue
    cancel_run(layout, Scheduler(runner=fake), [], 20, clock, clock.sleep)
    assert attempt(layout, 0)["reason"] == "received SIGTERM"


@pytest.mark.parametrize("shards", [[3], [-1], [0, 7]])
def test_bad_shard_is_invalid_input(tmp_path: Path, shards: List[int]) -> None:
    layout = make_run(tmp_path, [Shard("running"), Shard("running")])
    with pytest.raises(InvalidInput, match="the run has 2 shards"):
        cancel_run(layout, Scheduler(runner=FakeSlurm()), shards, 1)


def test_a_first_attempt_without_a_record_yet_is_cancelled_with_its_first_record(
        tmp_path: Path) -> None:
    # A first attempt has no record until something writes its second revision (its
    # submission record implies the first): here, no job id yet, so `created`.
    layout = make_run(tmp_path, [Shard("created"), Shard("created")], job_id=None)
    layout.attempt(1, 1).attempt_json.unlink()
    fake, clock = FakeSlurm(), Clock()
    data = cancel_run(layout, Scheduler(runner=fake), [1], 30, clock, clock.sleep)
    assert fake.calls == [] and data["states"] == {"1": "cancelled"}
    record = attempt(layout, 1)
    assert (record["state"], record["revision"], record["reason"], record["shard"]) == (
        "cancelled", 2, f"{BY_CANCEL} before submission", 1)
    assert attempt(layout, 0)["state"] == "created"


DOWN = "scancel: error: Unable to contact slurm controller (connect failure)\n"


def _cancel_during_outage(tmp_path: Path):  # type: ignore[no-untyped-def]
    """``cancel`` of a running run while slurmctld is down: exit 5, the request kept."""
    from synthbatch.control.errors import SchedulerUncertain

    layout = make_run(tmp_path, [Shard("running"), Shard("running")])
    fake, clock = FakeSlurm(), Clock()
    fake.on("scancel", code=1, stderr=DOWN)
    with pytest.raises(SchedulerUncertain):
        cancel_run(layout, Scheduler(runner=fake), [], 30, clock, clock.sleep)
    (record,) = (layout.root / "cancels").iterdir()
    assert json.loads(record.read_text())["carried_out"] is False
    return layout, record


def test_a_cancel_slurm_did_not_answer_is_carried_out_by_the_next_status(
        tmp_path: Path) -> None:
    """Before: status said "cancel requested; squeue says RUNNING" for good, and the job
    ran on until someone cancelled again."""
    from synthbatch.control.runs.status.refresh import observe

    layout, record = _cancel_during_outage(tmp_path)
    fake = FakeSlurm()  # slurmctld is back
    fake.on("squeue", stdout="500_0|RUNNING|None\n500_1|RUNNING|None\n")
    fake.on("scancel")
    data = observe(layout, Scheduler(runner=fake))
    assert [c for c in fake.calls if c[0] == "scancel"] == [["scancel", "500"]]
    (note,) = data["notes"]
    assert note.startswith("the cancel requested at ") and note.endswith(
        ", when Slurm could not be reached, was carried out now: scancel 500")
    assert json.loads(record.read_text())["carried_out"] is True
    assert {r["state"] for r in data["shards"]} == {"cancelling"}
    again = observe(layout, Scheduler(runner=fake))  # done once: not again
    assert [c for c in fake.calls if c[0] == "scancel"] == [["scancel", "500"]]
    assert again["notes"] == []


def test_a_status_during_the_outage_leaves_the_cancel_pending(tmp_path: Path) -> None:
    from synthbatch.control.runs.status.refresh import observe

    layout, record = _cancel_during_outage(tmp_path)
    fake = FakeSlurm()
    fake.on("squeue", code=1, stderr="slurm_load_jobs error: Unable to contact slurm "
                                     "controller (connect failure)\n")
    data = observe(layout, Scheduler(runner=fake))
    assert data["scheduler_error"] and not [c for c in fake.calls if c[0] == "scancel"]
    assert json.loads(record.read_text())["carried_out"] is False


def test_a_cancel_slurm_did_not_answer_is_carried_out_by_the_next_cancel(
        tmp_path: Path) -> None:
    layout, first = _cancel_during_outage(tmp_path)
    fake, clock = FakeSlurm(), Clock()
    fake.on("scancel")
    fake.on("squeue", stdout="500_0|RUNNING|None\n500_1|CANCELLED|None\n")
    data = cancel_run(layout, Scheduler(runner=fake), [1], 0, clock, clock.sleep)
    assert [c for c in fake.calls if c[0] == "scancel"] == [["scancel", "500_1"],
                                                             ["scancel", "500"]]
    assert data["notes"][0].endswith("was carried out now: scancel 500")
    assert all(json.loads(p.read_text())["carried_out"]
               for p in (layout.root / "cancels").iterdir())
