"""Fuzzing the config loader through ``synthbatch plan`` (docs/reliability.md).

Random JSON documents, random mutations of every example run and profile (a value
replaced by any JSON value or a nasty string, a key deleted or added, a table turned into
a list) and random edits of the TOML text: ``plan`` either accepts the result (exit 0) or
refuses it with exit 2 and one line naming the file, never a traceback or exit 1.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, List, Tuple, Union

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from synthbatch.control.cli.main import cli
from tests.conftest import REPO
from tests.fakes import fuzz

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

RUNS = sorted((REPO / "examples").glob("*.toml"))
PROFILES = sorted((REPO / "examples" / "profiles").glob("*.toml"))
NASTY = ["", " ", "\x00", "\n", "\r\n", "\t", "\x1b[2J", "$(touch canary)", "`id`", "'\"",
         "../..", "/", "/tmp/../etc", "./x", "{python}", "{port}", "{host}", "{model}",
         "{config_dir}", "{nope}", "{", "}", "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2", "é", "\u202e",
         "\ud800", "\udfff", "\uffff", "a" * 5000, "-1", "1e400", "NaN", "00:00:00",
         "99999999:00:00", "--port", "--api-key", "SLURM_CONF", "PATH", "\u0085", "\x7f"]
Path_ = Tuple[Union[str, int], ...]

texts = st.one_of(st.sampled_from(NASTY), st.text(max_size=40))
scalars = st.one_of(st.none(), st.booleans(), texts,
                    st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
                    st.floats(allow_nan=True, allow_infinity=True))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)), max_leaves=8)


def _nest(depth: int, table: bool) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"k": value} if table else [value]
    return value


DEEP = "\x00deep-json:"  # a value written by _write as that many nested JSON arrays


# what crashed plan or made it quadratic (issue 28 item 7): arrays and tables nested
# hundreds deep, JSON nested up to 100,000 deep (more than json.dumps can write), values
# of tens of thousands of characters
hostile = st.one_of(st.builds(_nest, st.integers(30, 700), st.booleans()),
                    st.integers(1_000, 100_000).map(lambda depth: f"{DEEP}{depth}"),
                    st.sampled_from(["x" * 30_000, "é" * 50_000, "hf_" + "A" * 40_000]))
# schema_version is exactly the integer 1: none of these may be coerced to it
NOT_VERSION_1 = [1.0, True, "1", 1.5, 2, 0, None, [1]]


def _paths(data: Any, prefix: Path_ = ()) -> List[Path_]:
    """Every path into ``data`` (keys and list indices), the root excluded."""
    found: List[Path_] = []
    items = data.items() if isinstance(data, dict) else \
        enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        found.append(prefix + (key,))
        found.extend(_paths(value, prefix + (key,)))
    return found


def _at(data: Any, path: Path_) -> Any:
    for key in path:
        data = data[key]
    return data


@st.composite
def mutated(draw: st.DrawFn, source: Path) -> Any:
    """The data of ``source`` with one to three random mutations applied."""
    data = tomllib.loads(source.read_text(encoding="utf-8"))
    for _ in range(draw(st.integers(1, 3))):
        # schema_version first fails every document alike: one path among many
        paths = [p for p in _paths(data) if p != ("schema_version",)]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, key = _at(data, path[:-1]), path[-1]
        action = draw(st.sampled_from(["replace", "replace", "delete", "add", "wrap",
                                       "hostile"]))
        if action == "replace":
            parent[key] = draw(values)
        elif action == "hostile":
            parent[key] = draw(hostile)
        elif action == "delete":
            del parent[key]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(texts)] = draw(values)
        elif action == "wrap":
            parent[key] = [parent[key]]
    return data


def _write(tmp: Path, name: str, data: Any) -> Path:
    path = tmp / name
    text = json.dumps(data)
    for depth in re.findall(re.escape(json.dumps(DEEP)[:-1]) + r'(\d+)"', text):
        text = text.replace(json.dumps(f"{DEEP}{depth}"),
                            "[" * int(depth) + "1" + "]" * int(depth))
    path.write_text(text, encoding="utf-8")
    return path


def _plan(run: Path, profile: Path, refused: bool = False) -> None:
    """``synthbatch plan``: exit 0, or exit 2 with one short line naming a file; never exit
    1. ``refused``: it must be exit 2."""
    result = CliRunner().invoke(cli, ["plan", str(run), "--profile", str(profile)])
    assert result.exit_code in ((2,) if refused else (0, 2)), \
        (result.exit_code, result.output[-2000:], result.exception)
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        lines = result.stderr.splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("synthbatch: error: "), lines
        assert str(run) in lines[0] or str(profile) in lines[0], lines
        assert len(lines[0]) <= 2_000, lines[0][:300]  # a long value is quoted as an excerpt


@pytest.fixture
def fuzz_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace for the profile and an ``examples/`` folder whose ``../fixtures`` and
    ``../.work`` are the checkout's (the examples' ``{config_dir}/..`` paths resolve);
    Slurm is not asked (``plan`` works without it)."""
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-slurm.conf"))
    (tmp_path / "ws").mkdir()
    (tmp_path / "examples").mkdir()
    (tmp_path / "fixtures").symlink_to(REPO / "fixtures")
    (tmp_path / ".work").symlink_to(REPO / ".work")
    return tmp_path


