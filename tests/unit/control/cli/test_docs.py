"""The documentation's commands and configs are the CLI's and the models' own (so the
docs cannot rot). The testbed blocks themselves run in tests/integration/test_docs_slurm.py."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Iterator, List, Tuple

import click
import pytest

from synthbatch.control.cli.main import cli
from synthbatch.control.config.loader import load_model
from synthbatch.control.config.profile import Profile
from synthbatch.control.config.run import RunConfig
from synthbatch.control.planning.planner import make_plan
from tests.conftest import REPO
from tests.fakes import fenced_blocks, fenced_infos

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TUTORIAL = REPO / "docs" / "tutorial.md"
PYTHON_API = REPO / "docs" / "python-api.md"
COMMAND = re.compile(r"(?:^|\$\(|&&|;|\|\|)\s*(synthbatch(?:\s+[^|;&)#\n]*)?)")


def commands(path: Path) -> Iterator[Tuple[str, List[str]]]:
    """Every ``synthbatch ...`` invocation in the shell blocks of ``path``."""
    for info in ("bash", "bash testbed", "sh"):
        for body in fenced_blocks(path, info):
            for line in body.replace("\\\n", " ").splitlines():
                for match in COMMAND.finditer(line):
                    text = match.group(1).strip()
                    words = shlex.split(text.replace('"$(', '"x').replace(")", ""))
                    yield text, [w for w in words if not w.startswith("$")]


def resolve(words: List[str]) -> Tuple[click.Command, List[str]]:
    """The command ``words`` name, and the words after its name."""
    ctx = click.Context(cli)
    command: click.Command = cli
    rest = words[1:]
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        found = command.get_command(ctx, rest[0])
        assert found is not None, f"no command {rest[0]!r} in {' '.join(words)}"
        command, rest = found, rest[1:]
    return command, rest


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_command_in_the_docs_exists_with_its_options(path: Path) -> None:
    for text, words in commands(path):
        command, rest = resolve(words)
        ctx = click.Context(command, help_option_names=["-h", "--help"])
        known = {opt for param in command.get_params(ctx) for opt in param.opts}
        for word in rest:
            if word.startswith("-") and word != "-":
                assert word.split("=", 1)[0] in known, f"{path.name}: {text}: {word}"


def test_the_tutorial_has_testbed_blocks_and_configs() -> None:
    infos = fenced_infos(TUTORIAL)
    assert infos.count("bash testbed") >= 5
    assert infos.count("toml run") == 1 and infos.count("toml profile") == 1


def test_the_tutorials_configs_validate_and_plan(tmp_path: Path) -> None:
    (profile_text,) = fenced_blocks(TUTORIAL, "toml profile")
    (run_text,) = fenced_blocks(TUTORIAL, "toml run")
    (tmp_path / "profile.toml").write_text(profile_text)
    (tmp_path / "run.toml").write_text(run_text)
    profile = load_model(tmp_path / "profile.toml", Profile)
    run = load_model(tmp_path / "run.toml", RunConfig)
    plan = make_plan(run, profile, "descriptions-1", tmp_path)
    assert len(plan.shards) == 10 and plan.resources.gpus == 8
    assert plan.resources.cpus == 64 and plan.resources.mem_mb == 8 * 65536


@pytest.mark.parametrize("path", [PYTHON_API], ids=lambda p: p.name)
def test_the_python_examples_compile(path: Path) -> None:
    blocks = fenced_blocks(path, "python testbed") + fenced_blocks(path, "python")
    assert blocks
    for body in blocks:
        compile(body, str(path), "exec")


def test_the_python_api_table_names_real_functions() -> None:
    from synthbatch.control import api

    text = PYTHON_API.read_text()
    for name in re.findall(r"`api\.([a-z_]+)\(", text):
        assert callable(getattr(api, name)), name


def test_the_python_api_page_names_every_option_of_status_and_wait() -> None:
    """``api.status(auto_retry=)`` was undocumented."""
    import inspect

    from synthbatch.control import api

    text = PYTHON_API.read_text()
    for function in (api.status, api.wait):
        row = next(line for line in text.splitlines()
                   if line.startswith(f"| `api.{function.__name__}("))
        for name in inspect.signature(function).parameters:
            if name != "scheduler":  # the tests' and the local backend's, not a user's
                assert f"{name}=" in row, (function.__name__, name)
    assert "`api.status(..., auto_retry=True)`" in text and '`.data["retried"]`' in text
