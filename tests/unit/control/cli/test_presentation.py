"""What status says about a run beyond its states: pending reasons that block it, a
finished run's numbers, and the watch screen (narrow terminals, colour)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from synthbatch.control.cli.output import paint, use_colour
from synthbatch.control.cli.render import blocked_lines, frame, runs_text, status_text
from synthbatch.control.cli.status import Screen
from synthbatch.control.runs.status.pending import blocked, explain
from synthbatch.control.runs.status.rows import ShardRow
from tests.fakes import NOW, Shard, fake_slurm_bin, invoke, make_run, profile_with_bin

RUN = "obs-20240101-000000-abcdef"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def status_json(profile: str) -> Dict[str, Any]:
    result = invoke("status", RUN, "--json", "--profile", profile)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# ----------------------------------------------------------------------------- pending


@pytest.mark.parametrize("reason, never", [
    ("BadConstraints", True), ("PartitionConfig", True), ("PartitionTimeLimit", True),
    ("InvalidAccount", True), ("ReqNodeNotAvail, UnavailableNodes:node2", False),
    ("JobHeldAdmin", False),
])
def test_reasons_that_block(reason: str, never: bool) -> None:
    hint, forever = explain(reason)
    assert forever is never and hint


@pytest.mark.parametrize("reason", [None, "", "Resources", "Priority", "JobArrayTaskLimit",
                                    "BeginTime", "JobHeldUser"])
def test_reasons_that_are_just_the_queue(reason: str) -> None:
    assert explain(reason) is None


def test_blocked_groups_pending_shards_by_reason() -> None:
    rows = [{"index": i, "state": "pending", "reason": "BadConstraints"} for i in (0, 1, 2)]
    rows += [{"index": 3, "state": "pending", "reason": "Resources"},
             {"index": 4, "state": "running", "reason": None},
             {"index": 5, "state": "pending", "reason": "ReqNodeNotAvail, UnavailableNodes:n1"}]
    groups = blocked(list(map(ShardRow.from_dict, rows)))
    assert [(g["reason"], g["shards"], g["never"]) for g in groups] == [
        ("BadConstraints", [0, 1, 2], True),
        ("ReqNodeNotAvail, UnavailableNodes:n1", [5], False)]
    lines = blocked_lines({"blocked": groups})
    assert lines[0].startswith("  can never start: shard(s) 0-2 pending BadConstraints: no "
                               "node of the partition has")
    assert lines[1].startswith("  waiting: shard(s) 5 pending ReqNodeNotAvail")


def test_status_shows_a_run_that_can_never_start(tmp_path: Path, workspace: Path,
                                                 profile_file: Path) -> None:
    make_run(workspace, [Shard("submitted"), Shard("submitted")])
    folder = fake_slurm_bin(tmp_path, squeue="echo '500_[0-1]|PENDING|BadConstraints'")
    profile = profile_with_bin(profile_file, folder)
    data = status_json(profile)
    assert data["state"] == "running"
    assert data["blocked"] == [{"reason": "BadConstraints", "shards": [0, 1], "never": True,
                                "hint": data["blocked"][0]["hint"]}]
    text = invoke("status", RUN, "--profile", profile).stdout.splitlines()
    assert text[2].startswith("  can never start: shard(s) 0-1 pending BadConstraints: ")
    assert "cancel the run, fix the request" in text[2]


# ----------------------------------------------------------------------------- totals


SACCT_BY_FORMAT = (  # answers what is asked: states, usage, or both in one call
    'case "$*" in\n'
    "  *State*ElapsedRaw*) echo '500_0|RUNNING|0:0|30|gres/gpu=1'; "
    "echo '500_1|CANCELLED by 0|0:15|10|gres/gpu=1';;\n"
    "  *ElapsedRaw*) echo '500_0|30|gres/gpu=1'; echo '500_1|10|gres/gpu=1';;\n"
    "  *) echo '500_0|RUNNING|0:0'; echo '500_1|CANCELLED by 0|0:15';;\n"
    "esac")


def test_one_sacct_call_per_refresh_of_a_running_run(tmp_path: Path, workspace: Path,
                                                     profile_file: Path) -> None:
    """A shard squeue no longer lists needs sacct's state, the running run's GPU-hours
    need sacct's usage: both come from one call."""
    make_run(workspace, [Shard("running"), Shard("submitted")])
    calls = tmp_path / "sacct-calls"
    folder = fake_slurm_bin(tmp_path, squeue="echo '500_0|RUNNING|None'",
                            sacct=f'echo "$*" >> {calls}\n' + SACCT_BY_FORMAT)
    data = status_json(profile_with_bin(profile_file, folder))
    assert [s["state"] for s in data["shards"]] == ["running", "cancelled"]
    assert data["totals"]["gpu_hours"] == round(40 / 3600, 4)
    assert len(calls.read_text().splitlines()) == 1, calls.read_text()


