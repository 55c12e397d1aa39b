"""The pydantic-free profile reader of status/runs/logs/cancel/merge agrees with Profile."""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any, Dict

import pytest

from synthbatch.control.config import workspace
from synthbatch.control.config.loader import load_model
from synthbatch.control.config.profile import Profile
from synthbatch.control.config.workspace import load_workspace_profile
from synthbatch.control.errors import InvalidInput
from tests.conftest import REPO
from tests.fakes import profile_data

TESTBED = REPO / "examples" / "profiles" / "testbed.toml"


def test_field_names_are_the_models() -> None:
    assert workspace.FIELDS == tuple(Profile.model_fields)


def test_defaults_and_bounds_are_the_models() -> None:
    field = Profile.model_fields["scheduler_timeout_s"]
    assert field.default == workspace.SCHEDULER_TIMEOUT_S
    bounds = {type(m).__name__: m for m in field.metadata}
    assert bounds["Gt"].gt == 0 and bounds["Le"].le == workspace.MAX_SCHEDULER_TIMEOUT_S
    assert Profile.model_fields["slurm_bin"].default is None
    assert Profile.model_fields["backend"].default == workspace.BACKENDS[0]


def test_both_models_accept_the_same_backends() -> None:
    assert typing.get_args(Profile.model_fields["backend"].annotation) == workspace.BACKENDS


def test_the_light_model_holds_the_shared_fields_of_profile() -> None:
    shared = set(workspace.WorkspaceProfile._fields) - {"path"}
    assert shared <= set(workspace.FIELDS)
    light = workspace.WorkspaceProfile._field_defaults
    assert all(light[name] == Profile.model_fields[name].default for name in light)


def write(tmp_path: Path, data: Dict[str, Any]) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("changes", [{}, {"slurm_bin": "/opt/slurm/bin"},
                                     {"scheduler_timeout_s": 5}, {"slurm_bin": None},
                                     {"backend": "local", "local": {"max_concurrent": 2}}])
def test_valid_profiles_read_the_same_values(tmp_path: Path, changes: Dict[str, Any]) -> None:
    data = {**profile_data(), **changes}
    if data.get("slurm_bin") is None:
        data.pop("slurm_bin", None)
    path = write(tmp_path, data)
    full, light = load_model(path, Profile), load_workspace_profile(str(path))
    assert (light.path, light.workspace, light.slurm_bin, light.scheduler_timeout_s,
            light.backend) == \
        (path, full.workspace, full.slurm_bin, full.scheduler_timeout_s, full.backend)


DROP = object()
BAD = [("schema_version", DROP), ("schema_version", 2), ("schema_version", "1"),
       ("schema_version", 1.0), ("schema_version", True),  # equal to 1, not the integer 1
       ("backend", "pbs"), ("backend", 1), ("workspace", DROP),
       ("workspace", 3), ("workspace", "rel"), ("workspace", "/a/../b"), ("workspace", "/a b"),
       ("workspace", "/a\x01"), ("slurm_bin", 5), ("slurm_bin", "bin"),
       ("scheduler_timeout_s", 0), ("scheduler_timeout_s", -1), ("scheduler_timeout_s", 601),
       ("scheduler_timeout_s", "3"), ("scheduler_timeout_s", True),
       ("scheduler_timeout_s", float("nan")), ("nope", 1), ("HF_TOKEN", "x"),
       ("api_key", "sk-abcdefghijklmnopqrstuvwxyz")]


@pytest.mark.parametrize("field, value", BAD)
def test_bad_fields_fail_with_the_models_one_line_message(tmp_path: Path, field: str,
                                                          value: Any) -> None:
    data = profile_data()
    if value is DROP:
        del data[field]
    else:
        data[field] = value
    path = write(tmp_path, data)
    with pytest.raises(InvalidInput) as full:
        load_model(path, Profile)
    with pytest.raises(InvalidInput) as light:
        load_workspace_profile(str(path))
    assert light.value.message == full.value.message
    assert light.value.message.startswith(f"{path}: {field}: ")
    assert "\n" not in light.value.message and light.value.exit_code == 2


