"""Fault scenarios on the real Slurm testbed (issue 22): Slurm's own daemons fail, the
workspace fills up, a node's clock runs ahead.

Each test runs a small run whose fake server is slow enough (``--token-latency``) that the
fault lands while a shard generates, then checks what the user sees (``status``), the final
state, that ``retry`` then completes the run, and that no process of the run is left. The
daemons are stopped and started again with ``scripts/slurm-testbed stop DIR DAEMON
[--kill]`` and ``up DIR``; every test starts them again however it ends.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from synthbatch.agent_stdlib.attempts import load_attempt, load_readiness
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.control.runs.status import verdict as norm
from tests.integration.runs import (
    cli_json,
    invoke,
    outage,
    wait_final,
    wait_until,
    write_profile,
    write_run,
)
from tests.processes import agent_of, processes_mentioning

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


class Run:
    """A submitted run: its id, first job id, profile, layout and fake model name."""

    def __init__(self, tmp_path: Path, python: str, records: int, shards: int,
                 latency: float, **profile: Any) -> None:
        self.profile = str(write_profile(tmp_path, python, **profile))
        run_file = write_run(tmp_path, records=records, shards=shards, latency=latency)
        self.model = re.search(r'model = "(fake-[0-9a-f]+)"', run_file.read_text()).group(1)
        submitted = cli_json("submit", str(run_file), "--profile", self.profile)
        self.run_id, self.job = submitted["run_id"], submitted["job_id"]
        self.layout = RunLayout(Path(profile.get("workspace", tmp_path / "workspace"))
                                / "runs" / self.run_id)

    def status(self) -> Dict[str, Any]:
        return cli_json("status", self.run_id, "--profile", self.profile)

    def done(self, shard: int, attempt: int = 1) -> int:
        """Records the shard's client has written (its progress file)."""
        try:
            data = json.loads(self.layout.attempt(shard, attempt).progress_json.read_text())
        except (OSError, ValueError):
            return 0
        return int(data.get("records_done", 0))

    def wait_done(self, shard: int, at_least: int, timeout_s: float = 90) -> int:
        return wait_until(f"shard {shard} to write {at_least} records",
                          lambda: self.done(shard) >= at_least and self.done(shard), timeout_s)

    def node(self, shard: int) -> str:
        job = self.status()["shards"][shard]["job_id"]
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True,
                             text=True, check=True, timeout=30).stdout.split()
        assert out, f"job {job} holds no node"
        return out[0]

    def leftovers(self) -> List[str]:
        return processes_mentioning(str(self.layout.root), self.model)

    def assert_clean(self, completing: bool = False) -> None:
        """No process of the run is left, and Slurm holds no active job of it (but one
        still COMPLETING when ``completing``)."""
        wait_until("the run's processes to be gone", lambda: not self.leftovers(), 30)
        active = subprocess.run(["squeue", "-h", "-n", f"synthbatch-{self.run_id}", "-o",
                                 "%i %T"], capture_output=True, text=True, check=True,
                                timeout=30).stdout.split()[1::2]
        assert all(completing and state == "COMPLETING" for state in active), active


def test_slurmd_killed_and_restarted_while_a_shard_runs(slurm_cluster, tmp_path, python_exe):
    """A crashed slurmd leaves its job's steps running (proctrack/linuxproc); restarted
    within SlurmdTimeout it picks them up again and the shard finishes."""
    run = Run(tmp_path, python_exe, records=16, shards=1, latency=0.1)
    run.wait_done(0, 2)
    node = run.node(0)
    with outage(slurm_cluster, f"slurmd-{node}", kill=True):
        before = run.done(0)
        during = run.status()
        assert during["state"] == "running", during
        assert during["shards"][0]["state"] == "running", during
        run.wait_done(0, before + 2, 30)  # the client keeps generating meanwhile
    final = wait_final(run.run_id, Path(run.profile), 120)
    assert final["state"] == "succeeded", final
    assert final["records_done"] == 16
    again = cli_json("retry", run.run_id, "--yes", "--profile", run.profile)
    assert again["shards"] == [] and again["submissions"] == []
    run.assert_clean()