def test_a_finished_run_keeps_its_numbers(tmp_path: Path, workspace: Path,
                                          profile_file: Path) -> None:
    make_run(workspace, [Shard("winner", progress=10, updated_at=NOW + 50),
                         Shard("winner", progress=10, updated_at=NOW + 100)])
    calls = tmp_path / "sacct-calls"
    folder = fake_slurm_bin(tmp_path, sacct=f"echo \"$*\" >> {calls}\n"
                                            "echo '500_0|40|billing=2,cpu=2,gres/gpu=2,mem=1G'\n"
                                            "echo '500_1|50|billing=2,cpu=2,gres/gpu=2,mem=1G'")
    profile = profile_with_bin(profile_file, folder)
    totals = status_json(profile)["totals"]
    assert totals == {"elapsed_s": 100.0, "active_s": 100.0, "records_per_s": 0.2,
                      "tokens_per_s": 1.4,
                      "gpu_hours": round((40 * 2 + 50 * 2) / 3600, 4),
                      "gpu_hours_from": "accounting (sacct)"}
    assert "-D" in calls.read_text().split()  # every execution, requeues included
    again = status_json(profile)["totals"]
    assert again == totals and len(calls.read_text().splitlines()) == 1  # kept: not asked
    text = invoke("status", RUN, "--profile", profile).stdout.splitlines()[1]
    assert text == ("  tokens 140  elapsed 0:01:40  0.20 records/s  1.4 tokens/s (average)  "
                    "GPU-hours 0.050")


def test_gpu_hours_wait_until_accounting_has_every_shard(tmp_path: Path, workspace: Path,
                                                         profile_file: Path) -> None:
    layout = make_run(workspace, [Shard("winner"), Shard("winner")])
    folder = fake_slurm_bin(tmp_path, sacct="echo '500_0|40|gres/gpu=1'")  # 500_1 lags
    profile = profile_with_bin(profile_file, folder)
    assert status_json(profile)["totals"]["gpu_hours"] == round(40 / 3600, 4)
    assert not (layout.root / "totals.json").exists()  # counted again next time


def test_without_accounting_gpu_hours_are_unknown(tmp_path: Path, workspace: Path,
                                                  profile_file: Path) -> None:
    make_run(workspace, [Shard("winner")])
    folder = fake_slurm_bin(tmp_path, sacct="echo 'Slurm accounting storage is disabled' >&2"
                                            "; exit 1")
    totals = status_json(profile_with_bin(profile_file, folder))["totals"]
    assert totals["gpu_hours"] is None
    assert totals["gpu_hours_from"] == "no accounting on this cluster"


