"""The allocation controller: one shard attempt from plan to terminal record.

Lifecycle (each step publishes state before the next starts)::

    verify plan -> identity -> attempt running + readiness starting|restarting
    -> preflight -> server steps -> readiness probes -> proxies -> readiness ready
    -> client step -> result.json -> cleanup -> readiness stopped
    -> attempt succeeded -> winner.json

Every exit path (failure, signal, time limit, requeue) goes through ``_finish``, the one
owner of cleanup. SIGUSR1 stops generation gracefully, keeps partial output and requeues
the job while ``--max-requeues`` allows; SIGTERM from a requeue leaves the attempt
``running`` for the next execution; SIGTERM at a time limit fails it; any other SIGTERM
cancels it. A cancellation or a time limit is recorded once the client has saved (within
the 2 s urgent grace) and before the servers are stopped: Slurm SIGKILLs the job
``KillWait`` after that SIGTERM, which stopping several servers can outlast. The scheduler
is Slurm (``srun`` launcher) or the local backend's supervisor (``local`` launcher,
``agent_stdlib/localjob.py``); ``slurmjob`` answers for both.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .. import states
from ..attempts import advance_attempt, load_attempt, publish_readiness
from ..candidate import CandidateError, count_records
from ..contracts import RESTART_CLIENT, AttemptRecord, ResultManifest, restarts_text
from ..errors import AgentError
from ..layout import AttemptLayout
from ..publish import complete_winner, publish_result
from ..statefile import ensure_dir
from . import slurmjob
from .errors import AllocationFailure, PreflightError
from .invocation import (
    Invocation,
    invocation,
    parse_args,
)
from .launch import ClientPaths, Site, client_launch
from .preflight import Context, check_identity, run_preflight
from .reasons import ended, log_cause, step_failure
from .restarts import Budget, Failure, Verdict, classify, server_key, server_of
from .serving import Services, exit_reason
from .signals import Interrupted, SignalCoordinator
from .slurmjob import JobIdentity
from .steps import current_env, step_control
from .supervisor import URGENT_GRACE_S, Managed, Supervisor
from .telemetry import Telemetry, from_env

POLL_S = 0.2
SIGNAL_SETTLE_S = 1.0  # before a restart: a signal to the whole job reaches the agent too


@dataclass(frozen=True)
class Outcome:
    """How an execution ends: a terminal attempt state, or None to stay ``running``."""

    state: Optional[str]
    reason: Optional[str] = None
    requeue: bool = False  # the agent asks Slurm to requeue the job after cleanup
    # recorded before cleanup: Slurm SIGKILLs the whole job KillWait after this SIGTERM
    # (30 s by default, often less), which a graceful stop can outlast
    record_first: bool = False


@dataclass
class Allocation:
    """One execution of one attempt inside one allocation."""

    inv: Invocation
    signals: SignalCoordinator
    ident: Optional[JobIdentity] = None  # default: from the environment, per launcher
    supervisor: Supervisor = field(init=False)
    services: Optional[Services] = None
    client: Optional[Managed] = None
    execution: int = 0
    sites: Dict[str, List[Site]] = field(default_factory=dict)
    manifest: Optional[ResultManifest] = None
    telemetry: Optional[Telemetry] = None  # serving samples and boot/shutdown times
    budget: Budget = field(init=False)

    def __post_init__(self) -> None:
        self.supervisor = Supervisor(self.signals, step_control(self.inv.plan.runtime))
        self.budget = Budget(self.inv.plan.restarts_in_allocation)
        if self.ident is None:
            self.ident = slurmjob.current_identity(self.inv.plan.runtime.launcher)

    @property
    def job(self) -> JobIdentity:
        """Who the scheduler says this allocation is."""
        assert self.ident is not None  # set in __post_init__
        return self.ident

    @property
    def paths(self) -> AttemptLayout:
        """This attempt's directory layout."""
        return self.inv.layout.attempt(self.inv.shard, self.inv.attempt)

    @property
    def logs(self) -> Path:
        """This execution's log folder."""
        return self.paths.execution_logs(self.execution)

    @property
    def srun(self) -> bool:
        """True when steps run through Slurm."""
        return self.inv.plan.runtime.launcher == "srun"

    def readiness(self, state: str, **fields: object) -> None:
        """Publish the next readiness revision (with the restarts so far, if any)."""
        if self.budget.counts:
            fields.setdefault("restarts", dict(self.budget.counts))
        publish_readiness(self.paths.readiness_json, self.inv.shard, self.inv.attempt,
                          self.execution, state, **fields)

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> int:
        """Run the attempt to a terminal state (or a requeue); return the exit status."""
        try:
            # no record yet: a first attempt, as its submission record implies it
            record = load_attempt(self.paths.attempt_json) or self.inv.first
            if record is None:
                raise AllocationFailure(f"{self.paths.attempt_json}: attempt record is missing")
            if record is self.inv.first and record.state == states.CREATED:
                raise AllocationFailure(f"submission {record.submission} has no job id "
                                        "recorded yet (its submit has not got that far)")
            if record.state == states.SUCCEEDED:
                complete_winner(self.inv.layout, self.inv.shard, self.inv.attempt)
                return _say(f"attempt {self.inv.attempt} had succeeded; winner completed", 0)
            if record.state in states.TERMINAL:
                return _say(f"attempt {self.inv.attempt} is already {record.state}", 1)
            if self.srun or self.job.job_id:  # Slurm, or the local backend's supervisor
                check_identity(self._context(record))
        except AgentError as err:
            return _say(f"refusing to run: {err}", 2)
        return self._finish(self._attempt(record))

    def _attempt(self, record: AttemptRecord) -> Outcome:
        try:
            record = self._begin(record)
            self.sites = run_preflight(self._context(record))
            self._serve()
            self._generate()
            shard = self.inv.plan.shard(self.inv.shard)
            self.manifest = publish_result(self.paths.output, self.paths.result_json,
                                           shard.index, self.inv.attempt, shard.num_records)
            return Outcome(states.SUCCEEDED)
        except Interrupted as err:
            return self._interrupted(err)
        except PreflightError as err:
            return Outcome(states.FAILED, f"preflight: {err}")
        except AgentError as err:
            return Outcome(states.FAILED, str(err))
        except Exception as err:  # noqa: BLE001 - any bug still ends in a terminal record
            return Outcome(states.FAILED, f"internal error: {type(err).__name__}: {err}")

    def _context(self, record: AttemptRecord) -> Context:
        return Context(plan=self.inv.plan, shard=self.inv.shard, attempt=record,
                       ident=self.job, env=current_env(), plan_json=self.inv.layout.plan_json,
                       agent_pyz=self.inv.agent_pyz,
                       writable=[self.inv.layout.shard_dir(self.inv.shard), self.paths.root,
                                 self.paths.output, self.logs],
                       array_task=self.inv.array_task,
                       hash_cache=self.inv.layout.image_hashes)

    def _begin(self, record: AttemptRecord) -> AttemptRecord:
        restarts = max(self.job.restart_count, record.restarts)
        restarting = restarts > 0 or record.state == states.RUNNING
        record = advance_attempt(self.paths.attempt_json, states.RUNNING,
                                 first=record if record is self.inv.first else None,
                                 job_id=record.job_id or self.job.key,
                                 node=self.job.node, restarts=restarts)
        ensure_dir(self.paths.output)
        self.execution = self._new_execution(restarts + 1)
        self.telemetry = from_env(self.paths.telemetry_json)
        self.telemetry.write()
        self.services = Services(self.inv.plan, self.supervisor, self.signals, self.logs,
                                 self.inv.agent_pyz)
        self.readiness(states.READY_RESTARTING if restarting else states.READY_STARTING)
        return record

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
        services = self._services
        services.start_servers(self.sites)
        services.wait_ready()
        if self.telemetry is not None:
            self.telemetry.mark("ready_at")
        services.start_proxies()
        if self.telemetry is not None:
            self.telemetry.start(services.urls, services.endpoints)
        self.readiness(states.READY, endpoints=dict(services.endpoints),
                       backends=services.backends())

    @property
    def _services(self) -> Services:
        if self.services is None:
            raise AllocationFailure("internal error: services used before the execution began")
        return self.services

    def _generate(self) -> None:
        """Run the client to its end; restart what failed while a restart can cure it and
        the run's bound allows (``restarts.classify``), else fail with the reason."""
        while True:
            ended = self._run_client()
            if ended is None:
                return
            failure, reason = ended
            verdict = classify(failure)
            if not verdict.curable or not self.budget.allows():
                if self.budget.used:
                    reason += (f"; after {self.budget.used} restart(s) in the allocation "
                               f"({restarts_text(self.budget.counts)})")
                raise AllocationFailure(reason)
            self._restart(verdict, reason)

    def _restart(self, verdict: Verdict, reason: str) -> None:
        """Restart the servers that ended (each ready again) and the client, visibly: a
        readiness revision, a line in the agent's log, the counters in readiness."""
        # a client ended by a signal may have got it before the agent did (scancel, a
        # time limit): a moment for the agent's own to arrive, which ends this instead
        time.sleep(SIGNAL_SETTLE_S)
        self.signals.check()
        self.budget.spend(verdict.restart)
        what = ", ".join(verdict.restart)
        _say(f"shard {self.inv.shard} attempt {self.inv.attempt}: restarting {what} "
             f"(restart {self.budget.used} of {self.budget.bound} in this allocation): "
             f"{verdict.why}: {reason}", 0)
        endpoints = dict(self._services.endpoints)
        self.readiness(states.READY_RESTARTING, endpoints=endpoints,
                       reason=f"restarting {what}: {verdict.why}")
        if self.client is not None:
            self._stop_client_gracefully()  # it saves what it has (SIGUSR1)
            self.supervisor.stop_one(self.client, self.inv.plan.runtime.grace_s)
        for key in verdict.restart:
            server = server_of(key)
            if server is not None:
                self._services.restart_server(*server)
        self.readiness(states.READY, endpoints=endpoints, backends=self._services.backends())

    def _run_client(self) -> Optional[Tuple[Failure, str]]:
        """Run the client once: None when it succeeded, else what failed and the reason."""
        shard = self.inv.plan.shard(self.inv.shard)
        record = load_attempt(self.paths.attempt_json)
        source = record.resume_from if record is not None else None
        resume = str(self.inv.layout.attempt(shard.index, source).output) if source else ""
        paths = ClientPaths(agent_pyz=str(self.inv.agent_pyz), resume=resume,
                            plan_json=str(self.inv.layout.plan_json),
                            output=str(self.paths.output),
                            progress_json=str(self.paths.progress_json), shard=shard.index,
                            record_offset=shard.record_offset, num_records=shard.num_records)
        launch = client_launch(self.inv.plan, paths, self._services.endpoints, current_env())
        restarts = self.budget.counts.get(RESTART_CLIENT, 0)
        log = self.logs / ("client.log" if not restarts else f"client.restart-{restarts}.log")
        client = self.supervisor.start("client", launch.argv, launch.env, log, step=self.srun)
        self.client = client
        services = self._services
        while client.exit_code() is None:
            self.signals.check()
            if services.ended_servers():  # the client is stopped before any restart
                return self._server_ended(None, None, "")
            time.sleep(POLL_S)
        code = client.exit_code() or 0  # it has exited: the loop above waited
        if code == 0:
            return None
        self.signals.check()  # a signal that also reached the client is the cause
        how = f"client {ended(code, srun=self.srun)}"
        server = services.ended_server()  # a server that died first is the cause
        if server is not None:
            return self._server_ended(code, server, f"; then the {how}")
        return (Failure(code, client_cause=log_cause(client.log_path)),
                step_failure(how, client.log_path))

    def _server_ended(self, code: Optional[int], reason: Optional[str],
                      then: str) -> Tuple[Failure, str]:
        """A server ended (``reason``: why, when already known) while or before the client
        ``code`` ended (None: it still runs): the failure and its reason, server first."""
        gone = self._services.ended_servers()
        if not gone:  # it no longer answers, and its step has not ended: nothing to restart
            return Failure(code, unrestartable=True), f"{reason}{then}"
        alias, replica = gone[0]
        child = self._services.servers[alias][replica]
        return (Failure(code, tuple(server_key(a, r) for a, r in gone)),
                f"{reason or exit_reason(child, child.exit_code() or 0)}{then}")

    # ------------------------------------------------------------------ signals

    def _interrupted(self, err: Interrupted) -> Outcome:
        if not err.soft:
            return self._terminated(err)
        self._stop_client_gracefully()
        if self.job.job_id and self.job.restart_count < self.inv.max_requeues:
            return Outcome(None, f"{err}: requeued (restart {self.job.restart_count + 1} "
                                 f"of {self.inv.max_requeues})", requeue=True)
        return Outcome(states.FAILED, f"{err} (time limit or preemption soon): "
                                      "stopped early, no requeue left")

    def _terminated(self, err: Interrupted) -> Outcome:
        cause = slurmjob.termination_cause(self.job)
        if cause == slurmjob.REQUEUED:
            return Outcome(None, f"{err}: requeued by the scheduler")
        if cause == slurmjob.TIME_LIMIT:
            return Outcome(states.FAILED, f"{err}: time limit reached", record_first=True)
        return Outcome(states.CANCELLED, str(err), record_first=True)

    def _stop_client_gracefully(self) -> None:
        """Ask the client to stop and save its records (SIGUSR1), bounded by the grace."""
        client = self.client
        if client is None or client.exit_code() is not None:
            return
        self.supervisor.interrupt(client, signal.SIGUSR1)
        self._wait_client(self.inv.plan.runtime.grace_s)

    def _wait_client(self, budget_s: float, past_urgent: bool = False) -> None:
        """Wait up to ``budget_s`` for the client to exit (an urgent signal ends the wait
        unless ``past_urgent``: the wait is already bounded by the urgent grace)."""
        client = self.client
        deadline = time.monotonic() + budget_s
        while client is not None and client.exit_code() is None \
                and time.monotonic() < deadline and (past_urgent or not self.signals.urgent):
            time.sleep(0.05)

    # ------------------------------------------------------------------ the one exit path

    def _finish(self, outcome: Outcome) -> int:
        self.signals.defer()
        if not (outcome.record_first and outcome.state is not None):
            if self.execution:
                self._cleanup(outcome.reason)
            return self._record(outcome)
        # the client saves what it has (SIGUSR1: srun forwards it; SIGTERM to srun would
        # kill the tasks), within the urgent grace; then the record; then the rest stops
        if self.client is not None and self.client.exit_code() is None:
            self.supervisor.interrupt(self.client, signal.SIGUSR1)
            self._wait_client(min(self.inv.plan.runtime.grace_s, URGENT_GRACE_S),
                              past_urgent=True)
        status = self._record(outcome)
        if self.execution:
            self._cleanup(outcome.reason)
        return status

    def _record(self, outcome: Outcome) -> int:
        """Write the attempt's outcome (and winner); return the agent's exit status."""
        partial = self._partial() if outcome.state != states.SUCCEEDED else None
        if partial and outcome.reason:
            total = self.inv.plan.shard(self.inv.shard).num_records
            outcome = Outcome(outcome.state, f"{outcome.reason}; {partial} of {total} records "
                                             "kept as partial", outcome.requeue)
        try:
            if outcome.state is None:
                return self._leave_running(outcome, partial)
            advance_attempt(self.paths.attempt_json, outcome.state, reason=outcome.reason,
                            partial_records=partial)
            if outcome.state == states.SUCCEEDED:
                complete_winner(self.inv.layout, self.inv.shard, self.inv.attempt,
                                self.manifest)
        except AgentError as err:
            return _say(f"cannot record {outcome.state}: {err}", 1)
        if outcome.reason:
            _say(f"shard {self.inv.shard} attempt {self.inv.attempt} {outcome.state}: "
                 f"{outcome.reason}", 0)
        return 0 if outcome.state == states.SUCCEEDED else 1

    def _cleanup(self, reason: Optional[str]) -> None:
        """Stop everything (idempotent), confirm it is gone, then publish ``stopped``."""
        endpoints = dict(self.services.endpoints) if self.services else {}
        self.readiness(states.READY_STOPPING, endpoints=endpoints, reason=reason)
        if self.telemetry is not None:
            self.telemetry.stop()
            self.telemetry.mark("stopping_at")
        stopped = self.supervisor.stop_all(self.inv.plan.runtime.grace_s)
        if self.telemetry is not None:
            self.telemetry.mark("stopped_at")
        if stopped:
            self.readiness(states.READY_STOPPED, reason=reason)
        else:
            what = self.supervisor.unconfirmed or "a managed process or step survived SIGKILL"
            self.readiness(states.READY_FAILED,
                           reason=f"cleanup: {what} ({reason or 'after success'})")

    def _partial(self) -> Optional[int]:
        try:
            count = count_records(self.paths.output)
        except (CandidateError, OSError):
            return None
        return count or None

    def _leave_running(self, outcome: Outcome, partial: Optional[int]) -> int:
        """Keep the attempt ``running`` for the next execution of this job."""
        advance_attempt(self.paths.attempt_json, states.RUNNING, reason=outcome.reason,
                        partial_records=partial)
        if outcome.requeue and not slurmjob.requeue(self.job):
            advance_attempt(self.paths.attempt_json, states.FAILED,
                            reason=f"{outcome.reason}; but the requeue was refused",
                            partial_records=partial)
            return 1
        return _say(f"shard {self.inv.shard} attempt {self.inv.attempt}: {outcome.reason}", 0)


def _say(message: str, status: int) -> int:
    print(f"agent: {message}", file=sys.stderr, flush=True)
    return status


def main(argv: List[str]) -> int:
    """``python agent.pyz allocation ...``: run one shard attempt inside an allocation."""
    coordinator = SignalCoordinator()
    coordinator.install()
    args = parse_args(argv)
    try:
        inv = invocation(args, os.environ)
    except (AgentError, ValueError) as err:
        return _say(str(err), 2)
    return Allocation(inv=inv, signals=coordinator).run()
