"""Server steps, readiness probes and proxies of one execution.

Servers start as ``srun`` steps at the sites preflight checked (node, address, port; the
argv comes from :mod:`agent_stdlib.allocation.launch`); readiness is probed until each deployment's
deadline and a server that exits fails the attempt at once with its exit status and the
tail of its log. One loopback proxy per model alias then fronts the replicas, wherever
they run.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..contracts import BackendStatus, DeploymentSpec, Plan
from .errors import AllocationFailure
from .launch import (
    LOOPBACK,
    LaunchError,
    Site,
    server_launch,
)
from .probes import http_ok
from .ranks import RankExit, first_rank_exit
from .reasons import ended, srun_status, step_failure
from .signals import SignalCoordinator
from .steps import current_env, step_env
from .supervisor import Managed, Supervisor, log_text

POLL_S = 0.2
PROXY_START_S = 30.0
HOST = LOOPBACK



RANK_LOG_BYTES = 256 * 1024  # how far back a replica's log is searched for its first rank
SERVER_SETTLE_S = 10.0  # after a client failed: how long a silent server may take to end


def exit_reason(child: Managed, code: int) -> str:
    """Why a child ended, cause first (``reasons.step_failure``): how it ended and its
    log's last error line; for a replica across nodes, the rank that ended first, its
    node, how, and that rank's last lines (``ranks.first_rank_exit``)."""
    if child.ranks > 1:
        first = first_rank_exit(log_text(child.log_path, RANK_LOG_BYTES))
        if first is not None:
            return rank_reason(child, first, code)
    return step_failure(f"{child.name} {ended(code, srun=child.step is not None)}",
                        child.log_path)


def rank_reason(child: Managed, first: RankExit, code: Optional[int] = None) -> str:
    """A replica across nodes ended by its rank ``first``: that rank, its node, how, its
    last error line, then the step's ``srun`` status (``code``, once it has ended) and
    where to look."""
    head = (f"{child.name} ({child.ranks} nodes) ended: rank {first.rank} on {first.node}: "
            f"{first.what}" + (f": {first.cause}" if first.cause else ""))
    status = "" if code is None else f"{srun_status(code)}; "
    return (f"{head} ({status}log {child.log_path}, rank {first.rank}: "
            f"{first.tail or 'no output'})")


def fail_on_exit(children: Iterable[Managed]) -> None:
    """Raise AllocationFailure naming the first child that has exited (status + log tail)."""
    for child in children:
        code = child.exit_code()
        if code is not None:
            raise AllocationFailure(exit_reason(child, code))


