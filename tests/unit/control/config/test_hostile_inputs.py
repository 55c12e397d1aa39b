"""Hostile authored files (issue 28 item 7): nesting thousands deep, ``schema_version``
that only equals 1, values hundreds of thousands of characters long. Each is refused with
exit 2 and one line naming the file, never a RecursionError (exit 1) or a huge message."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
from click.testing import CliRunner, Result

from synthbatch.control.cli.main import cli
from tests.conftest import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

BENCH = ('schema_version = {version}\nname = "b"\nrun = "run.toml"\nconcurrency = [1]\n'
         'records = {{ fixed = 4 }}\n[[cases]]\nname = "c"\n')
RUN = REPO / "examples" / "fake-server.toml"
PROFILE = REPO / "examples" / "profiles" / "testbed.toml"


def _invoke(args: List[str]) -> Result:
    return CliRunner().invoke(cli, args)


def _one_line(result: Result, names: Path) -> str:
    """The single error line of a refused command, which must name ``names``."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr[:2000]
    assert lines[0].startswith(f"synthbatch: error: {names}: "), lines[0][:500]
    return lines[0]


def _profile_text(tmp_path: Path) -> str:
    (tmp_path / "ws").mkdir(exist_ok=True)
    text = PROFILE.read_text(encoding="utf-8")
    return text.replace('workspace = "/tmp/synthbatch-workspace"',
                        f'workspace = "{tmp_path / "ws"}"')


def _profile(tmp_path: Path) -> Path:
    data = tomllib.loads(_profile_text(tmp_path))
    data["workspace"] = str(tmp_path / "ws")
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _with_line(text: str, line: str) -> str:
    """``text`` (a TOML file) with ``line`` added after its ``schema_version``."""
    return text.replace("schema_version = 1", "schema_version = 1\n" + line, 1)


DEEP_TOML = {
    "array-600": "x = " + "[" * 600 + "1" + "]" * 600,
    "inline-table-500": "x = " + "{a = " * 500 + "1" + "}" * 500,
    "array-40": "x = " + "[" * 40 + "1" + "]" * 40,  # parses; still deeper than MAX_DEPTH
}
DEEP_JSON = '{"schema_version": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}"


@pytest.mark.parametrize("name", sorted(DEEP_TOML))
def test_a_deeply_nested_toml_run_is_refused_naming_the_file(tmp_path: Path,
                                                             name: str) -> None:
    run = tmp_path / "run.toml"
    run.write_text(_with_line(RUN.read_text(encoding="utf-8"), DEEP_TOML[name]))
    line = _one_line(_invoke(["plan", str(run), "--profile", str(_profile(tmp_path))]), run)
    assert "nested deeper than" in line


def test_a_100000_deep_json_run_is_refused_naming_the_file(tmp_path: Path) -> None:
    run = tmp_path / "run.json"
    run.write_text(DEEP_JSON)
    line = _one_line(_invoke(["plan", str(run), "--profile", str(_profile(tmp_path))]), run)
    assert "nested deeper" in line


@pytest.mark.parametrize("suffix", ["toml", "json"])
@pytest.mark.parametrize("command", [["plan", str(RUN)], ["status"], ["runs"]])
def test_a_deeply_nested_profile_is_refused_by_every_loader(
        tmp_path: Path, suffix: str, command: List[str]) -> None:
    profile = tmp_path / f"deep.{suffix}"
    if suffix == "toml":
        profile.write_text(_with_line(_profile_text(tmp_path), DEEP_TOML["array-600"]))
    else:
        profile.write_text(DEEP_JSON)
    line = _one_line(_invoke([*command, "--profile", str(profile)]), profile)
    assert "nested deeper" in line


def test_a_deeply_nested_benchmark_file_and_base_run_are_refused(tmp_path: Path) -> None:
    profile = _profile(tmp_path)
    bench = tmp_path / "bench.toml"
    bench.write_text('schema_version = 1\nname = "b"\nrun = "run.toml"\n'
                     + DEEP_TOML["array-600"] + "\n")
    line = _one_line(_invoke(["benchmark", "run", str(bench), "--profile", str(profile)]),
                     bench)
    assert "nested deeper" in line
    bench.write_text(BENCH.format(version=1))
    (tmp_path / "run.toml").write_text(
        _with_line(RUN.read_text(encoding="utf-8"), DEEP_TOML["inline-table-500"]))
    line = _one_line(_invoke(["benchmark", "run", str(bench), "--profile", str(profile)]),
                     bench)
    assert "nested deeper" in line


def test_a_deeply_nested_image_registry_is_reported_not_a_crash(tmp_path: Path) -> None:
    profile = _profile(tmp_path)
    registry = tmp_path / "ws" / "images.json"
    registry.write_text('{"schema_version": 2, "images": ' + "[" * 100_000 + "]" * 100_000
                        + "}")
    result = _invoke(["image", "ls", "--profile", str(profile)])
    line = _one_line(result, registry)
    assert "nested too deeply" in line


