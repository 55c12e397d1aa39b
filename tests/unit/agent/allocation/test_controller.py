"""The allocation controller end to end with local processes (no Slurm)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures.fake_openai_server import expected_completion
from synthbatch.agent_stdlib import localjob
from synthbatch.agent_stdlib.allocation.errors import AllocationFailure
from synthbatch.agent_stdlib.allocation.invocation import resolve_shard
from synthbatch.agent_stdlib.attempts import advance_attempt, load_attempt, load_readiness
from synthbatch.agent_stdlib.contracts import (
    ArraySpec,
    CommandClientSpec,
    ContainerSpec,
    MountSpec,
    ResultManifest,
    RunRecord,
    WinnerRecord,
)
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import publish_immutable, read_json
from synthbatch.control.cli.main import cli
from tests.agent_runs import (
    TESTBED,
    local_plan,
    run_allocation,
    server_argv,
    stage,
    start_allocation,
    start_local_task,
    wait_for_progress,
)
from tests.conftest import FAKE_SERVER
from tests.processes import processes_mentioning


def test_successful_attempt_publishes_winner_and_stops_everything(tmp_path, agent_pyz,
                                                                   python_exe):
    plan = local_plan(python_exe, server_argv(python_exe), records=6)
    args = stage(tmp_path / "run", plan)
    result = run_allocation(python_exe, agent_pyz, args)
    assert result.returncode == 0, result.stderr
    layout = RunLayout(tmp_path / "run")
    paths = layout.attempt(0, 1)
    attempt = load_attempt(paths.attempt_json)
    # implied by the submission (1), +running, +succeeded
    assert attempt.state == "succeeded" and attempt.revision == 3
    readiness = load_readiness(paths.readiness_json)
    assert readiness.state == "stopped"
    winner = WinnerRecord.from_dict(read_json(layout.winner_json(0)))
    manifest = ResultManifest.from_dict(read_json(paths.result_json))
    assert winner.attempt == 1 and winner.records == 6 == manifest.records
    lines = (paths.output / manifest.files[0].path).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["index"] for r in records] == list(range(6))
    for record in records:
        assert record["prompt"] == f"Tell me about {record['index']}."
        assert record["completion"] == expected_completion("fake-model", record["prompt"], 8)
    assert not processes_mentioning(str(tmp_path / "run"))


def test_server_that_exits_fails_the_attempt_fast_with_its_status(tmp_path, agent_pyz,
                                                                  python_exe):
    command = [python_exe, "-c", "import sys; print('boom'); sys.exit(3)", "{port}"]
    plan = local_plan(python_exe, command, startup_timeout_s=120)
    args = stage(tmp_path / "run", plan)
    started = time.monotonic()
    result = run_allocation(python_exe, agent_pyz, args)
    assert result.returncode == 1
    assert time.monotonic() - started < 60  # failed on exit, not on the 120 s deadline
    attempt = load_attempt(RunLayout(tmp_path / "run").attempt(0, 1).attempt_json)
    assert attempt.state == "failed"
    assert "exited with status 3" in attempt.reason and "boom" in attempt.reason
    assert not RunLayout(tmp_path / "run").winner_json(0).exists()


def test_server_never_ready_fails_at_the_deadline(tmp_path, agent_pyz, python_exe):
    command = [python_exe, "-c", "import time; time.sleep(60)", "{port}"]
    plan = local_plan(python_exe, command, startup_timeout_s=1.5)
    args = stage(tmp_path / "run", plan)
    result = run_allocation(python_exe, agent_pyz, args)
    assert result.returncode == 1
    attempt = load_attempt(RunLayout(tmp_path / "run").attempt(0, 1).attempt_json)
    assert attempt.state == "failed" and "not ready after 1.5s" in attempt.reason
    assert not processes_mentioning("time.sleep(60)")


def test_server_crash_during_generation_fails_the_attempt(tmp_path, agent_pyz, python_exe):
    plan = local_plan(python_exe, server_argv(python_exe, "--exit-after", "2"), records=6)
    args = stage(tmp_path / "run", plan)
    result = run_allocation(python_exe, agent_pyz, args)
    assert result.returncode == 1
    attempt = load_attempt(RunLayout(tmp_path / "run").attempt(0, 1).attempt_json)
    assert attempt.state == "failed"
    assert "exited with status 3" in attempt.reason or "client exited" in attempt.reason
    assert not RunLayout(tmp_path / "run").winner_json(0).exists()


def test_sigterm_cancels_cleans_up_and_records_cancelled(tmp_path, agent_pyz, python_exe):
    plan = local_plan(python_exe, server_argv(python_exe, "--token-latency", "0.5"), records=6)
    args = stage(tmp_path / "run", plan)
    proc = start_allocation(python_exe, agent_pyz, args)
    readiness = RunLayout(tmp_path / "run").attempt(0, 1).readiness_json
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        record = load_readiness(readiness) if readiness.exists() else None
        if record is not None and record.state == "ready":
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("allocation never became ready")
    # this allocation's servers only (other suites may run fake servers at the same time)
    ports = [b.url.rsplit(":", 1)[1] for group in record.backends.values() for b in group]
    ours = [f"{FAKE_SERVER} --host 127.0.0.1 --port {p} " for p in ports]
    assert ports and processes_mentioning(*ours)  # the pattern finds them while they run
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    attempt = load_attempt(RunLayout(tmp_path / "run").attempt(0, 1).attempt_json)
    assert attempt.state == "cancelled" and "SIGTERM" in attempt.reason
    assert load_readiness(readiness).state == "stopped"
    assert not processes_mentioning(*ours)


STUBBORN = ("import signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "subprocess.run(sys.argv[1:])\n"
            "time.sleep(90)\n")  # serves through its child, then outlives SIGTERM


def test_a_cancellation_is_recorded_before_a_slow_cleanup(tmp_path, agent_pyz, python_exe):
    # Slurm SIGKILLs the job KillWait after its SIGTERM (5 s on the testbed, 30 s by
    # default); stopping a server that outlives SIGTERM (the urgent grace, then SIGKILL and
    # the confirmation that every step is gone) must not keep the outcome unwritten: the
    # agent was SIGKILLed first under load in CI and status said 'cancelled outside
    # synthbatch' (before: the attempt was recorded only once readiness was 'stopped')
    command = [python_exe, "-c", STUBBORN, *server_argv(python_exe, "--token-latency", "0.5")]
    args = stage(tmp_path / "run", local_plan(python_exe, command, records=6))
    paths = RunLayout(tmp_path / "run").attempt(0, 1)
    proc = start_allocation(python_exe, agent_pyz, args)
    _wait_readiness(paths.readiness_json, "ready", proc)
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    while load_attempt(paths.attempt_json).state == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    attempt, stopping = load_attempt(paths.attempt_json), load_readiness(paths.readiness_json)
    _, err = proc.communicate(timeout=60)
    assert attempt.state == "cancelled" and "SIGTERM" in attempt.reason, err
    assert stopping.state in ("ready", "stopping")  # recorded before the servers stopped
    assert load_readiness(paths.readiness_json).state == "stopped"
    assert proc.returncode == 1 and not processes_mentioning(STUBBORN.splitlines()[0])


def test_wrong_plan_digest_is_refused_before_anything_starts(tmp_path, agent_pyz, python_exe):
    plan = local_plan(python_exe, server_argv(python_exe))
    args = stage(tmp_path / "run", plan)
    args["plan_sha256"] = "0" * 64
    result = run_allocation(python_exe, agent_pyz, args)
    assert result.returncode == 2 and "does not match" in result.stderr
    layout = RunLayout(tmp_path / "run")
    assert load_attempt(layout.attempt(0, 1).attempt_json) is None  # nothing written
    assert not layout.shard_dir(0).exists()


def test_a_first_attempt_gets_its_record_from_its_agent(tmp_path, agent_pyz, python_exe):
    # submit writes nothing per shard: the submission record implies attempt 1 submitted
    plan = local_plan(python_exe, server_argv(python_exe), records=2)
    args = stage(tmp_path / "run", plan)
    layout = RunLayout(tmp_path / "run")
    assert not layout.shard_dir(0).exists()
    assert run_allocation(python_exe, agent_pyz, args).returncode == 0
    attempt = load_attempt(layout.attempt(0, 1).attempt_json)
    assert (attempt.state, attempt.job_id, attempt.submission) == ("succeeded", "1_0", 1)
    assert oct(layout.shard_dir(0).stat().st_mode & 0o777) == "0o700"


def test_a_submission_without_its_job_id_is_refused(tmp_path, agent_pyz, python_exe):
    plan = local_plan(python_exe, server_argv(python_exe))
    args = stage(tmp_path / "run", plan)
    layout = RunLayout(tmp_path / "run")
    record = read_json(layout.submission_json(1))
    record["job_id"] = None  # released by hand before submit recorded the job id
    layout.submission_json(1).write_text(json.dumps(record))
    result = run_allocation(python_exe, agent_pyz, args)
    assert result.returncode == 2 and "has no job id recorded yet" in result.stderr
    assert not layout.shard_dir(0).exists()


def _wait_readiness(path: Path, state: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        record = load_readiness(path) if path.exists() else None
        if record is not None and record.state == state:
            return
        time.sleep(0.02)
    proc.kill()
    pytest.fail(f"allocation never published readiness {state}")


def test_usr1_stops_generation_gracefully_and_keeps_partial_output(tmp_path, agent_pyz,
                                                                     python_exe):
    plan = local_plan(python_exe, server_argv(python_exe, "--token-latency", "0.05"), records=30)
    args = stage(tmp_path / "run", plan)
    paths = RunLayout(tmp_path / "run").attempt(0, 1)
    proc = start_allocation(python_exe, agent_pyz, args)
    deadline = time.monotonic() + 30
    while (read_json(paths.progress_json) or {}).get("records_done", 0) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, "no client progress"
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=30)
    attempt = load_attempt(paths.attempt_json)
    assert attempt.state == "failed", err  # local launcher: no scheduler to requeue with
    assert "SIGUSR1" in attempt.reason and "kept as partial" in attempt.reason
    assert 2 <= attempt.partial_records < 30
    lines = next(paths.output.glob("*.jsonl")).read_text().splitlines()
    assert [json.loads(line)["index"] for line in lines] == list(range(len(lines)))
    assert len(lines) == attempt.partial_records
    assert "stopped by a signal" in (paths.execution_logs(1) / "client.log").read_text()
    assert load_readiness(paths.readiness_json).state == "stopped"
    assert not processes_mentioning(str(tmp_path / "run"))


def test_persisted_running_attempt_restarts_at_the_next_revision(tmp_path, agent_pyz,
                                                                 python_exe):
    plan = local_plan(python_exe, server_argv(python_exe, "--startup-delay", "1"), records=3)
    args = stage(tmp_path / "run", plan, records=True)
    paths = RunLayout(tmp_path / "run").attempt(0, 1)
    advance_attempt(paths.attempt_json, "running")  # an execution died without cleanup
    proc = start_allocation(python_exe, agent_pyz, args)
    _wait_readiness(paths.readiness_json, "restarting", proc)
    first = load_readiness(paths.readiness_json).revision
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    final = load_readiness(paths.readiness_json)
    assert final.state == "stopped" and final.revision > first
    assert load_attempt(paths.attempt_json).state == "succeeded"


def test_succeeded_attempt_without_winner_is_completed_by_the_next_agent(tmp_path, agent_pyz,
                                                                         python_exe):
    plan = local_plan(python_exe, server_argv(python_exe), records=3)
    args = stage(tmp_path / "run", plan)
    assert run_allocation(python_exe, agent_pyz, args).returncode == 0
    layout = RunLayout(tmp_path / "run")
    original = WinnerRecord.from_dict(read_json(layout.winner_json(0)))
    layout.winner_json(0).unlink()  # as if the agent died right after "succeeded"
    again = run_allocation(python_exe, agent_pyz, args)
    assert again.returncode == 0 and "winner completed" in again.stderr
    winner = WinnerRecord.from_dict(read_json(layout.winner_json(0)))
    assert winner.replace(created_at=0) == original.replace(created_at=0)


def test_preflight_failure_happens_before_any_server_starts(tmp_path, agent_pyz, python_exe):
    plan = local_plan(python_exe, server_argv(python_exe), records=3)
    dep = dataclasses.replace(plan.deployments[0], model=str(tmp_path / "missing-model"))
    args = stage(tmp_path / "run", plan.replace(deployments=(dep,)))
    result = run_allocation(python_exe, agent_pyz, args)
    assert result.returncode == 1
    paths = RunLayout(tmp_path / "run").attempt(0, 1)
    attempt = load_attempt(paths.attempt_json)
    assert attempt.state == "failed" and attempt.reason.startswith("preflight: paths: ")
    assert "missing-model is missing" in attempt.reason
    assert sorted(p.name for p in paths.execution_logs(1).iterdir()) == []
    assert load_readiness(paths.readiness_json).state == "stopped"


# ----------------------------------------------------------------------------- arrays


def test_resolve_shard_maps_array_tasks_to_shards():
    plan = local_plan("/usr/bin/python3", ["x"], records=5, shards=5)
    arrays = (ArraySpec(index=0, first_shard=0, count=3), ArraySpec(index=1, first_shard=3,
                                                                    count=2))
    chunked = plan.replace(arrays=arrays)
    task = {"SLURM_ARRAY_TASK_ID": "1"}
    assert resolve_shard(chunked, task, None, 1) == (4, 1)
    assert resolve_shard(chunked, task, None, 0) == (1, 1)
    assert resolve_shard(plan, task, None, None) == (1, 1)  # no arrays: task id == shard
    single = plan.replace(arrays=(ArraySpec(index=0, first_shard=0, count=5),))
    assert resolve_shard(single, task, None, None) == (1, 1)  # an old script, one array
    assert resolve_shard(chunked, {}, 4, None) == (4, 1)  # --shard: its task in its array
    for env, index, message in (
            (task, None, "2 arrays and the batch script passed no --array-index"),
            (task, 5, "no such array"),
            ({"SLURM_ARRAY_TASK_ID": "2"}, 1, "array 1 has 2 task"),
            ({}, 0, "SLURM_ARRAY_TASK_ID is not set")):
        with pytest.raises(AllocationFailure, match=message):
            resolve_shard(chunked, env, None, index)


def test_array_index_selects_the_shard_end_to_end(tmp_path, agent_pyz, python_exe):
    plan = local_plan(python_exe, server_argv(python_exe), records=8, shards=4)
    plan = plan.replace(arrays=(ArraySpec(index=0, first_shard=0, count=2),
                                ArraySpec(index=1, first_shard=2, count=2)))
    args = stage(tmp_path / "run", plan)
    argv = [python_exe, "-I", str(agent_pyz), "allocation", "--run-dir", args["run_dir"],
            "--plan-sha256", args["plan_sha256"], "--submission", "1",
            "--agent-pyz", str(agent_pyz), "--array-index", "1"]
    env = dict(os.environ, SHIV_ROOT=str(tmp_path / ".shiv"), SLURM_ARRAY_TASK_ID="1")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    layout = RunLayout(tmp_path / "run")
    assert WinnerRecord.from_dict(read_json(layout.winner_json(3))).records == 2
    assert [load_attempt(layout.attempt(s, 1).attempt_json) for s in range(3)] == \
        [None] * 3  # the other shards' first attempts: still only implied


# ----------------------------------------------------------------------------- containers

FAKE_APPTAINER = '''#!{python}
"""A stand-in for apptainer: strips its flags, maps bind targets back to host paths in
argv and APPTAINERENV_* values (a poor man's mount namespace), logs what it got, execs."""
import json, os, shutil, sys
args = sys.argv[1:]
assert args.pop(0) == "exec", sys.argv
binds = []
while args[0].startswith("--"):
    flag = args.pop(0)
    if flag == "--bind":
        binds = [b.split(":")[:2] for b in args.pop(0).split(",")]
image = args.pop(0)
assert os.path.isfile(image), image
def host(value):
    for src, dst in sorted(binds, key=lambda b: -len(b[1])):
        if value == dst or value.startswith(dst + "/"):
            return src + value[len(dst):]
    return value
passed = {{k: v for k, v in os.environ.items() if k.startswith("APPTAINERENV_")}}
with open({log!r}, "a") as log:
    log.write(json.dumps({{"argv": sys.argv, "env": {{k: v for k, v in passed.items()
                                                     if "SECRET" not in v}},
                          "names": sorted(passed)}}) + "\\n")
env = {{k[len("APPTAINERENV_"):]: host(v) for k, v in passed.items()}}
env["PATH"] = "/usr/bin:/bin"
argv = [host(a) for a in args]
os.execve(argv[0] if "/" in argv[0] else shutil.which(argv[0]), argv, env)
'''

WRAP_SERVER = """\
import json, os, runpy, sys
out, agent = sys.argv[1], sys.argv[2]
with open(out, "w") as handle:
    json.dump({"env": dict(os.environ), "agent": agent}, handle)
sys.argv = sys.argv[3:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

CLIENT = """\
import json, os, urllib.request
base = json.loads(os.environ["SYNTHBATCH_ENDPOINTS"])["tiny"]
first = int(os.environ["SYNTHBATCH_RECORD_OFFSET"])
count = int(os.environ["SYNTHBATCH_NUM_RECORDS"])
with open(os.path.join(os.environ["SYNTHBATCH_OUTPUT_DIR"], "records.jsonl"), "w") as out:
    for index in range(first, first + count):
        body = json.dumps({"model": "fake-model", "max_tokens": 3,
                           "messages": [{"role": "user", "content": f"item {index}"}]})
        request = urllib.request.Request(base + "/v1/chat/completions", data=body.encode(),
                                         headers={"Content-Type": "application/json"})
        reply = json.load(urllib.request.urlopen(request, timeout=30))
        out.write(json.dumps({"index": index, "text": reply["choices"][0]["message"]["content"],
                              "key_ok": os.environ.get("API_KEY") == "client-SECRET"}) + "\\n")
"""


def test_fake_apptainer_wraps_server_and_command_client(tmp_path, agent_pyz, python_exe,
                                                        repo_root):
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "wrap_server.py").write_text(WRAP_SERVER)
    (tools / "client.py").write_text(CLIENT)
    log = tmp_path / "apptainer.log"
    fake = tools / "apptainer"
    fake.write_text(FAKE_APPTAINER.format(python=python_exe, log=str(log)))
    fake.chmod(0o755)
    image = tmp_path / "img.sif"
    image.write_bytes(b"not really an image")
    run = tmp_path / "run"
    box = ContainerSpec(runtime="apptainer", image="img", path=str(image),
                        sha256=hashlib.sha256(image.read_bytes()).hexdigest(),
                        mounts=(MountSpec(str(repo_root), "/code", True),
                                MountSpec(str(tools), "/opt/tools", True),
                                MountSpec(str(run), "/synthbatch/run", False)),
                        executable=str(fake))
    command = [python_exe, "/opt/tools/wrap_server.py", "/synthbatch/run/server-env.json",
               "{agent}", "/code/fixtures/fake_openai_server.py", "--host", "{host}",
               "--port", "{port}", "--model", "fake-model"]
    plan = local_plan(python_exe, command, records=4)
    dep = dataclasses.replace(plan.deployments[0], container=box,
                              secret_env={"MY_TOKEN": "SYNTHBATCH_TEST_SERVER_SECRET"})
    client = CommandClientSpec(argv=(python_exe, "/opt/tools/client.py"), env={"MODE": "x"},
                               secret_env={"API_KEY": "SYNTHBATCH_TEST_CLIENT_SECRET"},
                               container=box)
    args = stage(run, plan.replace(deployments=(dep,), client=None, client_command=client))
    staged = run / "agent.pyz"
    shutil.copyfile(agent_pyz, staged)
    argv = [python_exe, "-I", str(staged), "allocation", "--run-dir", args["run_dir"],
            "--plan-sha256", args["plan_sha256"], "--submission", "1",
            "--agent-pyz", str(staged), "--shard", "0"]
    env = dict(os.environ, SHIV_ROOT=str(tmp_path / ".shiv"),
               SYNTHBATCH_TEST_SERVER_SECRET="server-SECRET",
               SYNTHBATCH_TEST_CLIENT_SECRET="client-SECRET")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90,
                          check=False)
    paths = RunLayout(run).attempt(0, 1)
    assert done.returncode == 0, (done.stderr, load_attempt(paths.attempt_json))
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    server_call, client_call = calls
    assert server_call["argv"][1:6] == ["exec", "--cleanenv", "--no-home", "--bind",
                                        f"{repo_root}:/code:ro,{tools}:/opt/tools:ro,"
                                        f"{run}:/synthbatch/run,"
                                        f"{tmp_path / '.shiv'}:/synthbatch/scratch"]
    assert server_call["env"]["APPTAINERENV_SHIV_ROOT"] == "/synthbatch/scratch"
    assert server_call["argv"][6] == str(image)
    assert "/synthbatch/run/agent.pyz" in server_call["argv"]  # {agent}, translated
    assert "APPTAINERENV_MY_TOKEN" in server_call["names"]
    seen = json.loads((run / "server-env.json").read_text())
    assert seen["env"]["MY_TOKEN"] == "server-SECRET" and seen["agent"] == str(staged)
    assert client_call["env"]["APPTAINERENV_SYNTHBATCH_OUTPUT_DIR"] == \
        "/synthbatch/run/shards/shard-00000/attempts/attempt-0001/output"
    assert "APPTAINERENV_API_KEY" in client_call["names"]
    records = [json.loads(line) for line in
               (paths.output / "records.jsonl").read_text().splitlines()]
    assert [r["index"] for r in records] == [0, 1, 2, 3] and all(r["key_ok"] for r in records)
    assert load_attempt(paths.attempt_json).state == "succeeded"
    for path in (paths.attempt_json, paths.readiness_json, paths.result_json):
        assert "SECRET" not in path.read_text()


def test_missing_secret_fails_preflight_before_any_step(tmp_path, agent_pyz, python_exe):
    plan = local_plan(python_exe, server_argv(python_exe), records=3)
    dep = dataclasses.replace(plan.deployments[0],
                              secret_env={"TOKEN": "SYNTHBATCH_TEST_UNSET_SECRET"})
    args = stage(tmp_path / "run", plan.replace(deployments=(dep,)))
    result = run_allocation(python_exe, agent_pyz, args)
    assert result.returncode == 1
    paths = RunLayout(tmp_path / "run").attempt(0, 1)
    attempt = load_attempt(paths.attempt_json)
    assert attempt.reason == ("preflight: secrets: deployment tiny: secret variable "
                              "SYNTHBATCH_TEST_UNSET_SECRET (for TOKEN) is not set in the job "
                              "environment")
    assert list(paths.execution_logs(1).iterdir()) == []


ESCAPES = "\x1b[2J\x1b]0;TITLE\x07"  # clear the screen, retitle the window
SHOWN = "\\x1b[2J\\x1b]0;TITLE\\x07"
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # every control character but \n


def test_server_log_escapes_reach_status_only_as_visible_text(tmp_path, agent_pyz, python_exe):
    """A server prints terminal escapes and exits: the agent quotes its log tail in the
    reason, and ``synthbatch status`` shows it (text and --json) only as visible escapes."""
    source = f"import sys; sys.stdout.write({ESCAPES!r} + 'boom\\n'); sys.exit(3)"
    run_id = "esc-20240101-000000-abcdef"
    plan = local_plan(python_exe, [python_exe, "-c", source, "{port}"], run_id=run_id)
    workspace = tmp_path / "ws"
    args = stage(workspace / "runs" / run_id, plan)
    assert run_allocation(python_exe, agent_pyz, args).returncode == 1
    attempt = load_attempt(RunLayout(workspace / "runs" / run_id).attempt(0, 1).attempt_json)
    assert SHOWN + "boom" in attempt.reason and not CONTROL.search(attempt.reason)
    layout = RunLayout(workspace / "runs" / run_id)
    record = RunRecord(run_id=run_id, name="test", created_at=time.time(), plan_sha256="0" * 64,
                       agent_pyz=agent_pyz.name, agent_sha256="0" * 64, backend="slurm",
                       job_name=f"synthbatch-{run_id}", shard_count=1)
    publish_immutable(layout.run_json, record.to_json().encode("utf-8"))  # committed
    profile = tmp_path / "profile.toml"
    profile.write_text(TESTBED.read_text().replace('"/tmp/synthbatch-workspace"',
                                                   json.dumps(str(workspace))))
    text = CliRunner().invoke(cli, ["status", run_id, "--profile", str(profile)])
    assert text.exit_code == 0, text.stderr
    assert SHOWN in text.stdout and not CONTROL.search(text.stdout)
    data = CliRunner().invoke(cli, ["status", run_id, "--profile", str(profile), "--json"])
    reason = json.loads(data.stdout)["failures"][0]["reason"]
    assert SHOWN in reason and not CONTROL.search(reason)


# ----------------------------------------------------------------------------- local backend


def test_usr1_under_the_local_backend_asks_its_supervisor_for_a_requeue(tmp_path, agent_pyz,
                                                                       python_exe):
    plan = local_plan(python_exe, server_argv(python_exe, "--token-latency", "0.05"), records=30)
    args = stage(tmp_path / "run", plan)
    paths = RunLayout(tmp_path / "run").attempt(0, 1)
    proc = start_local_task(tmp_path, python_exe, agent_pyz, args)
    wait_for_progress(paths, proc)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    attempt = load_attempt(paths.attempt_json)
    assert attempt.state == "running" and "requeued (restart 1 of 1)" in attempt.reason
    assert attempt.job_id == "1_0" and attempt.partial_records
    request = read_json(tmp_path / "task" / localjob.REQUEUE_FILE)
    assert request["restart_count"] == 0
    assert load_readiness(paths.readiness_json).state == "stopped"


@pytest.mark.parametrize("cause, state, words", [
    (localjob.TIME_LIMIT, "failed", "time limit reached"),
    (None, "cancelled", "received SIGTERM")])
def test_sigterm_under_the_local_backend_says_why_from_the_cause_file(
        tmp_path, agent_pyz, python_exe, cause, state, words):
    plan = local_plan(python_exe, server_argv(python_exe, "--token-latency", "0.05"), records=30)
    args = stage(tmp_path / "run", plan)
    paths = RunLayout(tmp_path / "run").attempt(0, 1)
    proc = start_local_task(tmp_path, python_exe, agent_pyz, args)
    wait_for_progress(paths, proc)
    if cause:
        localjob.write_cause(tmp_path / "task", cause, "TERM")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    attempt = load_attempt(paths.attempt_json)
    assert attempt.state == state and words in attempt.reason, err
    assert not (tmp_path / "task" / localjob.REQUEUE_FILE).exists()
