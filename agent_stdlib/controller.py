"""The allocation controller: one shard attempt from plan to terminal record.

Lifecycle (each step publishes state before the next starts):
verify plan -> attempt ``running`` -> readiness ``starting`` -> server steps -> readiness
probes -> one proxy per model alias -> readiness ``ready`` -> client step -> candidate
validation -> result + winner -> cleanup (one owner, idempotent) -> readiness ``stopped``
-> terminal attempt.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from agent_stdlib import states
from agent_stdlib.attempts import advance_attempt, load_attempt, publish_readiness
from agent_stdlib.candidate import CandidateError, build_manifest
from agent_stdlib.contracts import (
    SCHEMA_VERSION,
    BackendStatus,
    ContractError,
    DeploymentSpec,
    Plan,
    SubmissionRecord,
    WinnerRecord,
    sha256_bytes,
)
from agent_stdlib.layout import AttemptLayout, RunLayout
from agent_stdlib.probes import free_port, http_ok
from agent_stdlib.signals import Interrupted, SignalCoordinator
from agent_stdlib.statefile import (
    StateError,
    ensure_dir,
    publish_immutable,
    read_bytes,
    read_json,
)
from agent_stdlib.steps import current_env, step_argv, step_env
from agent_stdlib.supervisor import Managed, Supervisor, tail

POLL_S = 0.2


class AllocationFailure(Exception):
    """The attempt failed for a reason worth one line in its record."""


@dataclass(frozen=True)
class Invocation:
    """What the batch script told the agent."""

    layout: RunLayout
    plan: Plan
    shard: int
    attempt: int
    agent_pyz: Path


def load_verified_plan(path: Path, expected_sha256: str) -> Plan:
    """Read the plan, check its sha256 and schema, and return it."""
    raw = read_bytes(path)
    if raw is None:
        raise AllocationFailure(f"{path}: plan is missing")
    digest = sha256_bytes(raw)
    if digest != expected_sha256:
        raise AllocationFailure(f"{path}: sha256 {digest} does not match {expected_sha256}")
    data = read_json(path) or {}
    if data.get("schema_version") != SCHEMA_VERSION:
        raise AllocationFailure(f"{path}: unknown plan schema_version "
                                f"{data.get('schema_version')!r}")
    return Plan.from_dict(data)


def scheduler_job_id() -> Optional[str]:
    """This allocation's job id as squeue names it (``12_3`` for array tasks)."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")


def fill_placeholders(argv: List[str], host: str, port: int) -> List[str]:
    """Replace ``{host}`` and ``{port}`` in a server argv (the planner did the rest)."""
    return [a.replace("{host}", host).replace("{port}", str(port)) for a in argv]