VERSIONS: Dict[str, Any] = {"float": 1.0, "bool": True, "string": "1", "two": 2}


@pytest.mark.parametrize("kind", sorted(VERSIONS))
def test_schema_version_must_be_exactly_the_integer_1(tmp_path: Path, kind: str) -> None:
    value = VERSIONS[kind]
    shown = json.dumps(value)
    run = tmp_path / "run.toml"
    run.write_text(RUN.read_text(encoding="utf-8").replace(
        "schema_version = 1", f"schema_version = {shown}", 1))
    profile = _profile(tmp_path)
    line = _one_line(_invoke(["plan", str(run), "--profile", str(profile)]), run)
    assert line.endswith(f"{run}: schema_version: Input should be 1"), line
    data = json.loads(profile.read_text())
    data["schema_version"] = value
    profile.write_text(json.dumps(data))
    for command in (["plan", str(RUN)], ["status"], ["profile", "validate"]):
        result = _invoke([*command, "--profile", str(profile)])
        if command[0] == "profile":
            assert result.exit_code != 0 and "schema_version: Input should be 1" in \
                result.output, result.output
            continue
        line = _one_line(result, profile)
        assert line.endswith(f"{profile}: schema_version: Input should be 1"), line


def test_a_benchmark_file_with_schema_version_true_is_refused(tmp_path: Path) -> None:
    bench = tmp_path / "bench.toml"
    bench.write_text(BENCH.format(version="true"))
    line = _one_line(_invoke(["benchmark", "run", str(bench), "--profile",
                              str(_profile(tmp_path))]), bench)
    assert "schema_version: Input should be 1" in line


QA = REPO / "examples" / "qa-fake.toml"


def _thirteen_columns(long: str) -> Dict[str, Any]:
    """qa-fake with 13 columns, the 13th a judge whose first score is named ``long``."""
    data = tomllib.loads(QA.read_text(encoding="utf-8"))
    columns = data["client"]["columns"]
    judge = columns.pop()
    while len(columns) < 12:
        columns.append({"name": f"n{len(columns)}", "type": "integer", "low": 1, "high": 2})
    judge["scores"][0]["name"] = long
    columns.append(judge)
    return data


def _excerpt_only(line: str, long: str) -> None:
    """``line`` quotes at most a marked excerpt of ``long``, and stays short."""
    assert len(line) < 1000, len(line)
    assert long[:200] not in line
    assert f"(excerpt: first 60 of {len(long)} characters)" in line, line


@pytest.mark.parametrize("long", ["a!" * 15_000, "x" * 300_000, "é" * 100_000])
def test_a_long_invalid_value_is_quoted_as_a_short_marked_excerpt(tmp_path: Path,
                                                                   long: str) -> None:
    run = tmp_path / "examples" / "run.json"
    run.parent.mkdir()
    (tmp_path / "examples" / "data").symlink_to(REPO / "examples" / "data")
    profile = _profile(tmp_path)
    data = tomllib.loads(RUN.read_text(encoding="utf-8"))
    data["name"] = long
    run.write_text(json.dumps(data))
    line = _one_line(_invoke(["plan", str(run), "--profile", str(profile)]), run)
    assert f"{run}: name: " in line
    _excerpt_only(line, long)
    run.write_text(json.dumps(_thirteen_columns(long)))
    line = _one_line(_invoke(["plan", str(run), "--profile", str(profile)]), run)
    assert f"{run}: client.columns[12].scores[0].name: " in line
    _excerpt_only(line, long)


def test_a_long_unknown_key_is_named_by_a_marked_excerpt(tmp_path: Path) -> None:
    run = tmp_path / "run.json"
    data = tomllib.loads(RUN.read_text(encoding="utf-8"))
    key = "k" * 300_000
    data["client"][key] = 1
    run.write_text(json.dumps(data))
    line = _one_line(_invoke(["plan", str(run), "--profile", str(_profile(tmp_path))]), run)
    assert "unknown field" in line
    _excerpt_only(line, key)


@pytest.mark.parametrize("where", ["model", "command1", "seed", "hub"])
def test_a_path_longer_than_linux_allows_is_refused_not_a_crash(tmp_path: Path,
                                                                where: str) -> None:
    """``stat`` of such a path raises ENAMETOOLONG: plan crashed with exit 1 on it."""
    data = tomllib.loads(QA.read_text(encoding="utf-8"))
    deployment = data["deployments"][1]
    if where == "model":
        deployment["model"] = "/" + "m" * 300
    elif where == "hub":
        deployment["model"] = "org/" + "m" * 300
    elif where == "command1":
        deployment["command"][1] = "/x" * 3000
    else:
        data["client"]["seed_data"]["path"] = "{config_dir}/" + "s" * 300
    run = tmp_path / "run.json"
    run.write_text(json.dumps(data))
    line = _one_line(_invoke(["plan", str(run), "--profile", str(_profile(tmp_path))]), run)
    assert ("at most 200 characters" if where == "hub" else "is longer than a path can be") \
        in line, line
