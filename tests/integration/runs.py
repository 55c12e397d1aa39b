"""Helpers shared by the end-to-end tests (real Slurm, or the local backend): profiles, the CLI
as JSON, waiting."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional

import pytest
from click.testing import CliRunner, Result

from synthbatch.control.cli.main import cli
from tests.conftest import FAKE_SERVER, REPO
from tests.fakes import poll

SERVING = REPO / ".work" / "serving"


def serving_env(engine: str) -> Path:
    """A serving environment (``scripts/serving-env ENGINE``): skipped without it, failed
    under CI=true."""
    env = SERVING / engine
    if not (env / ".complete").exists():
        message = f"no {engine} serving environment: run scripts/serving-env {engine}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return env


LLAMACPP_SERVING = SERVING / "llamacpp"


def require_llamacpp() -> Path:
    """The llama.cpp serving environment; skip without it (fail in CI)."""
    return serving_env("llamacpp")


@contextlib.contextmanager
def llamacpp_server(folder: Path, *flags: str) -> Iterator[str]:
    """The agent's ``serve-llamacpp`` role on this machine (no Slurm) with SmolLM2 on a
    free loopback port, ``flags`` added (``-t 1 -np 2 -c 2048``, ``--metrics``); yields its
    URL once ``/health`` answers; stopped at exit. Its log is ``folder/server.log``."""
    env_dir = require_llamacpp()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    log_path = folder / "server.log"
    argv = [str(env_dir / "venv" / "bin" / "python"), "-m", "agent_stdlib", "serve-llamacpp",
            "-m", str(env_dir / "model.gguf"), "--port", str(port), "-a", "smollm2", *flags]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)},
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            if proc.poll() is not None:
                pytest.fail(f"llama.cpp exited: {log_path.read_text()}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


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
    values = {**PROFILE_DEFAULTS, "workspace": str(tmp_path / "workspace"), "python": python,
              **fields}
    lines = ["schema_version = 1"] + [f"{key} = {json.dumps(value)}"
                                      for key, value in sorted(values.items())]
    path = tmp_path / "profile.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


LOCAL_DEFAULTS: Dict[str, Any] = {"gpus": [0, 1, 2, 3], "kill_wait_s": 5}


def write_local_profile(tmp_path: Path, python: str, local: Optional[Dict[str, Any]] = None,
                        **fields: Any) -> Path:
    """A local backend profile (no Slurm) with the testbed's shape: 4 GPUs that exist only
    as indices (``local.gpus``), so runs written for the testbed run unchanged."""
    values = dict(PROFILE_DEFAULTS, workspace=str(tmp_path / "workspace"), python=python,
                  backend="local", **fields)
    values.pop("partition")
    table = dict(LOCAL_DEFAULTS, **(local or {}))
    lines = ["schema_version = 1"] + [f"{key} = {json.dumps(value)}"
                                      for key, value in sorted(values.items())]
    lines += ["[local]"] + [f"{key} = {json.dumps(value)}" for key, value in sorted(table.items())]
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


def write_run(tmp_path: Path, records: int, shards: int, latency: float) -> Path:
    command = ["{python}", str(FAKE_SERVER), "--host", "{host}", "--port", "{port}",
               "--model", "{served_name}", "--token-latency", str(latency)]
    path = tmp_path / "run.toml"
    path.write_text(
        "schema_version = 1\n"
        'name = "observe"\n'
        "auto_retry = false\n"  # these tests watch failures and retry by hand
        f"records = {records}\n"
        f"[shards]\ncount = {shards}\n"
        '[client]\nmodel = "tiny"\nprompt_template = "Item {index}."\n'
        "max_tokens = 8\ntemperature = 0.0\nconcurrency = 1\nmax_retries = 1\n"
        '[[deployments]]\nalias = "tiny"\n'
        f'model = "fake-{secrets.token_hex(4)}"\n'
        f"command = {json.dumps(command)}\n"
        "gpus = 1\nstartup_timeout_s = 60\n"
    )
    return path


def wait_until(what: str, check: Callable[[], Any], timeout_s: float = 90) -> Any:
    return poll(what, check, timeout_s, interval_s=1.0)


CRASH_WRAPPER = """\
import os, sys
task = os.environ.get("SLURM_ARRAY_TASK_ID") or \\
    os.environ.get("SYNTHBATCH_LOCAL_ARRAY_TASK_ID", "none")
state, args = sys.argv[1], sys.argv[3:]
crashing = dict((item.split("x") + ["1"])[:2] for item in sys.argv[2].split(","))
args += ["--request-log", os.path.join(state, "requests-%s.log" % task)]
for start in range(int(crashing.get(task, 0))):
    try:
        name = "crashed-%s" % task + ("-%d" % start if start else "")
        os.close(os.open(os.path.join(state, name), os.O_CREAT | os.O_EXCL))
        args += ["--exit-after", "3"]
        break
    except FileExistsError:
        pass
os.execv(sys.executable, [sys.executable, FAKE_SERVER] + args)
"""


def crash_wrapper(tmp_path: Path) -> Path:
    """A server command that crashes the named array tasks' servers on their first start
    only (``2x2``: on its first two starts), and logs every request per task:
    ``python serve.py STATE 1,4x2 <server flags>``.
    The task id is Slurm's, or the local backend's (the profile lets it through)."""
    wrapper = tmp_path / "serve.py"
    wrapper.write_text(CRASH_WRAPPER.replace("FAKE_SERVER", repr(str(FAKE_SERVER))))
    return wrapper



TESTBED = REPO / "scripts" / "slurm-testbed"


def run_testbed(cluster: Any, command: str, *args: str) -> None:
    """``scripts/slurm-testbed COMMAND DIR ARGS`` for ``cluster`` (a ``SlurmCluster``: its
    recorded knobs)."""
    env = {k: v for k, v in cluster.env().items() if not k.startswith("SYNTHBATCH_TESTBED_")}
    subprocess.run([str(TESTBED), command, cluster.dir, *args], env=env, check=True,
                   capture_output=True, text=True, timeout=180)


@contextlib.contextmanager
def outage(cluster: Any, daemon: str, kill: bool = False) -> Iterator[None]:
    """``daemon`` stopped (SIGKILL with ``kill``) for the block, started again after it."""
    run_testbed(cluster, "stop", daemon, *(["--kill"] if kill else []))
    try:
        yield
    finally:
        run_testbed(cluster, "up")