def test_slurmctld_restarted_mid_run(slurm_cluster, tmp_path, python_exe):
    """slurmctld stopped while the client generates, and kept down while the shard ends:
    status says so (exit 5, one hint); the agent records its outcome and cleans up without
    slurmctld; started again, slurmctld recovers the job, which ends, and the run
    succeeded."""
    run = Run(tmp_path, python_exe, records=12, shards=1, latency=0.1)
    run.wait_done(0, 6)
    attempt = run.layout.attempt(0, 1).attempt_json
    with outage(slurm_cluster, "slurmctld"):
        during = invoke("status", run.run_id, "--profile", run.profile)
        assert during.exit_code == 5, during.output
        (line,) = during.stderr.splitlines()
        assert "is slurmctld up?" in line, line
        ended = wait_until("the agent to record its outcome",
                           lambda: load_attempt(attempt).state in ("succeeded", "failed")
                           and load_attempt(attempt), 60)
        assert ended.state == "succeeded", ended
        closed = load_readiness(run.layout.attempt(0, 1).readiness_json)
        # before: "cleanup: a managed process or step survived SIGKILL (after success)"
        assert closed.reason == ("cleanup: every process is gone, but squeue could not be "
                                 "asked whether their steps are (is slurmctld up?) (after "
                                 "success)"), closed
    final = wait_final(run.run_id, Path(run.profile), 120)
    assert final["state"] == "succeeded", final
    assert final["records_done"] == 12
    # Slurm 22.05: the client step ended while slurmctld was down; its slurmstepd retries the
    # completion message 60 s later, and until then the job stays COMPLETING
    run.assert_clean(completing=True)


def test_slurmdbd_down_during_status(slurm_cluster, tmp_path, python_exe):
    """slurmdbd stopped (slurmctld answers): one shard's agent is killed, status judges it
    by squeue's row alone, records it failed and exits 0 with a note naming slurmdbd;
    retry (sbatch needs no slurmdbd) completes the run while accounting is still down."""
    if not slurm_cluster.accounting:
        pytest.skip("this testbed keeps no accounting (no slurmdbd to stop)")
    run = Run(tmp_path, python_exe, records=20, shards=2, latency=0.1)
    run.wait_done(0, 1)
    run.wait_done(1, 1)
    with outage(slurm_cluster, "slurmdbd"):
        os.kill(wait_until("the agent of shard 1",
                           lambda: agent_of(run.layout.root, f"{run.job}_1")), signal.SIGKILL)
        ended = wait_until("status to show shard 1 ended", lambda: (
            lambda s: s if s["shards"][1]["state"] != "running" else None)(run.status()), 60)
        assert ended["scheduler_error"] is None, ended
        assert ended["state"] == "running" and ended["shards"][0]["state"] == "running"
        shard = ended["shards"][1]
        assert shard["state"] == "failed" and shard["reason"].endswith(norm.NO_OUTCOME), shard
        assert load_attempt(run.layout.attempt(1, 1).attempt_json).state == "failed"
        (note,) = ended["notes"]
        assert "Problem talking to the database" in note and "is slurmdbd up?" in note
        text = invoke("status", run.run_id, "--profile", run.profile)
        assert text.exit_code == 0, text.output
        assert "note: accounting unavailable" in text.stdout
        retried = cli_json("retry", run.run_id, "--yes", "--profile", run.profile)
        assert [(s["shard"], s["attempt"]) for s in retried["shards"]] == [(1, 2)]
        final = wait_final(run.run_id, Path(run.profile), 120)
        assert final["state"] == "succeeded" and final["records_done"] == 20, final
    run.assert_clean()


