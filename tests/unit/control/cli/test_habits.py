"""CLI habits: ``-h``, did-you-mean for commands and config fields, run-id hints, the
latest run by default."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, List

import click
import pytest

from synthbatch.control.cli.main import COMMANDS, cli
from tests.conftest import REPO
from tests.fakes import NOW, Shard, invoke, make_run

FAKE = REPO / "examples" / "fake-server.toml"


def every_command() -> List[List[str]]:
    """The argv of every command and subcommand (groups included)."""
    found: List[List[str]] = []
    ctx = click.Context(cli)
    for name in sorted(COMMANDS):
        command = cli.get_command(ctx, name)
        found.append([name])
        if isinstance(command, click.Group):
            found += [[name, sub] for sub in sorted(command.commands)]
    return found


@pytest.mark.parametrize("argv", every_command(), ids=" ".join)
def test_dash_h_is_help_everywhere(argv: List[str]) -> None:
    short, long = invoke(*argv, "-h"), invoke(*argv, "--help")
    assert short.exit_code == 0, short.output
    assert short.stdout == long.stdout and short.stdout.startswith("Usage: ")


def test_top_level_dash_h() -> None:
    result = invoke("-h")
    assert result.exit_code == 0 and "Commands:" in result.stdout


@pytest.mark.parametrize("typo, meant", [("stauts", "status"), ("sumbit", "submit"),
                                         ("merg", "merge"), ("profil", "profile")])
def test_unknown_command_suggests_the_closest(typo: str, meant: str) -> None:
    result = invoke(typo)
    assert result.exit_code == 2
    assert f"No such command {typo!r}. Did you mean {meant!r}?" in result.stderr


def test_unknown_subcommand_suggests_the_closest() -> None:
    result = invoke("profile", "shwo")
    assert result.exit_code == 2
    assert "Did you mean 'show'?" in result.stderr


def test_unknown_command_far_from_any_names_none() -> None:
    result = invoke("frobnicate")
    assert result.exit_code == 2
    assert "No such command 'frobnicate'." in result.stderr and "Did you mean" not in \
        result.stderr


def test_unknown_command_with_json_is_one_json_error() -> None:
    result = invoke("stauts", "--json")
    assert result.exit_code == 2
    error = json.loads(result.stderr)["error"]
    assert "Did you mean 'status'?" in error["message"]


# ----------------------------------------------------------------------------- config fields


def plan_error(tmp_path: Path, text: str, profile_file: Path) -> str:
    run = tmp_path / "run.toml"
    run.write_text(text)
    result = invoke("plan", str(run), "--profile", str(profile_file))
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    return lines[0]


def test_unknown_client_field_names_the_field_meant(tmp_path: Path,
                                                    profile_file: Path) -> None:
    text = FAKE.read_text().replace("max_tokens = 24", "max_token = 24")
    line = plan_error(tmp_path, text, profile_file)
    assert line.endswith("run.toml: client.max_token: unknown field (did you mean "
                         "max_tokens?)"), line


def test_a_near_miss_is_reported_before_the_field_it_leaves_missing(
        tmp_path: Path, profile_file: Path) -> None:
    # without `command` the client is read as the built-in one: `model` is then missing,
    # but the typo is the cause and is what the user is told
    text = FAKE.read_text().replace('model = "tiny"\nprompt_template',
                                    'modle = "tiny"\nprompt_template')
    line = plan_error(tmp_path, text, profile_file)
    assert "client.modle: unknown field (did you mean model?)" in line, line


def test_unknown_deployment_field(tmp_path: Path, profile_file: Path) -> None:
    text = FAKE.read_text().replace("gpus = 1", "gpu = 1")
    line = plan_error(tmp_path, text, profile_file)
    assert "deployments[0].gpu: unknown field (did you mean gpus?)" in line, line


def test_unknown_field_without_a_near_miss_lists_the_fields(tmp_path: Path,
                                                            profile_file: Path) -> None:
    text = FAKE.read_text().replace("[shards]\ncount = 3", "[shards]\ncount = 3\nzebra = 1")
    line = plan_error(tmp_path, text, profile_file)
    assert "shards.zebra: unknown field (fields here: count, records_per_shard, throttle)" \
        in line, line


def test_unknown_profile_field_reads_alike_on_both_paths(tmp_path: Path,
                                                         profile_file: Path) -> None:
    profile_file.write_text(profile_file.read_text() + "gpus_per_nod = 4\n")
    expected = f"{profile_file}: gpus_per_nod: unknown field (did you mean gpus_per_node?)"
    planned = invoke("plan", str(FAKE), "--profile", str(profile_file))  # pydantic Profile
    listed = invoke("runs", "--profile", str(profile_file))  # the stdlib reader
    for result in (planned, listed):
        assert result.exit_code == 2
        assert result.stderr.strip() == f"synthbatch: error: {expected}"


def test_unknown_nested_profile_field(tmp_path: Path, profile_file: Path) -> None:
    profile_file.write_text(profile_file.read_text() + '[container]\nruntim = "pyxis"\n')
    result = invoke("plan", str(FAKE), "--profile", str(profile_file))
    assert "container.runtim: unknown field (did you mean runtime?)" in result.stderr


# ----------------------------------------------------------------------------- run ids


def test_a_run_that_does_not_exist_points_at_runs(profile_file: Path) -> None:
    for command in (["status"], ["logs"], ["cancel"], ["merge"], ["retry", "--yes"]):
        result = invoke(*command, "nope-20240101-000000-abcdef", "--profile",
                        str(profile_file))
        assert result.exit_code == 3, (command, result.output)
        assert "(hint: 'synthbatch runs' lists the runs of this workspace)" in result.stderr


def test_status_without_a_run_id_shows_the_latest_run(workspace: Path,
                                                      profile_file: Path) -> None:
    old = make_run(workspace, [Shard("winner")], run_id="old-20240101-000000-aaaaaa")
    new = make_run(workspace, [Shard("winner")], run_id="new-20240101-000000-bbbbbb")
    past = time.time() - 100
    os.utime(old.run_json, (past, past))
    result = invoke("status", "--profile", str(profile_file), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["run_id"] == "new-20240101-000000-bbbbbb"
    os.utime(new.run_json, (past - 10, past - 10))
    result = invoke("status", "--profile", str(profile_file), "--json")
    assert json.loads(result.stdout)["run_id"] == "old-20240101-000000-aaaaaa"


def test_status_without_any_run_says_how_to_make_one(profile_file: Path) -> None:
    result = invoke("status", "--profile", str(profile_file))
    assert result.exit_code == 3
    assert "no runs in" in result.stderr and "synthbatch submit" in result.stderr


# ----------------------------------------------------------------------------- runs table


def test_runs_is_an_aligned_table_with_a_header(workspace: Path, profile_file: Path) -> None:
    from tests.fakes import NOW

    make_run(workspace, [Shard("winner", updated_at=NOW + 90), Shard("winner")],
             run_id="done-20240101-000000-aaaaaa")
    make_run(workspace, [Shard("running", progress=4), Shard("failed")],
             run_id="a-much-longer-name-20240101-000000-bbbbbb")
    result = invoke("runs", "--profile", str(profile_file))
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["RUN", "STATE", "RECORDS", "SHARDS", "SUBMITTED", "GPU-HOURS",
                              "COST", "ELAPSED"]
    for column in ("STATE", "RECORDS", "SHARDS", "SUBMITTED", "GPU-HOURS", "COST", "ELAPSED"):
        start = header.index(column)
        assert all(row[start - 2:start] == "  " and row[start] != " " for row in rows), column
    cells = {row.split()[0]: row.split() for row in rows}
    done = cells["done-20240101-000000-aaaaaa"]
    assert done[1:4] == ["succeeded", "20/20", "2/2"]
    assert done[-1] == "0:01:30"  # from run.json's created_at to the last shard's record
    other = cells["a-much-longer-name-20240101-000000-bbbbbb"]
    assert other[1:4] == ["running", "4/20", "0/2"]


def test_runs_json_has_the_numbers_of_the_table(workspace: Path, profile_file: Path) -> None:
    from tests.fakes import NOW

    make_run(workspace, [Shard("winner", updated_at=NOW + 30)])
    (run,) = json.loads(invoke("runs", "--profile", str(profile_file), "--json").stdout)["runs"]
    assert (run["records"], run["records_done"], run["shards"]) == (10, 10, 1)
    assert run["ended_at"] == NOW + 30 and run["elapsed_s"] == 30.0


# ----------------------------------------------------------------------------- completion


def completions(args: List[str], incomplete: str) -> List[str]:
    from click.shell_completion import BashComplete

    completer = BashComplete(cli, {}, "synthbatch", "_SYNTHBATCH_COMPLETE")
    return [item.value for item in completer.get_completions(args, incomplete)]


@pytest.mark.parametrize("shell, marker", [
    ("bash", "complete -o nosort -F"), ("zsh", "compdef"),
    ("fish", "complete --no-files --command synthbatch")])
def test_completion_prints_the_shells_script(shell: str, marker: str) -> None:
    result = invoke("completion", shell)
    assert result.exit_code == 0, result.output
    assert marker in result.stdout and "_SYNTHBATCH_COMPLETE" in result.stdout


def test_every_command_takes_json() -> None:
    """README: every command takes --json; completion, benchmark and --version refused it."""
    script = json.loads(invoke("completion", "bash", "--json").stdout)
    assert script["shell"] == "bash" and "_SYNTHBATCH_COMPLETE" in script["script"]
    assert json.loads(invoke("--json", "completion", "fish").stdout)["shell"] == "fish"
    for argv in (["--version", "--json"], ["--json", "--version"]):
        result = invoke(*argv)
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["version"]
    for group in ("benchmark", "profile", "image"):  # a group needs a command: said in JSON
        result = invoke(group, "--json")
        assert result.exit_code == 2
        assert json.loads(result.stderr)["error"]["message"] == "Missing command."
    ctx = click.Context(cli)
    todo: List[Any] = [("synthbatch", cli)]
    while todo:  # the whole command tree, groups included
        name, command = todo.pop()
        assert "--json" in {o for p in command.params for o in getattr(p, "opts", [])}, name
        if isinstance(command, click.Group):
            todo += [(f"{name} {n}", command.get_command(ctx, n))
                     for n in command.list_commands(ctx)]
    result = invoke("benchmark", "--json", "analyze", "b-1", "--profile", "/nonexistent.toml")
    assert result.exit_code == 3 and json.loads(result.stderr)["error"]["code"] == "not_found"


def test_completion_refuses_an_unknown_shell() -> None:
    assert invoke("completion", "tcsh").exit_code == 2


def test_completion_offers_commands() -> None:
    assert completions([], "sta") == ["status"]
    assert "completion" in completions([], "")


def test_completion_offers_run_ids_of_the_profiles_workspace(workspace: Path,
                                                             profile_file: Path) -> None:
    make_run(workspace, [Shard("winner")], run_id="alpha-20240101-000000-aaaaaa")
    make_run(workspace, [Shard("winner")], run_id="beta-20240101-000000-bbbbbb")
    make_run(workspace, [Shard("winner")], run_id="alpine-20240101-000000-cccccc",
             committed=False)  # never committed: not a run to offer
    for command in ("status", "logs", "cancel", "merge", "retry", "wait"):
        offered = completions([command, "--profile", str(profile_file)], "al")
        assert offered == ["alpha-20240101-000000-aaaaaa"], command
    assert completions(["status", "--profile", str(profile_file)], "") == [
        "beta-20240101-000000-bbbbbb", "alpha-20240101-000000-aaaaaa"]


def test_completion_offers_the_newest_run_first(workspace: Path, profile_file: Path) -> None:
    """They were offered by name, reversed: ``zeta`` (old) before ``alpha`` (new)."""
    for age, run_id in ((300, "zeta-20240101-000000-aaaaaa"),
                        (200, "alpha-20240101-000000-bbbbbb"),
                        (100, "mid-20240101-000000-cccccc")):
        layout = make_run(workspace, [Shard("winner")], run_id=run_id)
        os.utime(layout.run_json, (NOW - age, NOW - age))
    assert completions(["status", "--profile", str(profile_file)], "") == [
        "mid-20240101-000000-cccccc", "alpha-20240101-000000-bbbbbb",
        "zeta-20240101-000000-aaaaaa"]  # as `runs` lists them, and the latest run first


def test_completion_of_run_ids_without_a_profile_offers_nothing() -> None:
    assert completions(["status"], "") == []


def test_completion_offers_profile_names(home: Path) -> None:
    folder = home / ".config" / "synthbatch" / "profiles"
    folder.mkdir(parents=True)
    for name in ("cluster-a", "cluster-b", "laptop"):
        (folder / f"{name}.toml").write_text("schema_version = 1\n")
    assert completions(["status", "--profile"], "cl") == ["cluster-a", "cluster-b"]
    assert completions(["plan", "x.toml", "--profile"], "") == ["cluster-a", "cluster-b",
                                                                "laptop"]
