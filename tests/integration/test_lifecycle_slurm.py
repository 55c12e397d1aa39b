"""Nothing is left stuck, on the real testbed: a run Slurm refused leaves no run behind
(issue 28 item 2), and a cancel asked for during a slurmctld outage is carried out once
Slurm answers again (item 4)."""

from __future__ import annotations

import pytest

from synthbatch.control import api
from synthbatch.control.errors import SchedulerRejected
from tests.integration.runs import (
    cli_json,
    invoke,
    outage,
    wait_until,
    write_profile,
    write_run,
)

pytestmark = pytest.mark.slurm


@pytest.mark.parametrize("how", ["reservation", "constraint"])
def test_a_run_slurm_refused_leaves_no_run_behind(slurm_cluster, tmp_path, python_exe,
                                                  how: str) -> None:
    """Before: run.json stayed, ``runs``/``status`` said ``running`` with the shards
    "created ... not submitted" for good, and a bare ``wait`` never ended."""
    profile = write_profile(tmp_path, python_exe)
    if how == "constraint":  # a feature no node of the testbed has
        profile.write_text(profile.read_text() + 'sbatch_options = { constraint = "h100" }\n')
    run_file = write_run(tmp_path, records=2, shards=2, latency=0.0)
    reservation = "nosuch" if how == "reservation" else None
    with pytest.raises(SchedulerRejected) as raised:  # past plan's checks, as Slurm sees it
        api.submit(run_file, profile, reservation=reservation, checks=False)
    said = {"reservation": "Requested reservation is invalid",
            "constraint": "Invalid feature specification"}[how]
    assert said in raised.value.message and "was not kept" in raised.value.message
    assert raised.value.exit_code == 2
    assert list((tmp_path / "workspace" / "runs").iterdir()) == []
    assert invoke("runs", "--profile", str(profile)).stdout.strip() == "no runs"
    waited = invoke("wait", "--profile", str(profile), "--timeout", "60")
    assert waited.exit_code == 3, waited.output  # no run to wait for: at once
    status = invoke("status", "--profile", str(profile))
    assert status.exit_code == 3, status.output


@pytest.mark.slow
def test_a_cancel_during_a_slurmctld_outage_is_carried_out_once_slurm_answers(
        slurm_cluster, tmp_path, python_exe) -> None:
    """Before: after slurmctld was back, status said "cancelling — cancel requested; squeue
    says RUNNING" with no hint, and the job ran on until someone cancelled again."""
    profile = str(write_profile(tmp_path, python_exe))
    run_file = write_run(tmp_path, records=30, shards=1, latency=0.5)  # minutes of work
    run_id = cli_json("submit", str(run_file), "--profile", profile)["run_id"]
    wait_until("the client generating", lambda: cli_json(
        "status", run_id, "--profile", profile)["records_done"] >= 1, 120)
    with outage(slurm_cluster, "slurmctld"):
        cancelled = invoke("cancel", run_id, "--profile", profile, "--wait", "0")
        assert cancelled.exit_code == 5, cancelled.output  # scheduler uncertain
        assert "is slurmctld up?" in cancelled.stderr
    waited = invoke("wait", run_id, "--profile", profile, "--interval", "1",
                    "--timeout", "180")
    assert waited.exit_code == 7, waited.output  # the job was cancelled, not left running
    assert "when Slurm could not be reached, was carried out now: scancel " in waited.stderr
    final = cli_json("status", run_id, "--profile", profile)
    assert final["state"] == "cancelled" and final["counts"] == {"cancelled": 1}