@pytest.fixture
def small_fs(tmp_path) -> Iterator[Path]:
    """A 4 MiB tmpfs the test fills up (root only); unmounted afterwards."""
    mount = tmp_path / "small"
    mount.mkdir(mode=0o700)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs",
                           str(mount)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path: Path) -> int:
    """Write ``path`` until the filesystem is full; the bytes written."""
    written, chunk = 0, b"\0" * 65536
    with open(path, "wb", buffering=0) as handle:
        while True:
            try:
                written += handle.write(chunk)
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    return written
                chunk = chunk[:len(chunk) // 2]


def test_workspace_disk_full_while_writing_output(slurm_cluster, small_fs, tmp_path,
                                                  python_exe):
    """The workspace filesystem fills up while the client writes: no record on disk is
    torn or lost; once space is freed status records the outcome and `retry --resume
    always` continues from the records attempt 1 kept."""
    run = Run(tmp_path, python_exe, records=16, shards=1, latency=0.1,
              workspace=str(small_fs / "workspace"))
    run.wait_done(0, 3)
    filler = small_fs / "filler"
    fill(filler)
    try:
        ended = wait_until("status to show the shard ended", lambda: (
            lambda s: s if s["shards"][0]["state"] != "running" else None)(run.status()), 90)
        full = ended["shards"][0]
        # the agent could not write its outcome (nor flush its output: exit 120)
        assert full["state"] == "failed", full
        assert full["reason"].startswith("job failed (exit 120) before the agent recorded an "
                                         "outcome; the run's filesystem is full ("), full
        assert load_attempt(run.layout.attempt(0, 1).attempt_json).state == "running"
        client_log = run.layout.attempt(0, 1).root / "logs" / "execution-1" / "client.log"
        assert "No space left on device" in client_log.read_text()
    finally:
        filler.unlink()
    output = run.layout.attempt(0, 1).output
    kept = [json.loads(line) for path in sorted(output.glob("records-*.jsonl"))
            for line in path.read_bytes().split(b"\n")[:-1]]  # a torn last line is no record
    assert [r["index"] for r in kept] == list(range(len(kept))) and len(kept) >= 3, kept
    after = run.status()  # space again: status records the outcome
    assert after["shards"][0]["state"] == "failed", after
    record = load_attempt(run.layout.attempt(0, 1).attempt_json)
    assert record.state == "failed", record
    retried = cli_json("retry", run.run_id, "--resume", "always", "--yes", "--profile",
                       run.profile)
    (choice,) = retried["shards"]
    assert (choice["attempt"], choice["resume_from"]) == (2, 1), choice
    assert choice["resume_records"] == len(kept)
    final = wait_final(run.run_id, Path(run.profile), 120)
    assert final["state"] == "succeeded" and final["records_done"] == 16, final
    merged = tmp_path / "merged.jsonl"
    cli_json("merge", run.run_id, "--output", str(merged), "--profile", run.profile)
    indices = [json.loads(line)["index"] for line in merged.read_text().splitlines()]
    assert indices == list(range(16))
    run.assert_clean()


CLOCK_AHEAD_S = 900


def test_a_node_clock_ahead_of_the_login_node(slurm_cluster, tmp_path, python_exe):
    """Every process of the allocation (agent, servers, client) runs with its clock 15
    minutes ahead (libfaketime through the profile's ``python``): status still shows the
    live shards running, fails a killed one at once, and the run's figures do not count
    the offset."""
    faketime = shutil.which("faketime")
    if faketime is None:
        pytest.skip("faketime (Debian package faketime/libfaketime) is not installed: "
                    "scripts/slurm-testbed up installs it")
    ahead = tmp_path / "python-ahead"
    # (monotonic clocks are offset too: with FAKETIME_DONT_FAKE_MONOTONIC=1 libfaketime
    # 0.9.10 makes Python's time.sleep fail with EINVAL)
    ahead.write_text(f"#!/bin/sh\nexec {faketime} -f +{CLOCK_AHEAD_S}s {python_exe} \"$@\"\n")
    ahead.chmod(0o755)
    run = Run(tmp_path, str(ahead), records=16, shards=2, latency=0.1)
    run.wait_done(0, 2)
    run.wait_done(1, 1)
    progress = json.loads(run.layout.attempt(0, 1).progress_json.read_text())
    assert progress["updated_at"] > time.time() + CLOCK_AHEAD_S - 60  # the offset is real
    live = run.status()
    assert [s["state"] for s in live["shards"]] == ["running", "running"], live
    os.kill(wait_until("the agent of shard 1",
                       lambda: agent_of(run.layout.root, f"{run.job}_1")), signal.SIGKILL)
    ended = wait_until("status to show shard 1 ended", lambda: (
        lambda s: s if s["shards"][1]["state"] != "running" else None)(run.status()), 60)
    assert ended["shards"][0]["state"] == "running", ended
    assert ended["shards"][1]["state"] == "failed", ended
    retried = cli_json("retry", run.run_id, "--yes", "--profile", run.profile)
    assert [(s["shard"], s["attempt"]) for s in retried["shards"]] == [(1, 2)]
    final = wait_final(run.run_id, Path(run.profile), 120)
    assert final["state"] == "succeeded" and final["records_done"] == 16, final
    assert final["totals"]["elapsed_s"] < CLOCK_AHEAD_S, final["totals"]
    listed = cli_json("runs", "--profile", run.profile)["runs"][0]
    assert listed["elapsed_s"] < CLOCK_AHEAD_S, listed
    run.assert_clean()