def test_a_running_run_has_its_numbers_so_far(tmp_path: Path, workspace: Path,
                                              profile_file: Path) -> None:
    """gpu_hours was null until the run ended, and the human line had no tokens/s."""
    make_run(workspace, [Shard("running", progress=4)])
    folder = fake_slurm_bin(tmp_path, squeue="echo '500_0|RUNNING|None'",
                            sacct="echo '500_0|1800|gres/gpu=2'")
    profile = profile_with_bin(profile_file, folder)
    totals = status_json(profile)["totals"]
    assert totals["elapsed_s"] > 0 and totals["gpu_hours"] == 1.0
    assert totals["gpu_hours_from"] == "accounting (sacct)"
    line = invoke("status", RUN, "--profile", profile).stdout.splitlines()[1]
    assert " tokens/s (average)" in line and line.endswith("GPU-hours 1.00"), line
    (folder / "sacct").write_text("#!/bin/sh\necho unexpected >&2; exit 1\n")
    totals = status_json(profile)["totals"]  # status itself is not failed by it
    assert totals["gpu_hours"] is None and "unexpected" in totals["gpu_hours_from"]


# ----------------------------------------------------------------------------- watch screen


def data_with(states: List[str]) -> Dict[str, Any]:
    shards = [{"index": i, "state": s, "reason": "job failed before the agent recorded an "
                                                 "outcome (exit 3)" if s == "failed" else None,
               "attempt": 1, "job_id": f"500_{i}", "records": 10, "records_done": 3,
               "tokens": 0} for i, s in enumerate(states)]
    failures = [{"shard": s["index"], "state": "failed", "reason": s["reason"],
                 "log": "/ws/runs/x/logs/slurm-500_1.out"} for s in shards
                if s["state"] == "failed"]
    return {"run_id": RUN, "state": "running", "records": 10 * len(states),
            "records_done": 3 * len(states), "counts": {"running": 1}, "tokens": 0,
            "rate": 0.0, "eta_s": None, "notes": [], "failures": failures, "shards": shards}


def test_watch_fits_every_line_to_a_narrow_terminal(capsys: pytest.CaptureFixture) -> None:
    screen = Screen(tty=True, width=lambda: 40, colour=False)
    screen.show(data_with(["running", "failed", "pending"]))
    first = capsys.readouterr().out
    lines = first.rstrip("\n").split("\n")
    assert all(len(line) <= 39 for line in lines), lines
    assert len(lines) == len(frame(data_with(["running", "failed", "pending"])))
    screen.show(data_with(["running", "failed"]))
    second = capsys.readouterr().out
    assert second.startswith(f"\x1b[{len(lines)}F\x1b[J")  # up exactly the rows drawn


def test_at_60_columns_the_bars_narrow_and_keep_the_state_word(
        capsys: pytest.CaptureFixture) -> None:
    """The bar row was 63 columns for a shard cancelling: cut, it lost its state word."""
    states = ["cancelling", "succeeded", "running"]
    for columns in (60, 45):
        Screen(tty=True, width=lambda c=columns: c, colour=True).show(data_with(states))
        rows = [ANSI.sub("", line) for line in capsys.readouterr().out.splitlines()
                if "/10" in line]
        assert [row.split()[-1] for row in rows] == states, rows
        assert all(len(row) <= columns - 1 for row in rows), rows
    coloured = paint("\n".join(frame(data_with(states), 45)))
    assert coloured.count("\x1b[33mcancelling\x1b[0m") == 1  # still the state column


def test_watch_colours_states_unless_told_not_to(capsys: pytest.CaptureFixture) -> None:
    Screen(tty=True, width=lambda: 200, colour=True).show(data_with(["failed"]))
    coloured = capsys.readouterr().out
    assert "\x1b[31mfailed\x1b[0m" in coloured
    Screen(tty=True, width=lambda: 200, colour=False).show(data_with(["failed"]))
    assert not ANSI.search(capsys.readouterr().out)


def test_untrusted_escapes_in_a_reason_never_reach_the_terminal(
        capsys: pytest.CaptureFixture) -> None:
    data = data_with(["failed"])
    data["failures"][0]["reason"] = "boom \x1b[2J\x1b[31m"
    Screen(tty=True, width=lambda: 200, colour=True).show(data)
    out = capsys.readouterr().out
    assert "\x1b[2J" not in out and "\\x1b[2J" in out


def test_colour_only_on_a_terminal_without_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert use_colour()
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_colour()
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    assert not use_colour()


