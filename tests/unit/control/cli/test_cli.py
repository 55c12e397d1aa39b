"""The ``synthbatch`` CLI through click's CliRunner: output shapes and exit codes."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
from click.testing import Result

from synthbatch.agent_stdlib.candidate import build_manifest
from synthbatch.agent_stdlib.contracts import RunRecord, WinnerRecord, sha256_bytes
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import ensure_dir, publish_immutable, publish_json_immutable
from synthbatch.control.config.loader import load_model
from synthbatch.control.config.profile import Profile
from synthbatch.control.config.run import RunConfig
from synthbatch.control.planning.planner import make_plan
from tests.conftest import REPO
from tests.fakes import invoke

QUICKSTART = REPO / "examples" / "fake-server.toml"
TESTBED = REPO / "examples" / "profiles" / "testbed.toml"
RUN_ID = "quickstart-20240101-000000-abcdef"


def one_error_line(result: Result) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert lines[0].startswith("synthbatch: error: "), lines[0]
    return lines[0]


def json_error(result: Result) -> Dict[str, str]:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    payload = json.loads(lines[0])
    assert list(payload) == ["error"]
    assert {"code", "message"} <= set(payload["error"])
    return payload["error"]


def build_run(workspace: Path, winners: List[int], committed: bool = True) -> RunLayout:
    """The quickstart run (3 shards of 10) with winners for the given shards."""
    plan = make_plan(load_model(QUICKSTART, RunConfig), load_model(TESTBED, Profile), RUN_ID,
                     QUICKSTART.parent)
    layout = RunLayout(ensure_dir(workspace / "runs" / RUN_ID))
    plan_bytes = plan.to_json().encode()
    publish_immutable(layout.plan_json, plan_bytes, mode=0o400)
    for index in winners:
        shard = plan.shard(index)
        out = ensure_dir(layout.attempt(index, 1).output)
        lines = [json.dumps({"index": i}) + "\n"
                 for i in range(shard.record_offset, shard.record_offset + shard.num_records)]
        (out / "records.jsonl").write_text("".join(lines))
        manifest = build_manifest(out, index, 1, shard.num_records)
        winner = WinnerRecord(shard=index, attempt=1, records=manifest.records,
                              result_sha256=sha256_bytes(manifest.to_json().encode()),
                              files=manifest.files, created_at=time.time())
        publish_json_immutable(layout.winner_json(index), winner.to_dict())
    if committed:
        record = RunRecord(run_id=RUN_ID, name=plan.name, created_at=1.0,
                           plan_sha256=sha256_bytes(plan_bytes), agent_pyz="agent-x.pyz",
                           agent_sha256="0" * 64, backend="slurm",
                           job_name=f"synthbatch-{RUN_ID}", shard_count=len(plan.shards))
        publish_immutable(layout.run_json, record.to_json().encode())
    return layout


# ----------------------------------------------------------------------------- help


def test_help() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("plan", "submit", "status", "merge", "runs"):
        assert command in result.stdout


@pytest.mark.parametrize("command", ["plan", "submit", "status", "merge", "runs"])
def test_command_help_has_common_options(command: str) -> None:
    result = invoke(command, "--help")
    assert result.exit_code == 0
    for option in ("--profile", "--json", "--debug"):
        assert option in result.stdout


def test_unknown_command() -> None:
    result = invoke("frobnicate")
    assert result.exit_code == 2


# ----------------------------------------------------------------------------- plan


def test_plan_prints_summary_and_script() -> None:
    result = invoke("plan", str(QUICKSTART), "--profile", str(TESTBED))
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    out = result.stdout
    assert out.startswith("run fake-server: 30 records in 3 shards (10 per shard at most)\n")
    assert "--- batch script ---\n#!/bin/bash\n" in out
    for line in ("#SBATCH --gres=gpu:1", "#SBATCH --partition=debug", "#SBATCH --time=00:10:00",
                 "#SBATCH --signal=B:USR1@30", "#SBATCH --requeue"):
        assert line in out.splitlines()
    assert "exec /usr/bin/python3 -I" in out


def test_plan_with_relative_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    result = invoke("plan", "examples/fake-server.toml", "--profile",
                    "examples/profiles/testbed.toml")
    assert result.exit_code == 0, result.stderr
    assert "run fake-server" in result.stdout


def test_plan_json_is_one_object() -> None:
    result = invoke("plan", str(QUICKSTART), "--profile", str(TESTBED), "--json")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.count("\n") == 1 and result.stdout.endswith("\n")
    data = json.loads(result.stdout)
    assert isinstance(data, dict)
    assert set(data) == {"plan", "plan_sha256", "script", "shards", "records", "summary",
                         "checks", "overrides", "layout"}
    assert (data["shards"], data["records"]) == (3, 30)
    assert data["plan"]["name"] == "fake-server"
    assert data["plan"]["deployments"][0]["command"][1] == str(
        REPO / "fixtures" / "fake_openai_server.py")
    assert data["script"].startswith("#!/bin/bash\n")
    assert data["plan"]["run_id"] in data["script"]


def test_plan_shows_no_run_id_that_submit_would_not_use() -> None:
    """plan printed a fresh id (name-time-random) that no submit ever used: it shows the
    pattern submit's id follows instead, the same in the summary, script and JSON."""
    from synthbatch.control.runs.store import RUN_ID

    result = invoke("plan", str(QUICKSTART), "--profile", str(TESTBED), "--json")
    data = json.loads(result.stdout)
    assert data["plan"]["run_id"] == "fake-server-YYYYMMDD-HHMMSS-xxxxxx"
    assert RUN_ID.match(data["plan"]["run_id"])
    assert "run id: submit makes one, like fake-server-YYYYMMDD-HHMMSS-xxxxxx" in \
        data["summary"]
    assert "--job-name=synthbatch-fake-server-YYYYMMDD-HHMMSS-xxxxxx" in data["script"]