def _profile(tmp: Path, source: Path) -> Path:
    data = tomllib.loads(source.read_text(encoding="utf-8"))
    data["workspace"] = str(tmp / "ws")
    return _write(tmp, "profile.json", data)


def _example(source: Path) -> Path:
    return PROFILES[0] if "containers" not in source.name else \
        REPO / "examples" / "profiles" / "pyxis.toml"


@fuzz(ci=300, long=10_000)
@given(data=st.data())
def test_mutated_examples_are_refused_in_one_line(fuzz_dir: Path, data: st.DataObject) -> None:
    source = data.draw(st.sampled_from(RUNS), label="example")
    run_data = data.draw(mutated(source), label="run")
    version = data.draw(st.sampled_from([1] * 8 + NOT_VERSION_1), label="schema_version")
    if version != 1 or type(version) is not int:
        run_data["schema_version"] = version
    run = _write(fuzz_dir / "examples", "run.json", run_data)
    _plan(run, _profile(fuzz_dir, _example(source)),
          refused=version != 1 or type(version) is not int)


@fuzz(ci=150, long=5_000)
@given(data=st.data())
def test_mutated_profiles_are_refused_in_one_line(fuzz_dir: Path, data: st.DataObject) -> None:
    source = data.draw(st.sampled_from(PROFILES), label="profile")
    profile_data = data.draw(mutated(source), label="profile data")
    version = data.draw(st.sampled_from([1] * 8 + NOT_VERSION_1), label="schema_version")
    if version != 1 or type(version) is not int:
        profile_data["schema_version"] = version
    profile = _write(fuzz_dir, "profile.json", profile_data)
    _plan(REPO / "examples" / "fake-server.toml", profile,
          refused=version != 1 or type(version) is not int)


@fuzz(ci=150, long=5_000)
@given(document=st.dictionaries(texts, values, max_size=6))
def test_random_documents_are_refused_in_one_line(fuzz_dir: Path, document: Any) -> None:
    run = _write(fuzz_dir, "run.json", document)
    _plan(run, _profile(fuzz_dir, PROFILES[0]))


TOML_CHARS = st.sampled_from(list("[]{}=\"'.,#\\\n \t0123456789-+:abcdefxyz_") +
                             ["\x00", "\x1b", "é", '"""', "'''", "[[", "]]", "\r"])


@st.composite
def edited(draw: st.DrawFn, source: Path) -> str:
    """The text of ``source`` with random characters inserted, deleted or replaced."""
    text = source.read_text(encoding="utf-8")
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(text)))
        action = draw(st.sampled_from(["insert", "delete", "replace", "duplicate line"]))
        if action == "insert":
            text = text[:at] + "".join(draw(st.lists(TOML_CHARS, min_size=1, max_size=4))) \
                + text[at:]
        elif action == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 8)):]
        elif action == "replace":
            text = text[:at] + draw(TOML_CHARS) + text[at + 1:]
        else:
            lines = text.splitlines(keepends=True)
            if lines:
                line = draw(st.integers(0, len(lines) - 1))
                lines.insert(line, lines[line])
                text = "".join(lines)
    return text


@fuzz(ci=200, long=10_000)
@given(data=st.data())
def test_edited_toml_is_refused_in_one_line(fuzz_dir: Path, data: st.DataObject) -> None:
    source = data.draw(st.sampled_from(RUNS), label="example")
    run = fuzz_dir / "examples" / "run.toml"
    run.write_text(data.draw(edited(source), label="text"), encoding="utf-8")
    _plan(run, _profile(fuzz_dir, _example(source)))
