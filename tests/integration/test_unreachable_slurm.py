"""An unreachable scheduler, as the real Slurm 22.05 clients report it (issue 13, item 7).

Three ways a login node can lose its cluster, each with the testbed's own clients:

* ``SLURM_CONF`` unset (no DNS SRV record here): ``fatal: Could not establish a
  configuration source``;
* ``SLURM_CONF`` naming a missing file (the clients would retry it for 60 s);
* slurmctld not answering: a copy of the testbed's configuration whose ``SlurmctldPort``
  nobody listens on gives exactly what a stopped slurmctld gives, ``Unable to contact slurm
  controller (connect failure)`` after the clients' connect retries, without stopping the
  daemons other tests use.

``status`` (of a run that is not over), ``cancel`` and ``profile validate`` then all exit 5
with one error line and its hint; no read-only command says "it may have taken effect".
"""

from __future__ import annotations

import json
import re
import secrets
import socket
import sys
from pathlib import Path
from typing import Dict

import pytest

from tests.integration.runs import cli_json, invoke, write_profile, write_run

pytestmark = pytest.mark.slurm


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _dead_controller_conf(conf: str, folder: Path) -> Path:
    """The testbed's configuration with slurmctld on a port nobody listens on."""
    folder.mkdir()
    for item in Path(conf).parent.glob("*.conf"):
        if item.name != "slurmdbd.conf":
            (folder / item.name).write_text(item.read_text())
    text = (folder / "slurm.conf").read_text()
    (folder / "slurm.conf").write_text(
        re.sub(r"^SlurmctldPort=\d+$", f"SlurmctldPort={_free_port()}", text, flags=re.M))
    return folder / "slurm.conf"


@pytest.fixture(scope="module")
def live_run(slurm_cluster, tmp_path_factory) -> Dict[str, str]:
    tmp_path = tmp_path_factory.mktemp("unreachable")
    profile = str(write_profile(tmp_path, sys.executable))
    run_file = write_run(tmp_path, records=120, shards=2, latency=0.5)  # minutes: cancelled
    run_id = cli_json("submit", str(run_file), "--profile", profile)["run_id"]
    yield {"run_id": run_id, "profile": profile, "dir": str(tmp_path)}
    cli_json("cancel", run_id, "--profile", profile)


@pytest.mark.parametrize("case", ["unset", "missing", "controller down"])
def test_status_cancel_and_validate_exit_5_with_a_hint(live_run, slurm_cluster, monkeypatch,
                                                        case) -> None:
    run_id, profile = live_run["run_id"], live_run["profile"]
    if case == "unset":
        monkeypatch.delenv("SLURM_CONF")
        hint = "is SLURM_CONF set? (it is not set"
    elif case == "missing":
        missing = Path(live_run["dir"]) / f"gone-{secrets.token_hex(3)}" / "slurm.conf"
        monkeypatch.setenv("SLURM_CONF", str(missing))
        hint = f"is SLURM_CONF set? (it names {missing}, which does not exist)"
    else:
        dead = _dead_controller_conf(slurm_cluster.conf,
                                     Path(live_run["dir"]) / f"dead-{secrets.token_hex(3)}")
        monkeypatch.setenv("SLURM_CONF", str(dead))
        hint = "is slurmctld up?"

    status = invoke("status", run_id, "--profile", profile, "--json")
    assert status.exit_code == 5, status.output
    data = json.loads(status.stdout)
    assert data["state"] == "running" and data["failures"] == []
    assert data["scheduler_hint"].startswith(hint)
    error = json.loads(status.stderr)["error"]
    assert error["code"] == "scheduler_unavailable" and error["hint"].startswith(hint)
    assert "may have taken effect" not in status.stderr

    text = invoke("status", run_id, "--profile", profile)
    assert text.exit_code == 5
    (line,) = text.stderr.splitlines()
    assert f"(hint: {hint}" in line and "may have taken effect" not in line
    assert "failures" not in text.stdout

    cancel = invoke("cancel", run_id, "--profile", profile)
    assert cancel.exit_code == 5, cancel.output
    assert f"(hint: {hint}" in cancel.stderr
    run_dir = Path(live_run["dir"]) / "workspace" / "runs" / run_id
    assert not list((run_dir / "cancels").glob("*.json")) or case == "controller down"

    validate = invoke("profile", "validate", "--profile", profile)
    assert validate.exit_code == 5, validate.output
    assert "FAIL  partition" in validate.stdout
    (line,) = validate.stderr.splitlines()
    assert f"(hint: {hint}" in line and "may have taken effect" not in line
