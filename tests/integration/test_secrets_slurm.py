"""Secrets and the environment on the real Slurm testbed (issue 22, docs/reliability.md
"Secrets and the environment").

One run with a canary secret referenced from the run (``{ secret = NAME }`` in a server's
and the command client's env, NAME in the profile's ``secrets``), a canary *ambient*
variable exported in the submitting shell, and a canary set in the batch environment (the
profile's ``python`` is a wrapper that exports it for the agent only, as a site's prolog
or the user's login environment would). While the run's agent, proxy, server and client
are alive, every process's ``/proc/*/cmdline`` is sampled again and again, and the
environment of each of the run's processes is read. Then the run directory, the ``--json``
output of submit/status/runs/logs/merge, error messages, slurmctld's state directory and
``scontrol show job -dd``/``sacct`` are searched.

* the secret reaches the server and the client under their own names, and nowhere else:
  no argv, no file of the run, no output, no other process's environment but the agent's;
* the ambient canary reaches nothing: not the job (sbatch exports an allow-list), so not
  slurmctld's state either, and no step;
* the batch-environment canary reaches no step and not the proxy.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Set

import pytest
from click.testing import CliRunner

from synthbatch.control.cli.main import cli
from tests.conftest import FAKE_SERVER, REPO
from tests.integration.runs import write_profile

pytestmark = pytest.mark.slurm
SECRET_VAR = "SYNTHBATCH_CANARY_SECRET"
AMBIENT_VAR = "SYNTHBATCH_CANARY_AMBIENT"
BATCH_VAR = "SYNTHBATCH_CANARY_BATCH"
CLIENT = REPO / "examples" / "clients" / "chat_client.py"


def run_cli(*args: str) -> tuple:
    """(exit code, stdout, stderr) of one in-process CLI command."""
    result = CliRunner().invoke(cli, list(args), catch_exceptions=True)
    return result.exit_code, result.stdout, result.stderr


def read_proc(pid: str, name: str) -> Optional[bytes]:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:  # gone, or not ours to read
        return None


def environ(raw: bytes) -> Dict[str, str]:
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


def role(cmd: str, run_id: str, model: str) -> Optional[str]:
    """Which of the run's processes ``cmd`` (NUL-separated argv) is, if any."""
    if cmd.startswith("srun") or "\0" not in cmd:
        return None
    if str(FAKE_SERVER) in cmd and model in cmd:
        return "server"
    if str(CLIENT) in cmd:
        return "client"
    if run_id in cmd and "\0proxy\0" in cmd:
        return "proxy"
    if run_id in cmd and "\0allocation\0" in cmd:
        return "agent"
    return None


def write_run(tmp_path: Path, python: str, model: str) -> Path:
    server = [python, str(FAKE_SERVER), "--host", "{host}", "--port", "{port}",
              "--model", "{served_name}", "--token-latency", "0.15"]
    path = tmp_path / "run.toml"
    path.write_text(
        "schema_version = 1\n"
        'name = "canary"\n'
        "records = 4\n"
        "[shards]\ncount = 1\n"
        f"[client]\ncommand = {json.dumps([python, str(CLIENT)])}\n"
        f'env = {{ CLIENT_KEY = {{ secret = "{SECRET_VAR}" }} }}\n'
        '[[deployments]]\nalias = "tiny"\n'
        f'model = "{model}"\n'
        f"command = {json.dumps(server)}\n"
        f'env = {{ SERVER_KEY = {{ secret = "{SECRET_VAR}" }} }}\n'
        "gpus = 1\nstartup_timeout_s = 60\n")
    return path


def state_save_location() -> Path:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    line = next(x for x in out.splitlines() if x.startswith("StateSaveLocation"))
    return Path(line.split("=", 1)[1].strip())


