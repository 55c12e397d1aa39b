"""Logs: the right file of the latest execution, and following it until the shard ends."""

from __future__ import annotations

import io
from pathlib import Path
from typing import List, Optional

import pytest

from synthbatch.agent_stdlib.statefile import ensure_dir
from synthbatch.control.errors import NotFound
from synthbatch.control.runs.logs import copy_from, follow, locate, newer_target, read_tail
from synthbatch.control.runs.status.watch import Backoff
from tests.fakes import Shard, make_run


def add_logs(layout, shard: int, execution: int, *steps: str) -> Path:  # type: ignore[no-untyped-def]
    folder = ensure_dir(layout.attempt(shard, 1).execution_logs(execution))
    for step in steps:
        (folder / f"{step}.log").write_text(f"{step} of execution {execution}\n")
    return folder


def test_default_is_the_client_log_of_the_latest_execution(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("running")])
    add_logs(layout, 0, 1, "client", "server-tiny-0")
    latest = add_logs(layout, 0, 2, "client", "server-tiny-0", "proxy-tiny")
    target = locate(layout)
    assert (target.shard, target.attempt, target.execution, target.step) == (0, 1, 2, "client")
    assert target.path == latest / "client.log"
    assert target.steps == ["client", "proxy-tiny", "server-tiny-0"]


def test_the_log_a_failure_names_wins(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("winner"), Shard("failed", "placeholder")])
    folder = add_logs(layout, 1, 1, "client", "server-tiny-0")
    path = layout.attempt(1, 1).attempt_json
    path.write_text(path.read_text().replace(
        "placeholder", f"server-tiny-0 exited with status 1 (log {folder}/server-tiny-0.log: x)"))
    target = locate(layout)  # no --shard: the first failed shard
    assert (target.shard, target.step) == (1, "server-tiny-0")


def test_slurm_step_and_explicit_step(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("submitted"), Shard("running")])
    (layout.slurm_logs / "slurm-500_0.out").write_text("queued\n")
    target = locate(layout, 0)
    assert target.step == "slurm" and target.steps == ["slurm"]
    add_logs(layout, 1, 1, "client", "proxy-tiny")
    assert locate(layout, 1, "proxy-tiny").path.name == "proxy-tiny.log"


def test_unknown_step_lists_the_ones_there(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("running")])
    add_logs(layout, 0, 1, "client")
    with pytest.raises(NotFound, match=r"no log for step 'server-x-0' \(steps with logs: client"):
        locate(layout, 0, "server-x-0")
    with pytest.raises(NotFound, match="the run has 1 shards"):
        locate(layout, 4)


def test_no_logs_yet(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("submitted")])
    with pytest.raises(NotFound, match="steps with logs: none yet"):
        locate(layout, 0)


def test_read_tail_and_copy(tmp_path: Path) -> None:
    path = tmp_path / "x.log"
    path.write_bytes(b"a" * 10 + b"tail")
    assert read_tail(path, 4) == "tail"
    out = io.BytesIO()
    assert copy_from(path, out, 10) == 14 and out.getvalue() == b"tail"


def test_follow_prints_appends_until_done(tmp_path: Path) -> None:
    path = tmp_path / "client.log"
    path.write_text("one\n")
    out = io.BytesIO()
    chunks = ["two\n", "three\n"]
    sleeps: List[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if chunks:
            with open(path, "a") as handle:
                handle.write(chunks.pop(0))

    def done() -> bool:
        return not chunks and len(sleeps) >= 4

    follow(path, out, done, sleep, Backoff(base_s=0.2, cap_s=2.0, floor_s=0.2))
    assert out.getvalue() == b"one\ntwo\nthree\n"
    assert all(0.2 <= s <= 2.0 for s in sleeps) and sleeps[-1] > sleeps[1]


def test_follow_moves_on_to_the_next_execution_after_a_requeue(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("running")])
    first = add_logs(layout, 0, 1, "client", "server-tiny-0")
    target = locate(layout, 0, "client")
    assert target.path == first / "client.log"
    assert newer_target(layout, target) is None
    out = io.BytesIO()
    polls: List[str] = []

    def sleep(seconds: float) -> None:
        polls.append("sleep")
        if len(polls) == 1:  # the job is requeued: execution 2 starts, servers first
            with open(first / "client.log", "a") as handle:
                handle.write("last words of execution 1\n")
            add_logs(layout, 0, 2, "server-tiny-0")
        elif len(polls) == 3:  # then the client of execution 2
            add_logs(layout, 0, 2, "client")

    current = [target]

    def newer() -> Optional[Path]:
        found = newer_target(layout, current[0])
        if found is None:
            return None
        current[0] = found
        return found.path

    def done() -> bool:
        return current[0].execution == 2 and len(polls) >= 6

    follow(target.path, out, done, sleep, Backoff(base_s=0.2, cap_s=2.0, floor_s=0.2), newer)
    assert out.getvalue() == (b"client of execution 1\nlast words of execution 1\n"
                              b"client of execution 2\n")
    assert current[0].execution == 2 and current[0].step == "client"