def test_plan_bad_run_file(tmp_path: Path) -> None:
    bad = tmp_path / "run.toml"
    bad.write_text(QUICKSTART.read_text().replace("records = 30", 'records = "30"'))
    result = invoke("plan", str(bad), "--profile", str(TESTBED))
    assert result.exit_code == 2
    assert result.stdout == ""
    line = one_error_line(result)
    assert str(bad) in line and "records:" in line


def test_plan_bad_nested_field(tmp_path: Path) -> None:
    bad = tmp_path / "run.toml"
    bad.write_text(QUICKSTART.read_text().replace("gpus = 1", "gpus = 1\ngpu = 1"))
    result = invoke("plan", str(bad), "--profile", str(TESTBED))
    assert result.exit_code == 2
    line = one_error_line(result)
    assert str(bad) in line and "deployments[0].gpu" in line


def test_plan_bad_run_file_json(tmp_path: Path) -> None:
    bad = tmp_path / "run.toml"
    bad.write_text(QUICKSTART.read_text().replace("records = 30", 'records = "30"'))
    result = invoke("plan", str(bad), "--profile", str(TESTBED), "--json")
    assert result.exit_code == 2
    assert result.stdout == ""
    error = json_error(result)
    assert error["code"] == "invalid_input"
    assert str(bad) in error["message"] and "records" in error["message"]


def test_plan_missing_run_file(tmp_path: Path) -> None:
    result = invoke("plan", str(tmp_path / "nope.toml"), "--profile", str(TESTBED))
    assert result.exit_code == 2
    assert str(tmp_path / "nope.toml") in one_error_line(result)


def test_plan_too_many_gpus(tmp_path: Path) -> None:
    bad = tmp_path / "run.toml"
    bad.write_text(QUICKSTART.read_text().replace("gpus = 1", "gpus = 8"))
    result = invoke("plan", str(bad), "--profile", str(TESTBED))
    assert result.exit_code == 2
    assert "gpus_per_node" in one_error_line(result)


def test_plan_missing_profile() -> None:
    result = invoke("plan", str(QUICKSTART))
    assert result.exit_code == 3
    line = one_error_line(result)
    assert "default.toml" in line and "(hint: " in line


def test_plan_missing_profile_json_has_hint() -> None:
    result = invoke("plan", str(QUICKSTART), "--json")
    assert result.exit_code == 3
    error = json_error(result)
    assert error["code"] == "not_found" and "SYNTHBATCH_PROFILE" in error["hint"]


def test_profile_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SYNTHBATCH_PROFILE", str(TESTBED))
    assert invoke("plan", str(QUICKSTART)).exit_code == 0


def test_debug_raises() -> None:
    result = invoke("plan", str(QUICKSTART), "--debug")
    from synthbatch.control.errors import NotFound

    assert isinstance(result.exception, NotFound)


# ----------------------------------------------------------------------------- status


