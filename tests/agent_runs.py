"""Helpers that build run directories by hand, for agent tests without a scheduler."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from synthbatch.agent_stdlib import localjob
from synthbatch.agent_stdlib.attempts import advance_attempt
from synthbatch.agent_stdlib.client.generate import Shard, run_shard
from synthbatch.agent_stdlib.client.output import Output
from synthbatch.agent_stdlib.client.progress import Progress
from synthbatch.agent_stdlib.contracts import (
    ColumnSpec,
    DeploymentSpec,
    GenerateSpec,
    Plan,
    ResourceSpec,
    RuntimeSpec,
    SeedDataSpec,
    ShardSpec,
    SubmissionRecord,
    sha256_bytes,
)
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.resume import KeptRecords
from synthbatch.agent_stdlib.statefile import (
    ensure_dir,
    publish_immutable,
    read_json,
    write_json_atomic,
)
from tests.conftest import FAKE_SERVER, REPO
from tests.fakes import create_attempt


def local_plan(python: str, command: Sequence[str], records: int = 6, shards: int = 1,
               startup_timeout_s: float = 30.0, run_id: str = "test-run") -> Plan:
    """A plan whose steps run as local processes (no srun)."""
    per = records // shards
    return Plan(
        run_id=run_id,
        name="test",
        total_records=records,
        shards=tuple(ShardSpec(i, i * per, per) for i in range(shards)),
        deployments=(DeploymentSpec(
            alias="tiny", engine="openai", model="fake-model", served_name="fake-model",
            command=tuple(command), env={}, gpus_per_replica=0, replicas=1,
            startup_timeout_s=startup_timeout_s, readiness_path="/health",
            max_queued_requests=64),),
        client=GenerateSpec(model="tiny", prompt_template="Tell me about {index}.",
                            system_prompt=None, max_tokens=8, temperature=0.0, concurrency=3,
                            max_retries=2, request_timeout_s=30.0),
        resources=ResourceSpec(partition=None, account=None, qos=None, time_limit="00:10:00",
                               nodes=1, gpus=0, gpu_request="gres", cpus=1, mem_mb=512),
        runtime=RuntimeSpec(launcher="local", python=python, port_base=20000, env_allow=(),
                            step_mem_mb=128, grace_s=3.0),
        max_attempts=1,
    )


def kept_line(index: int, **extra: object) -> str:
    """A record line as an earlier attempt left it (no newline)."""
    return json.dumps({"index": index, "completion": f"c{index}", **extra}, sort_keys=True)


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path``, making its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def stage(root: Path, plan: Plan, records: bool = False) -> Dict[str, str]:
    """Write plan and submission 1 (job ``1``), as submit does: the first attempts have no
    record, the submission implies them ``submitted``. With ``records``, each also gets
    ``created`` then ``submitted`` records (a retry's attempts). Returns the allocation
    args."""
    layout = RunLayout(ensure_dir(root))
    payload = plan.to_json().encode("utf-8")
    publish_immutable(layout.plan_json, payload)
    ensure_dir(layout.submissions)
    record = SubmissionRecord(number=1, argv=(), job_id="1",
                              attempts={str(s.index): 1 for s in plan.shards},
                              submitted_at=time.time(), released=True)
    write_json_atomic(layout.submission_json(1), record.to_dict())
    for shard in plan.shards if records else ():
        paths = layout.attempt(shard.index, 1)
        ensure_dir(paths.root)
        create_attempt(paths.attempt_json, plan.run_id, shard.index, 1)
        advance_attempt(paths.attempt_json, "submitted", job_id=f"1_{shard.index}",
                        submission=1)
    return {"run_dir": str(root), "plan_sha256": sha256_bytes(payload)}


QA_COLUMNS = (
    ColumnSpec("level", "category", {"values": ["beginner", "expert"], "weights": [3, 1]}),
    ColumnSpec("question", "llm-text", {"model": "gen", "system": "You write {level} exams.",
                                        "prompt": "Write one {level} question about {topic}.",
                                        "max_tokens": 6, "temperature": 0.8}),
    ColumnSpec("answer", "llm-structured", {
        "model": "gen", "prompt": "Answer: {question}", "max_tokens": 6,
        "schema": {"type": "object", "required": ["answer"],
                   "properties": {"answer": {"type": "string"},
                                  "steps": {"type": "array", "items": {"type": "string"}}}}}),
    ColumnSpec("grade", "llm-judge", {
        "model": "judge", "prompt": "Question: {question}\nAnswer: {answer.answer}",
        "max_tokens": 6, "scores": [{"name": "correct",
                                     "options": {"1": "correct", "0": "wrong"}}]}),
    ColumnSpec("id", "uuid", {}, drop=True),
    ColumnSpec("label", "expression", {"template": "{level}/{grade.correct.score}/{id}"}),
)


def recipe_plan(columns: Sequence[ColumnSpec] = QA_COLUMNS, records: int = 12,
                seed_data: Optional[SeedDataSpec] = None, **client: Any) -> Plan:
    """A plan running a recipe against two aliases, ``gen`` and ``judge`` (fake servers)."""
    deployments = tuple(DeploymentSpec(
        alias=alias, engine="openai", model="fake-model", served_name="fake-model",
        command=("true",), env={}, gpus_per_replica=0, replicas=1, startup_timeout_s=30.0,
        readiness_path="/health", max_queued_requests=client.pop(f"{alias}_queue", 64))
        for alias in ("gen", "judge"))
    spec = GenerateSpec(**{"max_retries": 2, "request_timeout_s": 30.0, "seed": 7,
                           "columns": tuple(columns), "seed_data": seed_data, **client})
    return replace(local_plan(sys.executable, ["true"], records=records),
                   deployments=deployments, client=spec)


def run_folder(plan: Plan, folder: Path, records: int,
               shards: int) -> Tuple[RunLayout, Tuple[ShardSpec, ...]]:
    """A run directory at ``folder`` for ``plan``'s ``records`` in ``shards`` shards, as
    ``generate --reuse`` reads one (``plan.json`` with those shards, ``run.json``): its
    layout and the shards (each shard's attempt 1 is where its records go)."""
    per = -(-records // shards)
    specs = tuple(ShardSpec(i, first, min(per, records - first))
                  for i, first in enumerate(range(0, records, per)))
    layout = RunLayout(folder)
    folder.mkdir(parents=True)
    layout.plan_json.write_text(plan.replace(shards=specs).to_json())
    layout.run_json.write_text("{}")
    return layout, specs


def stage_batch(root: Path, pyz: Path, plan: Plan) -> Path:
    """``stage`` plus the agent bundle copied in and a local batch script that runs it
    (what the agent and generator benchmarks start); returns the script."""
    from synthbatch.control.slurm.renderer import BatchScript, render_batch_script

    args = stage(root, plan)
    shutil.copyfile(pyz, root / "agent.pyz")
    script = root / "batch.sh"
    script.write_text(render_batch_script(BatchScript(
        job_name="bench", run_dir=str(root), agent_pyz="agent.pyz",
        agent_sha256=sha256_bytes((root / "agent.pyz").read_bytes()),
        plan_sha256=args["plan_sha256"], submission=1, python=sys.executable,
        resources=plan.resources, signal_lead_s=60)))
    return script


# ------------------------------------------------------------ the agent as a process

TESTBED = REPO / "examples" / "profiles" / "testbed.toml"


def server_argv(python: str, *extra: str) -> List[str]:
    """The fake server as a plan's server command (``{host}``/``{port}`` filled by the agent)."""
    return [python, str(FAKE_SERVER), "--host", "{host}", "--port", "{port}",
            "--model", "fake-model", *extra]


def start_allocation(python: str, pyz: Path, args: dict, shard: int = 0) -> subprocess.Popen:
    """The agent's allocation role for ``shard`` of a staged run, as the batch script starts it."""
    argv = [python, "-I", str(pyz), "allocation", "--run-dir", args["run_dir"],
            "--plan-sha256", args["plan_sha256"], "--submission", "1",
            "--agent-pyz", str(pyz), "--shard", str(shard)]
    env = dict(os.environ, SHIV_ROOT=str(Path(args["run_dir"]) / ".shiv"))
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def run_allocation(python: str, pyz: Path, args: dict,
                   timeout: float = 60) -> subprocess.CompletedProcess:
    """Run one allocation of shard 0 to its end (as ``start_allocation``)."""
    proc = start_allocation(python, pyz, args)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def start_local_task(tmp_path: Path, python: str, pyz: Path, args: dict) -> subprocess.Popen:
    """The agent as the local backend's supervisor starts it: its identity variables, its
    control folder, one requeue allowed (the batch script's SYNTHBATCH_MAX_REQUEUES)."""
    folder = tmp_path / "task"
    folder.mkdir()
    raw = str(1 + secrets.randbelow(10**6))  # its port block: parallel tests differ
    env = {localjob.JOB_ID: raw, localjob.ARRAY_JOB_ID: "1", localjob.ARRAY_TASK_ID: "0",
           localjob.RESTART_COUNT: "0", localjob.TASK_DIR: str(folder),
           "SYNTHBATCH_MAX_REQUEUES": "1"}
    argv = [python, "-I", str(pyz), "allocation", "--run-dir", args["run_dir"],
            "--plan-sha256", args["plan_sha256"], "--submission", "1",
            "--agent-pyz", str(pyz)]
    return subprocess.Popen(argv, env=dict(os.environ, SHIV_ROOT=str(tmp_path / ".shiv"),
                                           **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_progress(paths, proc: subprocess.Popen) -> None:  # type: ignore[no-untyped-def]
    """Wait until the attempt at ``paths`` has written two records (``proc`` still alive)."""
    deadline = time.monotonic() + 30
    while (read_json(paths.progress_json) or {}).get("records_done", 0) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, "no client progress"
        time.sleep(0.05)


# ------------------------------------------------------------ the generator in-process


def produce(plan: Plan, endpoints: Dict[str, str], folder: Path, offset: int = 0,
            count: Optional[int] = None) -> Tuple[int, Progress]:
    """Run the generator in-process over ``count`` records from ``offset`` into ``folder``."""
    count = plan.total_records if count is None else count
    folder.mkdir(parents=True, exist_ok=True)
    progress = Progress(folder.parent / f"{folder.name}-progress.json", count)
    written = run_shard(plan, endpoints, Shard(offset, count, Output(folder, offset),
                                               progress, KeptRecords()))
    return written, progress


def records(folder: Path) -> List[Dict[str, Any]]:
    """Every record the generator wrote into ``folder``, in file order."""
    return [json.loads(line) for path in sorted(folder.glob("records-*.jsonl"))
            for line in path.read_text().splitlines()]


def logged(path: Path) -> List[Dict[str, Any]]:
    """The fake server's request log (``--request-log``) as dicts; [] if nothing was logged."""
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