def test_follow_moves_on_to_a_retry_attempt(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("failed", "boom")])
    add_logs(layout, 0, 1, "client")
    target = locate(layout, 0, "client")
    folder = ensure_dir(layout.attempt(0, 2).execution_logs(1))
    (folder / "client.log").write_text("attempt 2\n")
    assert newer_target(layout, target) is None  # attempt 2 has no attempt.json yet
    record = layout.attempt(0, 1).attempt_json.read_text()
    ensure_dir(layout.attempt(0, 2).root)
    layout.attempt(0, 2).attempt_json.write_text(
        record.replace('"attempt": 1', '"attempt": 2').replace('"failed"', '"running"'))
    found = newer_target(layout, target)
    assert found is not None and (found.attempt, found.execution) == (2, 1)
    assert found.path == folder / "client.log"


# ----------------------------------------------------------------------------- waiting (tail -F)


def test_await_target_waits_for_the_client_log_to_appear(tmp_path: Path) -> None:
    from synthbatch.control.runs.logs import await_target

    layout = make_run(tmp_path, [Shard("submitted")])
    notes: List[str] = []
    naps: List[float] = []

    def sleep(seconds: float) -> None:  # the job starts while we wait
        naps.append(seconds)
        if len(naps) == 2:  # Slurm's own log comes first: not the one to follow
            (layout.slurm_logs / "slurm-500_0.out").write_text("")
        if len(naps) == 3:
            add_logs(layout, 0, 1, "server-tiny-0", "client")

    target = await_target(layout, 0, notify=notes.append, sleep=sleep)
    assert target.step == "client" and target.path.read_text() == "client of execution 1\n"
    assert len(naps) == 3
    assert notes == ["waiting for the client log of shard 0 (attempt 1 is submitted)"]


def test_await_target_of_a_shard_that_failed_before_its_client_ran(tmp_path: Path) -> None:
    from synthbatch.control.runs.logs import await_target

    layout = make_run(tmp_path, [Shard("failed", reason="preflight: no GPUs")])
    (layout.slurm_logs / "slurm-500_0.out").write_text("agent: preflight failed\n")
    target = await_target(layout, 0, sleep=lambda s: pytest.fail("must not wait"))
    assert target.step == "slurm"  # the default of a failed shard without a client log


def test_await_target_of_a_named_step_says_which(tmp_path: Path) -> None:
    from synthbatch.control.runs.logs import await_target

    layout = make_run(tmp_path, [Shard("running")])
    notes: List[str] = []

    def sleep(seconds: float) -> None:
        add_logs(layout, 0, 1, "client")

    target = await_target(layout, 0, "client", notify=notes.append, sleep=sleep)
    assert target.step == "client"
    assert notes == ["waiting for the client log of shard 0 (attempt 1 is running)"]


def test_await_target_gives_up_once_the_shard_ended_without_the_log(tmp_path: Path) -> None:
    from synthbatch.control.runs.logs import await_target

    layout = make_run(tmp_path, [Shard("cancelled", reason="cancelled before it started")])
    with pytest.raises(NotFound, match="no log for step 'client'"):
        await_target(layout, 0, "client", sleep=lambda s: pytest.fail("must not wait"))


def test_logs_follow_right_after_submit_waits_instead_of_exiting_3(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import time

    from synthbatch.agent_stdlib.attempts import advance_attempt
    from tests.fakes import invoke

    profile = tmp_path / "profile.toml"
    profile.write_text(f'schema_version = 1\nworkspace = "{tmp_path / "ws"}"\n')
    layout = make_run(tmp_path / "ws", [Shard("submitted")])
    real_sleep = time.sleep

    def job_runs_and_ends(seconds: float) -> None:
        add_logs(layout, 0, 1, "client")
        advance_attempt(layout.attempt(0, 1).attempt_json, "running")
        advance_attempt(layout.attempt(0, 1).attempt_json, "succeeded")

    monkeypatch.setattr(time, "sleep", job_runs_and_ends)
    result = invoke("logs", "obs-20240101-000000-abcdef", "--step", "client", "--follow",
                    "--profile", str(profile))
    monkeypatch.setattr(time, "sleep", real_sleep)
    assert result.exit_code == 0, result.output
    assert result.stdout == "client of execution 1\n"
    assert "synthbatch: waiting for the client log of shard 0 (attempt 1 is submitted)" in \
        result.stderr
    assert json.loads(layout.attempt(0, 1).attempt_json.read_text())["state"] == "succeeded"