def test_status_unknown_run(profile_file: Path) -> None:
    result = invoke("status", "no-such-run", "--profile", str(profile_file))
    assert result.exit_code == 3
    assert "no-such-run" in one_error_line(result)


def test_status_unknown_run_json(profile_file: Path) -> None:
    result = invoke("status", "no-such-run", "--profile", str(profile_file), "--json")
    assert result.exit_code == 3
    assert json_error(result)["code"] == "not_found"


def test_status_invalid_run_id(profile_file: Path) -> None:
    result = invoke("status", "../etc", "--profile", str(profile_file))
    assert result.exit_code == 2
    assert "not a valid run id" in one_error_line(result)


@pytest.mark.parametrize("command", [["status", RUN_ID], ["runs"], ["logs", RUN_ID],
                                     ["cancel", RUN_ID], ["merge", RUN_ID]])
def test_run_reading_commands_reject_a_bad_profile_field(profile_file: Path,
                                                         command: List[str]) -> None:
    profile_file.write_text(profile_file.read_text() + "scheduler_timeout_s = 0\n")
    result = invoke(*command, "--profile", str(profile_file))
    assert result.exit_code == 2
    assert one_error_line(result) == (f"synthbatch: error: {profile_file}: scheduler_timeout_s:"
                                      f" Input should be greater than 0")
    result = invoke(*command, "--profile", str(profile_file), "--json")
    assert json_error(result)["code"] == "invalid_input"