@dataclass
class Allocation:
    """One execution of one attempt inside one allocation."""

    inv: Invocation
    signals: SignalCoordinator
    supervisor: Supervisor = field(default_factory=Supervisor)
    execution: int = 0
    servers: Dict[str, List[Managed]] = field(default_factory=dict)
    backend_urls: Dict[str, List[str]] = field(default_factory=dict)
    endpoints: Dict[str, str] = field(default_factory=dict)

    @property
    def paths(self) -> AttemptLayout:
        """This attempt's directory layout."""
        return self.inv.layout.attempt(self.inv.shard, self.inv.attempt)

    @property
    def logs(self) -> Path:
        """This execution's log folder."""
        return self.paths.execution_logs(self.execution)

    def readiness(self, state: str, **fields: object) -> None:
        """Publish the next readiness revision."""
        publish_readiness(self.paths.readiness_json, self.inv.shard, self.inv.attempt,
                          self.execution, state, **fields)

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> int:
        """Run the attempt to a terminal state; return the process exit status."""
        outcome, reason = states.FAILED, None
        try:
            self._begin()
            self._serve()
            self._run_client()
            self._publish_result()
            outcome = states.SUCCEEDED
        except Interrupted as err:
            outcome, reason = states.CANCELLED, str(err)
        except (AllocationFailure, CandidateError, StateError, ContractError) as err:
            reason = str(err)
        except Exception as err:  # noqa: BLE001 - any bug still ends in a terminal record
            reason = f"internal error: {type(err).__name__}: {err}"
        return self._finish(outcome, reason)

    def _begin(self) -> None:
        record = load_attempt(self.paths.attempt_json)
        if record is None:
            raise AllocationFailure(f"{self.paths.attempt_json}: attempt record is missing")
        if record.state in states.TERMINAL:
            raise AllocationFailure(f"attempt {self.inv.attempt} is already {record.state}")
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        advance_attempt(self.paths.attempt_json, states.RUNNING,
                        job_id=record.job_id or scheduler_job_id(),
                        node=os.environ.get("SLURMD_NODENAME"), restarts=restarts)
        ensure_dir(self.paths.output)
        self.execution = self._new_execution(restarts + 1)
        self.readiness("restarting" if restarts else "starting")

    def _new_execution(self, first: int) -> int:
        ensure_dir(self.paths.logs)
        number = first
        while True:
            try:
                self.paths.execution_logs(number).mkdir(mode=0o700)
                return number
            except FileExistsError:
                number += 1

    def _serve(self) -> None:
        for dep in self.inv.plan.deployments:
            for replica in range(dep.replicas):
                self._start_server(dep, replica)
        for dep in self.inv.plan.deployments:
            self._wait_ready(dep)
        for dep in self.inv.plan.deployments:
            self.endpoints[dep.alias] = self._start_proxy(dep)
        backends = {alias: tuple(BackendStatus(url=u, ready=True) for u in urls)
                    for alias, urls in self.backend_urls.items()}
        self.readiness("ready", endpoints=dict(self.endpoints), backends=backends)

    def _start_server(self, dep: DeploymentSpec, replica: int) -> None:
        host, port = "127.0.0.1", free_port()
        argv = fill_placeholders(list(dep.command), host, port)
        plan = self.inv.plan
        name = f"server-{dep.alias}-{replica}"
        wrapped = step_argv(plan.runtime, plan.resources, name, argv, dep.gpus_per_replica)
        env = step_env(plan.runtime, current_env(), dep.env)
        child = self.supervisor.start(name, wrapped, env, self.logs / f"{name}.log")
        self.servers.setdefault(dep.alias, []).append(child)
        self.backend_urls.setdefault(dep.alias, []).append(f"http://{host}:{port}")

    def _wait_ready(self, dep: DeploymentSpec) -> None:
        deadline = time.monotonic() + dep.startup_timeout_s
        waiting = list(zip(self.servers[dep.alias], self.backend_urls[dep.alias]))
        while waiting:
            self.signals.check()
            self._fail_on_exit(child for child, _ in waiting)
            waiting = [(c, u) for c, u in waiting if not http_ok(u + dep.readiness_path, 1.0)]
            if waiting and time.monotonic() > deadline:
                raise AllocationFailure(
                    f"deployment {dep.alias}: not ready after {dep.startup_timeout_s:g}s "
                    f"(log {waiting[0][0].log_path})")
            if waiting:
                time.sleep(POLL_S)

    def _fail_on_exit(self, children: Iterable[Managed]) -> None:
        for child in children:
            code = child.exit_code()
            if code is not None:
                raise AllocationFailure(
                    f"{child.name} exited with status {code} "
                    f"(log {child.log_path}: {tail(child.log_path)})")

    def _start_proxy(self, dep: DeploymentSpec) -> str:
        port_file = self.logs / f"proxy-{dep.alias}.port"
        argv = [sys.executable, "-I", str(self.inv.agent_pyz), "proxy", "--listen", "127.0.0.1:0",
                "--port-file", str(port_file),
                "--max-queued", str(dep.max_queued_requests)]
        for url in self.backend_urls[dep.alias]:
            argv += ["--backend", url]
        env = step_env(self.inv.plan.runtime, current_env(), {})
        child = self.supervisor.start(f"proxy-{dep.alias}", argv, env,
                                      self.logs / f"proxy-{dep.alias}.log")
        deadline = time.monotonic() + 30.0
        while not port_file.exists():
            self.signals.check()
            self._fail_on_exit([child])
            if time.monotonic() > deadline:
                raise AllocationFailure(f"proxy for {dep.alias} did not start "
                                        f"(log {child.log_path})")
            time.sleep(0.05)
        return f"http://127.0.0.1:{int(port_file.read_text().strip())}"

    def _client_env(self) -> Dict[str, str]:
        shard = self.inv.plan.shard(self.inv.shard)
        extra = {
            "SYNTHBATCH_ENDPOINTS": json.dumps(self.endpoints, sort_keys=True),
            "SYNTHBATCH_SHARD_INDEX": str(shard.index),
            "SYNTHBATCH_SHARD_COUNT": str(len(self.inv.plan.shards)),
            "SYNTHBATCH_RECORD_OFFSET": str(shard.record_offset),
            "SYNTHBATCH_NUM_RECORDS": str(shard.num_records),
            "SYNTHBATCH_OUTPUT_DIR": str(self.paths.output),
            "SYNTHBATCH_PROGRESS_FILE": str(self.paths.progress_json),
        }
        if len(self.endpoints) == 1:
            extra["SYNTHBATCH_OPENAI_BASE_URL"] = next(iter(self.endpoints.values())) + "/v1"
        return step_env(self.inv.plan.runtime, current_env(), extra)

    def _run_client(self) -> None:
        plan = self.inv.plan
        argv = [plan.runtime.python, "-I", str(self.inv.agent_pyz), "generate",
                "--plan", str(self.inv.layout.plan_json)]
        wrapped = step_argv(plan.runtime, plan.resources, "client", argv, 0)
        client = self.supervisor.start("client", wrapped, self._client_env(),
                                       self.logs / "client.log")
        servers = [c for group in self.servers.values() for c in group]
        while client.exit_code() is None:
            self.signals.check()
            self._fail_on_exit(servers)
            time.sleep(POLL_S)
        if client.exit_code() != 0:
            raise AllocationFailure(f"client exited with status {client.exit_code()} "
                                    f"(log {client.log_path}: {tail(client.log_path)})")

    def _publish_result(self) -> None:
        shard = self.inv.plan.shard(self.inv.shard)
        manifest = build_manifest(self.paths.output, shard.index, self.inv.attempt,
                                  shard.num_records)
        payload = manifest.to_json().encode("utf-8")
        if not publish_immutable(self.paths.result_json, payload):
            payload = read_bytes(self.paths.result_json) or b""
        winner = WinnerRecord(shard=shard.index, attempt=self.inv.attempt,
                              records=manifest.records, result_sha256=sha256_bytes(payload),
                              files=manifest.files, created_at=time.time())
        publish_immutable(self.inv.layout.winner_json(shard.index),
                          winner.to_json().encode("utf-8"))

    def _finish(self, outcome: str, reason: Optional[str]) -> int:
        self.signals.defer()
        if self.execution:
            self._cleanup(reason if outcome != states.SUCCEEDED else None)
        try:
            advance_attempt(self.paths.attempt_json, outcome, reason=reason)
        except (StateError, states.TransitionError) as err:
            print(f"agent: cannot record {outcome}: {err}", file=sys.stderr)
            return 1
        if reason:
            print(f"agent: shard {self.inv.shard} attempt {self.inv.attempt} {outcome}: "
                  f"{reason}", file=sys.stderr)
        return 0 if outcome == states.SUCCEEDED else 1

    def _cleanup(self, reason: Optional[str]) -> None:
        self.readiness("stopping", endpoints=dict(self.endpoints))
        self.supervisor.stop_all(self.inv.plan.runtime.grace_s)
        if not self.supervisor.all_gone():
            reason = reason or "cleanup: a managed process group survived SIGKILL"
        self.readiness("failed" if reason else "stopped", reason=reason)