def test_syntax_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(TESTBED.read_text() + 'workspace = "/again"\n')
    with pytest.raises(InvalidInput, match=r"p.toml: workspace: duplicate key"):
        load_workspace_profile(str(path))


def test_other_fields_are_left_to_full_validation(tmp_path: Path) -> None:
    path = write(tmp_path, {**profile_data(), "gpus_per_node": -1})
    assert load_workspace_profile(str(path)).workspace == profile_data()["workspace"]
    with pytest.raises(InvalidInput, match="gpus_per_node"):
        load_model(path, Profile)


def test_status_imports_no_pydantic(tmp_path: Path) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text(TESTBED.read_text().replace('"/tmp/synthbatch-workspace"',
                                                   json.dumps(str(tmp_path / "ws"))))
    code = ("import sys\nfrom synthbatch.control.cli.main import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic'"
            " or m == 'synthbatch.agent_stdlib.contracts'))")
    out = subprocess.run([sys.executable, "-c", code, "status", "no-such-run", "--profile",
                          str(profile)], capture_output=True, text=True, cwd=REPO,
                         check=False)
    assert out.stdout.strip() == "[]", out.stderr
    assert "no such run" in out.stderr


# ----------------------------------------------------------------------------- unsafe roots

COMMANDS = (("submit", "RUN"), ("plan", "RUN"), ("status", "X"), ("runs",),
            ("logs", "X", "--shard", "0"), ("cancel", "X"), ("merge", "X"),
            ("retry", "X", "--yes"))


def _profile_for(tmp_path: Path, root: Path) -> Path:
    return write(tmp_path, {**profile_data(), "workspace": str(root)})


def _invoke(args: tuple, profile: Path):
    from click.testing import CliRunner

    from synthbatch.control.cli.main import cli
    from tests.fakes import QUICKSTART

    argv = [str(QUICKSTART) if a == "RUN" else a for a in args]
    return CliRunner().invoke(cli, [*argv, "--profile", str(profile)], catch_exceptions=True)


@pytest.mark.parametrize("mode,who", [(0o770, "group"), (0o707, "world"),
                                      (0o777, "group- and world"), (0o1777, "group- and world")])
def test_a_group_or_world_writable_workspace_is_refused_by_every_command(
        tmp_path: Path, mode: int, who: str) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    root.chmod(mode)
    profile = _profile_for(tmp_path, root)
    for args in COMMANDS:
        result = _invoke(args, profile)
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (args, result.stderr)
        assert f"workspace {root}: {who}-writable (mode {mode:o})" in lines[0], lines[0]
        assert f"fix: chmod go-w {root}" in lines[0]
    assert list(root.iterdir()) == []  # nothing was written under it
    with pytest.raises(InvalidInput, match="writable"):
        load_workspace_profile(str(profile))


def test_a_world_writable_parent_without_the_sticky_bit_is_refused_with_sticky_accepted(
        tmp_path: Path) -> None:
    parent = tmp_path / "shared"
    parent.mkdir()
    root = parent / "me" / "ws"  # not there yet: submit would create it
    profile = _profile_for(tmp_path, root)
    parent.chmod(0o777)
    with pytest.raises(InvalidInput) as info:
        load_workspace_profile(str(profile))
    assert f"{parent} above it is world-writable without the sticky bit" in \
        info.value.message and f"chmod o-w {parent}" in info.value.message
    assert _invoke(("status", "X"), profile).exit_code == 2
    parent.chmod(0o1777)  # like /tmp: others cannot rename what is ours in it
    assert load_workspace_profile(str(profile)).workspace == str(root)
    parent.chmod(0o2770)  # a project directory: its group is trusted
    assert load_workspace_profile(str(profile)).workspace == str(root)
    root.mkdir(parents=True, mode=0o700)
    assert workspace.workspace_problem(root) is None


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="chown needs root")
def test_a_workspace_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    import os

    root = tmp_path / "ws"
    root.mkdir(mode=0o700)
    os.chown(root, 65534, 65534)
    with pytest.raises(InvalidInput, match=r"owned by uid 65534, not by you"):
        load_workspace_profile(str(_profile_for(tmp_path, root)))