def test_canaries_never_leak_and_the_secret_reaches_its_steps(slurm_cluster, tmp_path,
                                                              python_exe, monkeypatch):
    secret, ambient, batch = (f"canary-{kind}-{secrets.token_hex(10)}"
                              for kind in ("secret", "ambient", "batch"))
    monkeypatch.setenv(SECRET_VAR, secret)
    monkeypatch.setenv(AMBIENT_VAR, ambient)  # the submitting shell's own variable
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\ncase " $* " in *" allocation "*) export {BATCH_VAR}='
                       f'{batch};; esac\nexec {python_exe} "$@"\n')
    wrapper.chmod(0o700)
    profile = str(write_profile(tmp_path, str(wrapper), secrets=[SECRET_VAR]))
    model = f"fake-{secrets.token_hex(4)}"
    shown: List[str] = []  # everything the CLI printed

    code, out, err = run_cli("submit", str(write_run(tmp_path, python_exe, model)),
                             "--profile", profile, "--json")
    assert code == 0, out + err
    shown += [out, err]
    run_id, job = json.loads(out)["run_id"], json.loads(out)["job_id"]
    run_dir = tmp_path / "workspace" / "runs" / run_id

    # while the run lives: every argv, again and again; each of the run's processes' env
    envs: Dict[str, Dict[str, str]] = {}
    leaking: Set[str] = set()
    samples = seen = 0
    stored: Optional[str] = None
    canaries = (secret.encode(), ambient.encode(), batch.encode())
    deadline = time.monotonic() + 50
    while time.monotonic() < deadline:
        samples += 1
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            raw = read_proc(pid, "cmdline")
            if not raw:
                continue
            seen += 1
            cmd = raw.decode(errors="replace")
            if any(c in raw for c in canaries):
                leaking.add(cmd.replace("\0", " "))
            name = role(cmd, run_id, model)
            env = read_proc(pid, "environ") if name else None
            if name and env:
                envs.setdefault(name, environ(env))
        if stored is None:  # slurmctld's copy of the job's environment
            found = list(state_save_location().glob(f"hash.*/job.{job}/environment"))
            stored = found[0].read_bytes().decode(errors="replace") if found else None
        code, out, err = run_cli("status", run_id, "--profile", profile, "--json")
        shown += [out, err]
        if code == 0 and json.loads(out)["state"] != "running" and len(envs) == 4:
            break
        time.sleep(0.2)
    final = json.loads(out)
    print(f"canary scan: {samples} samples of /proc, {seen} argv read, {len(envs)} "
          f"environments ({', '.join(sorted(envs))})")
    assert final["state"] == "succeeded", final
    assert set(envs) == {"agent", "proxy", "server", "client"}, sorted(envs)
    assert samples > 10 and seen > samples, (samples, seen)
    assert not leaking, leaking

    # the secret reaches what needs it, under the step's own name, and nothing else
    assert envs["server"].get("SERVER_KEY") == secret
    assert envs["client"].get("CLIENT_KEY") == secret
    assert envs["agent"].get(SECRET_VAR) == secret  # the job's variable, by name
    for name in ("server", "client", "proxy"):
        assert SECRET_VAR not in envs[name], name
        assert secret not in json.dumps(
            {k: v for k, v in envs[name].items() if k not in ("SERVER_KEY", "CLIENT_KEY")})
    # the ambient canary reaches nothing (not even the job); the batch one no step
    assert envs["agent"].get(BATCH_VAR) == batch  # the wrapper did set it
    for name, env in envs.items():
        assert AMBIENT_VAR not in env and ambient not in json.dumps(env), name
        if name != "agent":
            assert BATCH_VAR not in env and batch not in json.dumps(env), name
    assert envs["server"].get("SLURM_EXPORT_ENV") and "PATH" in envs["server"]

    # Slurm's own copy: slurmctld stores what sbatch exported (the secret is one of them)
    assert stored is not None, "no environment file in slurmctld's StateSaveLocation"
    assert ambient not in stored and batch not in stored
    assert f"{SECRET_VAR}={secret}" in stored  # documented: a named secret is stored
    for argv in (["scontrol", "show", "job", "-dd", job],
                 ["sacct", "-j", job, "--env-vars", "-o", "JobID,SubmitLine%300"]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert not any(c in done.stdout + done.stderr for c in (secret, ambient)), argv

    # what the commands print, errors included
    merged = tmp_path / "merged.jsonl"
    for args in (("runs",), ("status", run_id), ("logs", run_id, "--shard", "0"),
                 ("logs", run_id, "--shard", "0", "--step", "server-tiny-0"),
                 ("logs", run_id, "--shard", "0", "--step", "slurm"),
                 ("merge", run_id, "--output", str(merged)),
                 ("logs", run_id, "--shard", "0", "--step", "no-such-step"),
                 ("retry", run_id, "--yes"), ("status", run_id, "--shard", "7")):
        for json_flag in ((), ("--json",)):
            code, out, err = run_cli(*args, *json_flag, "--profile", profile)
            shown += [out, err]
    assert [json.loads(line)["index"] for line in merged.read_text().splitlines()] == \
        list(range(4))
    for text in shown:
        assert not any(c in text for c in (secret, ambient, batch)), text[:300]

    # every file of the run: plan, state, batch scripts, logs (the agent's and Slurm's)
    files = [p for p in run_dir.rglob("*") if p.is_file() and not p.is_symlink()]
    assert any(p.name == "plan.json" for p in files)
    assert any(p.suffix == ".sbatch" for p in files) and any(p.suffix == ".log" for p in files)
    for path in files:
        data = path.read_bytes()
        assert not any(c in data for c in canaries), path