def _parse(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="agent allocation")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--plan-sha256", required=True)
    parser.add_argument("--submission", required=True, type=int)
    parser.add_argument("--agent-pyz", required=True, type=Path)
    parser.add_argument("--shard", type=int, default=None,
                        help="shard index (default: SLURM_ARRAY_TASK_ID)")
    return parser.parse_args(argv)


def _invocation(args: argparse.Namespace) -> Invocation:
    layout = RunLayout(args.run_dir)
    plan = load_verified_plan(layout.plan_json, args.plan_sha256)
    shard = args.shard
    if shard is None:
        shard = int(os.environ.get("SLURM_ARRAY_TASK_ID", "-1"))
    plan.shard(shard)
    data = read_json(layout.submission_json(args.submission))
    if data is None:
        raise AllocationFailure(f"{layout.submission_json(args.submission)}: missing")
    submission = SubmissionRecord.from_dict(data)
    if str(shard) not in submission.attempts:
        raise AllocationFailure(f"submission {args.submission} carries no shard {shard}")
    return Invocation(layout=layout, plan=plan, shard=shard,
                      attempt=submission.attempts[str(shard)], agent_pyz=args.agent_pyz)


def main(argv: List[str]) -> int:
    """``python agent.pyz allocation ...``: run one shard attempt inside an allocation."""
    args = _parse(argv)
    coordinator = SignalCoordinator()
    coordinator.install()
    try:
        inv = _invocation(args)
    except (AllocationFailure, ContractError, StateError, ValueError) as err:
        print(f"agent: {err}", file=sys.stderr)
        return 2
    return Allocation(inv=inv, signals=coordinator).run()