@dataclass
class Services:
    """The servers and proxies of one execution."""

    plan: Plan
    supervisor: Supervisor
    signals: SignalCoordinator
    logs: Path
    agent_pyz: Path
    servers: Dict[str, List[Managed]] = field(default_factory=dict)
    urls: Dict[str, List[str]] = field(default_factory=dict)
    sites: Dict[str, List[Site]] = field(default_factory=dict)
    endpoints: Dict[str, str] = field(default_factory=dict)
    started: Dict[str, int] = field(default_factory=dict)  # step name -> starts so far

    def all_servers(self) -> List[Managed]:
        """Every server child, in start order."""
        return [c for group in self.servers.values() for c in group]

    def start_servers(self, sites: Mapping[str, Sequence[Site]]) -> None:
        """Start every replica of every deployment as its own step at its site."""
        for dep in self.plan.deployments:
            for replica, site in enumerate(sites[dep.alias]):
                self._start_server(dep, replica, site)

    def _start_server(self, dep: DeploymentSpec, replica: int, site: Site) -> None:
        self.servers.setdefault(dep.alias, []).append(self._launch(dep, replica, site))
        self.urls.setdefault(dep.alias, []).append(site.url)
        self.sites.setdefault(dep.alias, []).append(site)

    def _launch(self, dep: DeploymentSpec, replica: int, site: Site) -> Managed:
        try:
            launch = server_launch(self.plan, dep, replica, site,
                                   os.path.abspath(self.agent_pyz), current_env())
        except LaunchError as err:
            raise AllocationFailure(str(err)) from err
        starts = self.started.get(launch.name, 0)
        self.started[launch.name] = starts + 1
        log = self.logs / (f"{launch.name}.log" if not starts else
                           f"{launch.name}.restart-{starts}.log")
        child = self.supervisor.start(launch.name, launch.argv, launch.env, log,
                                      step=self.plan.runtime.launcher == "srun")
        child.ranks = dep.nodes_per_replica
        return child

    def ended_servers(self) -> List[Tuple[str, int]]:
        """``(alias, replica)`` of every server step that has exited."""
        return [(alias, replica) for alias, group in self.servers.items()
                for replica, child in enumerate(group) if child.exit_code() is not None]

    def restart_server(self, alias: str, replica: int) -> None:
        """Start replica ``replica`` of ``alias`` again at its site (the old step stopped
        first; its log is kept, the new one is ``NAME.restart-K.log``) and wait until it
        answers its readiness probe again; AllocationFailure when it does not (as at
        start-up: a restart does not cure a server that cannot start)."""
        dep = self.plan.deployment(alias)
        old = self.servers[alias][replica]
        self.supervisor.stop_one(old, self.plan.runtime.grace_s)
        self.servers[alias][replica] = self._launch(dep, replica, self.sites[alias][replica])
        self._wait_ready(dep, [replica])

    def wait_ready(self) -> None:
        """Probe every replica until ready; fail at a deadline or on any server exit."""
        for dep in self.plan.deployments:
            self._wait_ready(dep)

    def _wait_ready(self, dep: DeploymentSpec, replicas: Optional[List[int]] = None) -> None:
        deadline = time.monotonic() + dep.startup_timeout_s
        waiting = [(c, u) for i, (c, u) in enumerate(zip(self.servers[dep.alias],
                                                         self.urls[dep.alias]))
                   if replicas is None or i in replicas]
        while waiting:
            self.signals.check()
            fail_on_exit(self.all_servers())
            waiting = [(c, u) for c, u in waiting if not http_ok(u + dep.readiness_path, 1.0)]
            if waiting and time.monotonic() > deadline:
                child = waiting[0][0]
                raise AllocationFailure(step_failure(
                    f"deployment {dep.alias}: not ready after {dep.startup_timeout_s:g}s",
                    child.log_path))
            if waiting:
                time.sleep(POLL_S)

    def ended_server(self, settle_s: float = SERVER_SETTLE_S) -> Optional[str]:
        """The reason of a server that has ended (a step that exited, or a replica whose
        rank's end its log already tells), or None. While a server does not answer its
        readiness probe, waits up to ``settle_s`` for its end to show (``srun`` takes a
        moment to end a step whose rank died); when every server answers, None at once."""
        deadline = time.monotonic() + settle_s
        while True:
            for child in self.all_servers():
                code = child.exit_code()
                if code is not None:
                    return exit_reason(child, code)
                first = first_rank_exit(log_text(child.log_path, RANK_LOG_BYTES)) \
                    if child.ranks > 1 else None
                if first is not None:
                    return rank_reason(child, first)
            if self._all_answer() or time.monotonic() > deadline:
                return None
            self.signals.check()
            time.sleep(POLL_S)

    def _all_answer(self) -> bool:
        return all(http_ok(url + dep.readiness_path, 1.0) for dep in self.plan.deployments
                   for url in self.urls.get(dep.alias, ()))

    def backends(self) -> Dict[str, tuple]:
        """Readiness's per-alias backend list."""
        return {alias: tuple(BackendStatus(url=u, ready=True) for u in urls)
                for alias, urls in self.urls.items()}

    def start_proxies(self) -> None:
        """One loopback proxy per model alias; fills ``endpoints``."""
        for dep in self.plan.deployments:
            self.endpoints[dep.alias] = self._start_proxy(dep)

    def _start_proxy(self, dep: DeploymentSpec) -> str:
        port_file = self.logs / f"proxy-{dep.alias}.port"
        argv = [sys.executable, "-I", str(self.agent_pyz), "proxy", "--listen", f"{HOST}:0",
                "--port-file", str(port_file), "--max-queued", str(dep.max_queued_requests)]
        for url in self.urls[dep.alias]:
            argv += ["--backend", url]
        env = step_env(self.plan.runtime, current_env(), {})
        child = self.supervisor.start(f"proxy-{dep.alias}", argv, env,
                                      self.logs / f"proxy-{dep.alias}.log")
        deadline = time.monotonic() + PROXY_START_S
        while not port_file.exists():
            self.signals.check()
            fail_on_exit([child, *self.all_servers()])
            if time.monotonic() > deadline:
                raise AllocationFailure(step_failure(f"proxy for {dep.alias} did not start",
                                                     child.log_path))
            time.sleep(0.05)
        return f"http://{HOST}:{int(port_file.read_text().strip())}"
