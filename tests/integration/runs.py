"""Helpers shared by the real-Slurm tests: profiles, the CLI as JSON, waiting, process scans."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict

import pytest
from click.testing import CliRunner, Result

from control.cli.main import cli

PROFILE_DEFAULTS: Dict[str, Any] = {
    "partition": "debug",
    "gpus_per_node": 4,
    "cpus_per_task": 1,
    "mem_mb": 512,
    "default_time_limit": "00:10:00",
    "grace_s": 5,
}


def write_profile(tmp_path: Path, python: str, **fields: Any) -> Path:
    """A testbed profile in ``tmp_path`` (workspace inside it); ``fields`` override defaults."""
    values = dict(PROFILE_DEFAULTS, workspace=str(tmp_path / "workspace"), python=python,
                  **fields)
    lines = ["schema_version = 1"] + [f"{key} = {json.dumps(value)}"
                                      for key, value in sorted(values.items())]
    path = tmp_path / "profile.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def invoke(*args: str) -> Result:
    """Run the CLI in-process; never raise."""
    return CliRunner().invoke(cli, list(args))


def cli_json(*args: str) -> Dict[str, Any]:
    """Run a CLI command with ``--json``; assert it succeeded; return its object."""
    result = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def wait_final(run_id: str, profile: Path, timeout_s: float = 240,
               interval_s: float = 1.0) -> Dict[str, Any]:
    """Poll ``status`` until the run is no longer running; return that status."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = cli_json("status", run_id, "--profile", str(profile))
        if status["state"] != "running":
            return status
        if time.monotonic() > deadline:
            pytest.fail(f"run {run_id} still running after {timeout_s}s: {status['counts']}")
        time.sleep(interval_s)
