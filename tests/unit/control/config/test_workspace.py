"""The pydantic-free profile reader of status/runs/logs/cancel/merge agrees with Profile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from control.config import workspace
from control.config.loader import load_model
from control.config.profile import Profile
from control.config.workspace import load_workspace_profile
from control.errors import InvalidInput
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


def write(tmp_path: Path, data: Dict[str, Any]) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("changes", [{}, {"slurm_bin": "/opt/slurm/bin"},
                                     {"scheduler_timeout_s": 5}, {"slurm_bin": None},
                                     {"schema_version": 1.0}, {"schema_version": True},
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
    code = ("import sys\nfrom control.cli.main import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic'"
            " or m == 'agent_stdlib.contracts'))")
    out = subprocess.run([sys.executable, "-c", code, "status", "no-such-run", "--profile",
                          str(profile)], capture_output=True, text=True, cwd=REPO,
                         check=False)
    assert out.stdout.strip() == "[]", out.stderr
    assert "no such run" in out.stderr