def test_paint_colours_the_state_column_only() -> None:
    """A reason saying "squeue failed" turned red: only the state column is coloured."""
    data = data_with(["failed", "running"])
    data["failures"][0]["reason"] = "squeue failed; pending running cancelled"
    data["shards"][0]["reason"] = data["failures"][0]["reason"]
    data["notes"] = ["scheduler unavailable: squeue failed"]
    text = paint(status_text(data))
    painted = [line for line in text.splitlines() if ANSI.search(line)]
    assert [ANSI.sub("", line).split()[:3] for line in painted] == [
        ["run", f"{RUN}:", "running"], ["shard", "0", "failed"], ["shard", "1", "running"],
        ["shard", "0", "failed"]]  # headline, two shard rows, the failure row
    assert all(line.count("\x1b[") == 2 for line in painted)  # one word, opened and closed
    assert "squeue failed; pending running cancelled" in text  # the reasons stay plain
    assert not ANSI.search(paint("shard 1 failed; pre-failed failedX running"))
    row = runs_text([{"run_id": RUN, "state": "failed", "problem": "squeue failed"}])
    assert paint(row).count("\x1b[31mfailed\x1b[0m") == 1
    bars = paint("\n".join(frame(data)))
    bar_row = next(line for line in bars.splitlines() if "shard   1 [" in line)
    assert bar_row.endswith("\x1b[36mrunning\x1b[0m")


def test_piped_status_has_no_colour(workspace: Path, profile_file: Path) -> None:
    make_run(workspace, [Shard("failed", reason="x")])
    result = invoke("status", RUN, "--profile", str(profile_file))
    assert not ANSI.search(result.stdout)


def test_a_node_clock_ahead_does_not_count_into_the_numbers(tmp_path: Path, workspace: Path,
                                                            profile_file: Path) -> None:
    """Issue 22 (a node's clock 15 minutes ahead, on the testbed): the last record's time
    is the node's; status said elapsed 917.7 s for a run of ~18 s, and `runs` the same."""
    now = time.time()
    layout = make_run(workspace, [Shard("winner", progress=10, updated_at=now + 900)])
    record = json.loads(layout.run_json.read_text())
    layout.run_json.chmod(0o600)
    layout.run_json.write_text(json.dumps({**record, "created_at": now - 20}))
    folder = fake_slurm_bin(tmp_path, sacct="echo '500_0|20|gres/gpu=1'")
    totals = status_json(profile_with_bin(profile_file, folder))["totals"]
    assert 20 <= totals["elapsed_s"] < 60, totals
    (run,) = json.loads(invoke("runs", "--profile", str(profile_file), "--json").stdout)["runs"]
    assert 20 <= run["elapsed_s"] < 60, run


def test_status_shows_the_serving_flags() -> None:
    """Issue 32: each idle or saturated alias of the running shards, one line each."""
    data = data_with(["running"])
    data["serving_flags"] = ["gen: KV cache 98%, 120 waiting — add replicas",
                             "judge: 2 replicas, 4% busy, 0 waiting — over-provisioned"]
    lines = status_text(data).splitlines()
    assert "  serving: gen: KV cache 98%, 120 waiting — add replicas" in lines
    assert "  serving: judge: 2 replicas, 4% busy, 0 waiting — over-provisioned" in lines
    assert not any("serving:" in line for line in status_text(data_with(["running"]))
                   .splitlines())


def test_a_shard_shows_its_attempt_of_the_budget() -> None:
    """status --shard N says "attempt 2 of 3", like the run's shard table (issue 34)."""
    from synthbatch.control.cli.render import shard_text

    row = {"index": 4, "state": "running", "records_done": 3, "records": 10, "attempt": 2,
           "job_id": "77_4"}
    assert "attempt 2 of 3  job 77_4" in shard_text({"run_id": "r", "shard": row,
                                                      "log": None, "max_attempts": 3})
    assert "attempt 2  job 77_4" in shard_text({"run_id": "r", "shard": row, "log": None})
