"""Concurrent writers and readers on one run (docs/reliability.md).

* Two ``synthbatch status --watch`` processes (the real CLI, its Slurm a FileCluster
  behind fake ``slurm_bin`` executables) and two status loops as fast as they can go,
  while two allocations write every record of their shards: no reader fails or sees a
  damaged record, no shard goes back (records done never drop, a succeeded shard stays
  succeeded), and the run ends with one verified winner per shard.
* Two ``synthbatch retry`` and one ``synthbatch cancel`` started at once on a run with
  failed and pending shards, many times over: no command fails with an internal error,
  at most one new attempt per shard and one submission naming it, every job the cluster
  holds is recorded, and the run then converges like any other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from synthbatch.agent_stdlib import states
from synthbatch.agent_stdlib.attempts import load_attempt, load_readiness
from synthbatch.agent_stdlib.publish import verify_winner
from synthbatch.control.runs.status.refresh import observe
from synthbatch.control.runs.store import load_submissions
from synthbatch.control.slurm.scheduler import Scheduler
from tests.conftest import REPO
from tests.fakes import (
    RUN_ID,
    TESTBED,
    FakeClient,
    World,
    budget,
    drive,
    file_cluster_bin,
    fork_call,
    harness_plan,
    run_agent,
    run_jobs,
)

SYNTHBATCH = [sys.executable, "-c", "from synthbatch.control.cli.main import main; main()"]
ORDER = {"created": 0, "pending": 1, "running": 2, "succeeded": 3}


def _world(tmp_path: Path) -> Tuple[World, str, Dict[str, str]]:
    """A run's world, a profile whose ``slurm_bin`` answers from its cluster, and the
    environment the CLI needs for that."""
    world = World(tmp_path / "world")
    world.root.mkdir()
    bin_dir = file_cluster_bin(world.root / "bin")
    profile = world.root / "profile.toml"
    profile.write_text(TESTBED.read_text().replace(
        '"/tmp/synthbatch-workspace"', json.dumps(str(world.ws)))
        + f"slurm_bin = {json.dumps(str(bin_dir))}\nscheduler_timeout_s = 60\n")
    env = dict(os.environ, SYNTHBATCH_FAKE_CLUSTER=str(world.root / "cluster.json"),
               HOME=str(tmp_path), PYTHONPATH=str(REPO))
    env.pop("SLURM_CONF", None)
    return world, str(profile), env


def _watch_loop(world: World, out: Path, stop: Path) -> None:
    """A status reader as fast as it goes: one line of shard (state, records done) per
    refresh."""
    sched = Scheduler(runner=world.cluster())
    with open(out, "a") as handle:
        while not stop.exists():
            data = observe(world.layout, sched)
            handle.write(json.dumps([(r["state"], r["records_done"], r["reason"])
                                     for r in data["shards"]]) + "\n")


def _agent(world: World, job: str, task: int, script: str, client: FakeClient) -> None:
    cluster = world.cluster()
    cluster.set(job, task, "RUNNING")
    code = run_agent(world.layout, job, task, script, 0, client)
    cluster.set(job, task, "COMPLETED" if code == 0 else "FAILED")
    assert code == 0


def test_two_watchers_and_two_status_loops_while_allocations_write(tmp_path: Path) -> None:
    world, profile, env = _world(tmp_path)
    world.submit(harness_plan(2, 20), world.cluster())
    watchers = [subprocess.Popen([*SYNTHBATCH, "status", RUN_ID, "--watch", "--interval", "1",
                                  "--profile", profile], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
    stop = world.root / "stop"
    loops: List[Tuple[Path, int]] = []
    for index in range(2):
        out = world.root / f"loop-{index}.jsonl"
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 0
            try:
                _watch_loop(world, out, stop)
            except BaseException:  # noqa: BLE001 - reported through the exit status
                import traceback

                traceback.print_exc()
                code = 3
            os._exit(code)
        loops.append((out, pid))
    client = FakeClient(fail=lambda shard, attempt: False, delay_s=0.05)
    codes, pids = [], []
    for job, task, script, _ in world.cluster().runnable():
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 0
            try:
                _agent(world, job, task, script, client)
            except BaseException:  # noqa: BLE001
                code = 3
            os._exit(code)
        pids.append(pid)
    for pid in pids:
        codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    assert codes == [0, 0]
    time.sleep(0.5)  # the loops see the end too
    stop.write_text("")
    for out, pid in loops:
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(rows) > 10, "the loop did not run alongside the allocations"
        for before, after in zip(rows, rows[1:]):
            for (state, done, reason), (state2, done2, _) in zip(before, after):
                assert state in ORDER and state2 in ORDER, (state, reason)
                assert ORDER[state2] >= ORDER[state] and done2 >= done, (before, after)
        assert rows[-1] == [["succeeded", 20, None]] * 2
    for watcher in watchers:
        out, err = watcher.communicate(timeout=60)
        assert watcher.returncode == 0, err
        assert out.splitlines()[-1].split(" ", 1)[1].startswith(f"run {RUN_ID}: succeeded"), out
    for shard in range(2):
        assert verify_winner(world.layout.winner_json(shard), shard) is not None
        paths = world.layout.attempt(shard, 1)
        assert load_attempt(paths.attempt_json).state == states.SUCCEEDED
        assert load_readiness(paths.readiness_json).state == states.READY_STOPPED


def _race_world(tmp_path: Path) -> Tuple[World, str, Dict[str, str], FakeClient]:
    """Three shards: 0 and 1 failed (their first client exits 1), 2 pending in Slurm."""
    world, profile, env = _world(tmp_path)
    cluster = world.cluster()
    world.submit(harness_plan(3, 5), cluster)
    client = FakeClient(fail=lambda shard, attempt: attempt == 1 and shard < 2)
    for job, task, script, restarts in cluster.runnable():
        if task < 2:
            cluster.set(job, task, "RUNNING")
            assert run_agent(world.layout, job, task, script, restarts, client) == 1
            cluster.set(job, task, "FAILED")
    observe(world.layout, Scheduler(runner=cluster))
    return world, profile, env, client


def _invariants(world: World) -> None:
    layout = world.layout
    named: Dict[Tuple[int, int], int] = {}
    for record in load_submissions(layout):
        for shard, attempt in record.attempts.items():
            key = (int(shard), attempt)
            named[key] = named.get(key, 0) + (record.job_id is not None)
    recorded = {r.job_id for r in load_submissions(layout) if r.job_id}
    assert set(world.cluster().jobs()) <= recorded  # no job that no record names
    for shard in range(3):
        folders = sorted(p.name for p in (layout.shard_dir(shard) / "attempts").iterdir())
        assert folders == [f"attempt-{n:04d}" for n in range(1, len(folders) + 1)], folders
        assert len(folders) <= 2, folders  # one retry's worth, however they interleave
        for number in range(1, len(folders) + 1):
            assert named.get((shard, number), 0) <= 1, (shard, number, named)


@pytest.mark.parametrize("round_", range(budget(3, 30)))
def test_two_retries_and_a_cancel_racing_converge(tmp_path: Path, round_: int) -> None:
    world, profile, env, client = _race_world(tmp_path)
    commands = [["retry", RUN_ID, "--yes", "--json"], ["retry", RUN_ID, "--yes", "--json"],
                ["cancel", RUN_ID, "--json", "--wait", "10"]]
    if round_ % 2:
        commands.reverse()
    procs = [subprocess.Popen([*SYNTHBATCH, *args, "--profile", profile], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for args in commands]
    results: List[Any] = [(p.args[3], *p.communicate(timeout=120), p.returncode) for p in procs]
    for command, out, err, code in results:
        assert code in (0, 4), (command, code, out, err)  # 4: a retry found nothing to do
        assert "Traceback" not in err and '"internal"' not in err, (command, err)
    _invariants(world)
    code = fork_call(lambda: drive(world, world.cluster(), client), log=world.root / "drive")
    assert code == 0, (world.root / "drive").read_text()[-3000:]
    data = observe(world.layout, Scheduler(runner=world.cluster()))
    assert data["state"] == "succeeded" and data["records_done"] == 15, data
    run_jobs(world, world.cluster(), client)  # nothing left to run
    assert not world.cluster().runnable()