def test_status_finished_run_needs_no_scheduler(profile_file: Path, workspace: Path) -> None:
    build_run(workspace, winners=[0, 1, 2])
    result = invoke("status", RUN_ID, "--profile", str(profile_file), "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["state"] == "succeeded" and data["records_done"] == 30
    assert data["counts"] == {"succeeded": 3}
    human = invoke("status", RUN_ID, "--profile", str(profile_file))
    assert human.exit_code == 0
    assert human.stdout.startswith(f"run {RUN_ID}: succeeded  records 30/30")


# ----------------------------------------------------------------------------- merge


def test_merge_missing_winners(profile_file: Path, workspace: Path) -> None:
    build_run(workspace, winners=[1])
    result = invoke("merge", RUN_ID, "--profile", str(profile_file))
    assert result.exit_code == 4
    line = one_error_line(result)
    assert "shards without a winner: 0, 2" in line and "--allow-partial" in line


def test_merge_missing_winners_json(profile_file: Path, workspace: Path) -> None:
    build_run(workspace, winners=[])
    result = invoke("merge", RUN_ID, "--profile", str(profile_file), "--json")
    assert result.exit_code == 4
    error = json_error(result)
    assert error["code"] == "conflict" and "0, 1, 2" in error["message"]


def test_merge_allow_partial(profile_file: Path, workspace: Path) -> None:
    build_run(workspace, winners=[0, 2])
    result = invoke("merge", RUN_ID, "--allow-partial", "--profile", str(profile_file),
                    "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["complete"] is False and data["missing_shards"] == [1]
    assert data["records"] == 20


def test_merge_complete(profile_file: Path, workspace: Path, tmp_path: Path) -> None:
    layout = build_run(workspace, winners=[0, 1, 2])
    target = tmp_path / "all.jsonl"
    result = invoke("merge", RUN_ID, "--output", str(target), "--profile", str(profile_file))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (f"merged 30 records into {target}\n  dataset card: "
                             f"{layout.merged / 'README.md'} (and card.json)\n")
    assert [json.loads(x)["index"] for x in target.read_text().splitlines()] == list(range(30))
    assert (layout.merged / "manifest.json").is_file()


def test_merge_prints_the_dropped_records_and_where(profile_file: Path, workspace: Path,
                                                   tmp_path: Path) -> None:
    layout = build_run(workspace, winners=[0, 2])
    out = ensure_dir(layout.attempt(1, 1).output)  # shard 1: 8 records, 2 dropped
    (out / "records.jsonl").write_text("".join(json.dumps({"index": i}) + "\n"
                                               for i in range(10, 18)))
    (out / ".dropped-10.jsonl").write_text('{"index": 18}\n{"index": 19}\n')
    manifest = build_manifest(out, 1, 1, 10)
    winner = WinnerRecord(shard=1, attempt=1, records=manifest.records, dropped=2,
                          result_sha256=sha256_bytes(manifest.to_json().encode()),
                          files=manifest.files, created_at=time.time())
    publish_json_immutable(layout.winner_json(1), winner.to_dict())
    result = invoke("merge", RUN_ID, "--profile", str(profile_file))
    assert result.exit_code == 0, result.stderr
    assert "merged 28 records" in result.stdout
    assert "dropped: 2 record(s) the client gave up on, in shard(s) 1 (listed in their " \
        "output/.dropped-*.jsonl; manifest: dropped_files)" in result.stdout


def test_merge_corrupt_plan_is_a_damaged_state_conflict(profile_file: Path,
                                                        workspace: Path) -> None:
    # was exit 1 ("internal"): a damaged record is not a bug of synthbatch
    layout = build_run(workspace, winners=[0, 1, 2])
    layout.plan_json.chmod(0o600)
    layout.plan_json.write_text("{")
    result = invoke("merge", RUN_ID, "--profile", str(profile_file))
    assert result.exit_code == 4
    line = one_error_line(result)
    assert "plan.json" in line


# ----------------------------------------------------------------------------- runs


def test_runs_empty(profile_file: Path) -> None:
    result = invoke("runs", "--profile", str(profile_file))
    assert result.exit_code == 0
    assert result.stdout == "no runs\n"


def test_runs_lists_committed(profile_file: Path, workspace: Path) -> None:
    build_run(workspace, winners=[])
    result = invoke("runs", "--profile", str(profile_file), "--json")
    assert result.exit_code == 0, result.stderr
    runs = json.loads(result.stdout)["runs"]
    assert [r["run_id"] for r in runs] == [RUN_ID]
    # committed, no submission record: each shard's first attempt is created, not submitted
    assert runs[0]["shards"] == 3 and runs[0]["counts"] == {"created": 3}




# ----------------------------------------------------------------------------- observation

from tests.fakes import Shard, fake_slurm_bin, make_run, profile_with_bin  # noqa: E402


def test_help_lists_every_command() -> None:
    result = invoke("--help")
    for command in ("status", "runs", "logs", "cancel", "merge", "plan", "submit"):
        assert f"  {command} " in result.stdout


@pytest.mark.parametrize("command", ["logs", "cancel"])
def test_new_commands_have_common_options(command: str) -> None:
    result = invoke(command, "--help")
    assert result.exit_code == 0
    for option in ("--profile", "--json", "--debug", "--shard"):
        assert option in result.stdout


def test_usage_error_with_json_is_a_json_error(profile_file: Path) -> None:
    result = invoke("status", "--json", "--no-such-option", "x")
    assert result.exit_code == 2
    error = json_error(result)
    assert error["code"] == "invalid_input" and "no-such-option" in error["message"]


def test_error_messages_are_redacted(profile_file: Path) -> None:
    result = invoke("status", "http://user:hunter2@host", "--profile", str(profile_file),
                    "--json")
    assert result.exit_code == 2
    message = json_error(result)["message"]
    assert "hunter2" not in message and "***@host" in message


def test_status_of_many_shards_lists_failures_not_every_shard(profile_file: Path,
                                                             workspace: Path) -> None:
    shards = [Shard("winner")] * 58 + [Shard("failed", "client exited with status 3")] * 2
    make_run(workspace, shards)
    result = invoke("status", "obs-20240101-000000-abcdef", "--profile", str(profile_file))
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("run obs-20240101-000000-abcdef: failed  records 580/600")
    assert "failures (2):" in lines and not any(" succeeded " in line for line in lines[2:])
    assert sum("client exited with status 3" in line for line in lines) == 2


def test_status_watch_plain_lines_until_the_run_ends(tmp_path: Path, profile_file: Path,
                                                     workspace: Path) -> None:
    make_run(workspace, [Shard("winner"), Shard("running")])
    counter = tmp_path / "calls"
    folder = fake_slurm_bin(
        tmp_path,
        squeue=f'n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}\n'
               'if [ "$n" = 0 ]; then echo "500_1|RUNNING|None"; '
               'else echo "500_1|FAILED|NonZeroExitCode"; fi',
        sacct='echo "500_1|FAILED|3:0"')
    profile = profile_with_bin(profile_file, folder)
    started = time.monotonic()
    result = invoke("status", "obs-20240101-000000-abcdef", "--watch", "--interval", "1",
                    "--profile", profile)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and "\x1b[" not in result.stdout
    assert ": running " in lines[0] and ": failed " in lines[1]
    assert 1.0 <= time.monotonic() - started < 10


def test_ctrl_c_on_status_watch_exits_130(workspace: Path, profile_file: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """It exited 0, as if the run had been watched to its end."""
    import synthbatch.control.runs.status.watch

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    make_run(workspace, [Shard("running")])
    monkeypatch.setattr(synthbatch.control.runs.status.watch, "watch", interrupted)
    result = invoke("status", "obs-20240101-000000-abcdef", "--watch", "--profile",
                    str(profile_file))
    assert result.exit_code == 130, result.output


def test_status_watch_json_prints_one_object_at_the_end(tmp_path: Path, profile_file: Path,
                                                        workspace: Path) -> None:
    make_run(workspace, [Shard("running")])
    folder = fake_slurm_bin(tmp_path, squeue='echo "500_0|CANCELLED|None"',
                            sacct='case "$*" in *ElapsedRaw*) echo "500_0|CANCELLED by 0|0:0|5|";;'
                                  ' *) echo "500_0|CANCELLED by 0|0:0";; esac')
    result = invoke("status", "obs-20240101-000000-abcdef", "--watch", "--json", "--profile",
                    profile_with_bin(profile_file, folder))
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["state"] == "cancelled"
    assert data["shards"][0]["reason"] == "job cancelled by uid 0 outside synthbatch"


def test_runs_newest_first_with_state(profile_file: Path, workspace: Path) -> None:
    make_run(workspace, [Shard("winner"), Shard("running")])
    result = invoke("runs", "--profile", str(profile_file), "--json")
    (run,) = json.loads(result.stdout)["runs"]
    assert run["state"] == "running" and run["counts"] == {"running": 1, "succeeded": 1}
    text = invoke("runs", "--profile", str(profile_file))
    header, row = text.stdout.splitlines()
    assert header.split() == ["RUN", "STATE", "RECORDS", "SHARDS", "SUBMITTED",
                              "GPU-HOURS", "COST", "ELAPSED"]
    assert row.split()[:4] == ["obs-20240101-000000-abcdef", "running", "10/20", "1/2"]
    assert row.split()[6:8] == ["—", "—"]  # not counted while running, never 0


def test_logs_prints_and_json_tails(profile_file: Path, workspace: Path) -> None:
    layout = make_run(workspace, [Shard("running")])
    folder = ensure_dir(layout.attempt(0, 1).execution_logs(1))
    (folder / "client.log").write_text("hello from the client\n")
    result = invoke("logs", "obs-20240101-000000-abcdef", "--profile", str(profile_file))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "hello from the client\n"
    assert "shard 0 attempt 1 execution 1: client" in result.stderr
    data = json.loads(invoke("logs", "obs-20240101-000000-abcdef", "--json", "--profile",
                             str(profile_file)).stdout)
    assert data["text"] == "hello from the client\n" and data["steps"] == ["client"]
    missing = invoke("logs", "obs-20240101-000000-abcdef", "--step", "proxy-x", "--profile",
                     str(profile_file))
    assert missing.exit_code == 3 and "steps with logs: client" in one_error_line(missing)


def test_cancel_through_the_cli(tmp_path: Path, profile_file: Path, workspace: Path) -> None:
    layout = make_run(workspace, [Shard("winner"), Shard("submitted")])
    argv_log = tmp_path / "scancel.argv"
    folder = fake_slurm_bin(tmp_path, scancel=f'echo "$@" >> {argv_log}',
                            squeue='echo "500_1|CANCELLED|None"')
    profile = profile_with_bin(profile_file, folder)
    result = invoke("cancel", "obs-20240101-000000-abcdef", "--profile", profile)
    assert result.exit_code == 0, result.stderr
    assert argv_log.read_text() == "500_1\n"
    assert "1 cancelled, 1 succeeded" in result.stdout
    again = invoke("cancel", "obs-20240101-000000-abcdef", "--profile", profile, "--json")
    assert json.loads(again.stdout)["scancelled"] == []
    assert argv_log.read_text() == "500_1\n"
    assert json.loads(layout.attempt(1, 1).attempt_json.read_text())["state"] == "cancelled"


# ----------------------------------------------------------------------------- untrusted text

ESCAPES = "\x1b[2J\x1b]0;TITLE\x07\x9b31m"  # clear screen, retitle, C1 CSI
SHOWN = "\\x1b[2J\\x1b]0;TITLE\\x07\\x9b31m"
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # every control character but \n


def strings(value: object) -> List[str]:
    """Every string in a JSON value, keys too."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in strings(k) + strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def test_status_shows_reasons_from_state_files_only_as_visible_escapes(
        profile_file: Path, workspace: Path) -> None:
    make_run(workspace, [Shard("failed", f"server exited (log x: {ESCAPES}boom)"),
                         Shard("winner")])
    text = invoke("status", "obs-20240101-000000-abcdef", "--profile", str(profile_file))
    assert text.exit_code == 0, text.stderr
    assert not CONTROL.search(text.stdout)
    assert sum(SHOWN + "boom" in line for line in text.stdout.splitlines()) == 2  # row, failure
    data = json.loads(invoke("status", "obs-20240101-000000-abcdef", "--json", "--profile",
                             str(profile_file)).stdout)
    assert not any(CONTROL.search(s) for s in strings(data))  # jq -r gets no raw ESC
    assert SHOWN + "boom" in data["failures"][0]["reason"]


def test_status_watch_frame_shows_reasons_as_visible_escapes(
        profile_file: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("synthbatch.control.cli.status.is_tty", lambda: True)
    make_run(workspace, [Shard("failed", ESCAPES)])
    result = invoke("status", "obs-20240101-000000-abcdef", "--watch", "--profile",
                    str(profile_file))
    assert result.exit_code == 0, result.stderr
    assert SHOWN in result.stdout and not CONTROL.search(result.stdout)


def test_scheduler_errors_are_shown_as_visible_escapes(tmp_path: Path, profile_file: Path,
                                                       workspace: Path) -> None:
    make_run(workspace, [Shard("running")])
    folder = fake_slurm_bin(tmp_path, squeue=f"printf '{ESCAPES}down\\n' >&2; exit 1")
    profile = profile_with_bin(profile_file, folder)
    text = invoke("status", "obs-20240101-000000-abcdef", "--profile", profile)
    assert text.exit_code == 5  # the run is not over and Slurm could not be asked
    assert SHOWN + "down" in text.stderr
    assert not CONTROL.search(text.stdout) and not CONTROL.search(text.stderr)
    result = invoke("status", "obs-20240101-000000-abcdef", "--json", "--profile", profile)
    data = json.loads(result.stdout)
    assert SHOWN + "down" in data["scheduler_error"]
    assert not any(CONTROL.search(s) for s in strings(data))
    assert not CONTROL.search(result.stderr)


def test_runs_json_shows_run_records_as_visible_escapes(profile_file: Path,
                                                        workspace: Path) -> None:
    layout = make_run(workspace, [Shard("winner")])
    record = json.loads(layout.run_json.read_text())
    layout.run_json.chmod(0o600)
    layout.run_json.write_text(json.dumps({**record, "name": f"n{ESCAPES}"}))
    data = json.loads(invoke("runs", "--json", "--profile", str(profile_file)).stdout)
    assert data["runs"][0]["name"] == "n" + SHOWN


def test_logs_escape_control_characters_on_a_terminal_and_json_but_not_in_a_pipe(
        profile_file: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = make_run(workspace, [Shard("running")])
    folder = ensure_dir(layout.attempt(0, 1).execution_logs(1))
    raw = f"step 1\t{ESCAPES}ok\n".encode() + b"bad \xff byte \xe2\x9c\x93\n"
    (folder / "client.log").write_bytes(raw)
    args = ["logs", "obs-20240101-000000-abcdef", "--profile", str(profile_file)]
    piped = invoke(*args)
    assert piped.exit_code == 0 and piped.stdout_bytes == raw  # the file's bytes, unchanged
    data = json.loads(invoke(*args, "--json").stdout)
    assert data["text"].startswith(f"step 1\t{SHOWN}ok\n") and not CONTROL.search(
        data["text"].replace("\t", ""))
    monkeypatch.setattr("synthbatch.control.cli.logs.is_tty", lambda: True)
    shown = invoke(*args)
    assert shown.exit_code == 0, shown.stderr
    assert shown.stdout == f"step 1\t{SHOWN}ok\nbad \\xff byte \u2713\n"


# ----------------------------------------------------------------------------- scheduler down

NO_CONFIG = ('echo "squeue: error: fetch_config: DNS SRV lookup failed" >&2; '
             'echo "squeue: fatal: Could not establish a configuration source" >&2; exit 1')


def test_status_with_no_scheduler_exits_5_with_one_message(tmp_path: Path, profile_file: Path,
                                                           workspace: Path,
                                                           monkeypatch) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)
    make_run(workspace, [Shard("winner"), Shard("running"), Shard("running")])
    profile = profile_with_bin(profile_file, fake_slurm_bin(tmp_path, squeue=NO_CONFIG))
    result = invoke("status", "obs-20240101-000000-abcdef", "--profile", profile)
    assert result.exit_code == 5
    line = one_error_line(result)
    assert line.startswith("synthbatch: error: squeue failed: squeue: fatal: Could not "
                           "establish a configuration source (hint: is SLURM_CONF set?")
    assert "scheduler unavailable:" not in result.stdout  # said once, on stderr
    assert "failures" not in result.stdout  # shards Slurm was not asked about
    assert result.stdout.startswith("run obs-20240101-000000-abcdef: running")
    as_json = invoke("status", "obs-20240101-000000-abcdef", "--profile", profile, "--json")
    assert as_json.exit_code == 5
    data = json.loads(as_json.stdout)
    assert data["failures"] == [] and data["counts"] == {"succeeded": 1, "unknown": 2}
    assert data["scheduler_hint"].startswith("is SLURM_CONF set?")
    error = json_error(as_json)
    assert error["code"] == "scheduler_unavailable" and "may have taken" not in error["message"]


def test_status_of_a_settled_run_is_not_failed_by_the_scheduler(tmp_path: Path,
                                                                profile_file: Path,
                                                                workspace: Path) -> None:
    # a recent failure asks Slurm for its reason; without an answer the run is still over
    make_run(workspace, [Shard("winner"), Shard("failed", "boom", updated_at=time.time())])
    profile = profile_with_bin(profile_file, fake_slurm_bin(tmp_path, squeue=NO_CONFIG))
    result = invoke("status", "obs-20240101-000000-abcdef", "--profile", profile, "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["state"] == "failed" and data["scheduler_error"]


def test_status_watch_shows_the_scheduler_note_and_keeps_refreshing(
        tmp_path: Path, profile_file: Path, workspace: Path) -> None:
    make_run(workspace, [Shard("running")])
    counter = tmp_path / "calls"
    folder = fake_slurm_bin(
        tmp_path,
        squeue=f'n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}\n'
               f'if [ "$n" = 0 ]; then {NO_CONFIG}; fi\necho "500_0|CANCELLED|None"',
        sacct='echo "500_0|CANCELLED by 0|0:0"')
    result = invoke("status", "obs-20240101-000000-abcdef", "--watch", "--interval", "1",
                    "--profile", profile_with_bin(profile_file, folder))
    assert result.exit_code == 0, result.stderr
    first, last = result.stdout.splitlines()
    assert ": running " in first and "scheduler unavailable: squeue failed" in first
    assert ": cancelled " in last and "scheduler unavailable" not in last


def test_cancel_with_no_scheduler_exits_5_and_records_no_cancel(
        tmp_path: Path, profile_file: Path, workspace: Path) -> None:
    layout = make_run(workspace, [Shard("running")])
    folder = fake_slurm_bin(tmp_path, scancel=NO_CONFIG.replace("squeue", "scancel"))
    result = invoke("cancel", "obs-20240101-000000-abcdef", "--profile",
                    profile_with_bin(profile_file, folder))
    assert result.exit_code == 5
    assert "scancel: fatal: Could not establish a configuration source (hint: is SLURM_CONF " \
           "set?" in one_error_line(result)
    assert not list((layout.root / "cancels").glob("*.json"))  # status shows no "cancelling"


def test_merge_no_stats_leaves_the_card_without_column_statistics(
        profile_file: Path, workspace: Path, tmp_path: Path) -> None:
    layout = build_run(workspace, winners=[0, 1, 2])
    with_stats = invoke("merge", RUN_ID, "--output", str(tmp_path / "a.jsonl"), "--profile",
                        str(profile_file))
    assert with_stats.exit_code == 0, with_stats.stderr
    assert json.loads((layout.merged / "card.json").read_text())["statistics"]
    result = invoke("merge", RUN_ID, "--output", str(tmp_path / "b.jsonl"), "--no-stats",
                    "--profile", str(profile_file))
    assert result.exit_code == 0, result.stderr
    assert json.loads((layout.merged / "card.json").read_text())["statistics"] == {}
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
