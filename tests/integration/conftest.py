"""Fixtures for integration tests against the local Slurm testbed (scripts/slurm-testbed).

The testbed is never started from here: start it first (CI does so in .ci/run)::

    eval "$(scripts/slurm-testbed up)"
    python -m pytest tests/integration

Without a running testbed the tests that use ``slurm_cluster`` are skipped, or fail under
``CI=true``. Such tests are marked ``slurm`` automatically.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import pytest

DEFAULT_DIR = "/tmp/synthbatch-testbed"
# A second testbed without slurmdbd (`make testbed` starts it; see the Makefile).
NOACCT_DIR = "/tmp/synthbatch-testbed-noacct"
# A third one of 3 nodes, each at its own loopback address (`make testbeds`).
MULTINODE_DIR = "/tmp/synthbatch-testbed-multinode"
MULTINODE_NODES = 3
CLUSTER_FIXTURES = ("slurm_cluster", "slurm_cluster_noacct", "slurm_cluster_multinode")
TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)
_HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class SlurmCluster:
    """A running testbed: ``conf`` is its SLURM_CONF, ``dir`` the testbed directory."""

    conf: str
    dir: str
    accounting: bool

    def env(self) -> dict:
        return {**os.environ, "SLURM_CONF": self.conf}

    def run(
        self, *args: str, check: bool = True, timeout: float = 30
    ) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster; text output captured."""
        return subprocess.run(
            list(args),
            env=self.env(),
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def sbatch(self, *args: str) -> str:
        """``sbatch --parsable ARGS``; returns the job id (for arrays: the array job id)."""
        out = self.run("sbatch", "--parsable", *args).stdout.strip()
        job_id = out.split(";")[0]  # "ID;cluster" when a cluster name is appended
        assert re.fullmatch(r"\d+", job_id), f"sbatch --parsable printed {out!r}"
        return job_id

    def job_states(self, job_id: str) -> list:
        """States of a job (one per array task) from slurmctld; [] once it forgot the job."""
        res = self.run("squeue", "-h", "-r", "-t", "all", "-j", job_id, "-o", "%T", check=False)
        if res.returncode != 0:
            return []
        return res.stdout.split()

    def wait_job(self, job_id: str, timeout: float = 60) -> list:
        """Poll until every task of the job is in a terminal state; returns the states."""
        deadline = time.monotonic() + timeout
        states: list = []
        while time.monotonic() < deadline:
            states = self.job_states(job_id)
            if states and all(s in TERMINAL_STATES for s in states):
                return states
            time.sleep(0.3)
        pytest.fail(f"job {job_id} not finished after {timeout}s (states: {states})")

    def wait_for(self, predicate, timeout: float = 30, interval: float = 0.3, what: str = ""):
        """Poll ``predicate()`` until it returns a truthy value; returns that value."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}")
            time.sleep(interval)


def _candidate_confs() -> Sequence[str]:
    confs = []
    if os.environ.get("SLURM_CONF"):
        confs.append(os.environ["SLURM_CONF"])
    tb_dir = os.environ.get("SYNTHBATCH_TESTBED_DIR") or DEFAULT_DIR
    env_sh = Path(tb_dir, "env.sh")
    try:
        m = re.search(r"^export SLURM_CONF=(\S+)", env_sh.read_text(), re.M)
    except OSError:
        m = None
    if m:
        confs.append(m.group(1))
    return list(dict.fromkeys(confs))


def _ping(conf: str) -> Optional[str]:
    """None if slurmctld of ``conf`` answers, else the reason why not."""
    if not Path(conf).is_file():
        return f"{conf} does not exist"
    try:
        res = subprocess.run(
            ["scontrol", "ping"],
            env={**os.environ, "SLURM_CONF": conf},
            capture_output=True,
            text=True,
            timeout=15,
        )
    except FileNotFoundError:
        return "scontrol is not installed"
    except subprocess.TimeoutExpired:
        return f"'scontrol ping' timed out for {conf}"
    if res.returncode != 0 or "UP" not in res.stdout:
        return f"'scontrol ping' failed for {conf}: {(res.stdout + res.stderr).strip()}"
    return None


def _accounting(conf: str) -> bool:
    res = subprocess.run(
        ["scontrol", "show", "config"],
        env={**os.environ, "SLURM_CONF": conf},
        capture_output=True,
        text=True,
        timeout=15,
        check=True,
    )
    m = re.search(r"^AccountingStorageType\s*=\s*(\S+)", res.stdout, re.M)
    return bool(m) and m.group(1) != "accounting_storage/none"


@pytest.fixture(scope="session")
def slurm_cluster():
    """The running local Slurm testbed; sets os.environ['SLURM_CONF'] for the session."""
    reasons = []
    for conf in _candidate_confs():
        reason = _ping(conf)
        if reason is None:
            break
        reasons.append(reason)
    else:
        msg = (
            "no running Slurm testbed ("
            + ("; ".join(reasons) or "no SLURM_CONF and no testbed env.sh found")
            + '). Start one with: eval "$(scripts/slurm-testbed up)"'
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)

    conf = str(Path(conf).resolve())
    cluster = SlurmCluster(
        conf=conf, dir=str(Path(conf).parent.parent), accounting=_accounting(conf)
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", conf)
        yield cluster


def _noacct_conf() -> str:
    tb_dir = os.environ.get("SYNTHBATCH_TESTBED_NOACCT_DIR") or NOACCT_DIR
    return str(Path(tb_dir, "etc", "slurm.conf"))


@pytest.fixture
def slurm_cluster_noacct(monkeypatch):
    """The second testbed, without accounting; SLURM_CONF points at it for one test."""
    conf = _noacct_conf()
    reason = _ping(conf)
    if reason is not None:
        msg = (f"no running no-accounting testbed ({reason}). Start it with: "
               f"SYNTHBATCH_TESTBED_ACCOUNTING=0 SYNTHBATCH_TESTBED_PORT=6917 "
               f"scripts/slurm-testbed up {NOACCT_DIR}  (or: make testbed)")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    cluster = SlurmCluster(conf=conf, dir=str(Path(conf).parent.parent),
                           accounting=_accounting(conf))
    assert not cluster.accounting, f"{conf} keeps accounting; it must not"
    monkeypatch.setenv("SLURM_CONF", conf)
    return cluster


def node_addrs(cluster: SlurmCluster) -> dict:
    """Node name -> NodeAddr, from ``scontrol show node -o``."""
    out = cluster.run("scontrol", "show", "node", "-o").stdout
    return dict(re.findall(r"NodeName=(\S+) .*?NodeAddr=(\S+)", out))


@pytest.fixture
def slurm_cluster_multinode(monkeypatch):
    """The testbed of 3 nodes with distinct loopback addresses
    (``SYNTHBATCH_TESTBED_DISTINCT_ADDRS=1``); SLURM_CONF points at it for one test."""
    tb_dir = os.environ.get("SYNTHBATCH_TESTBED_MULTINODE_DIR") or MULTINODE_DIR
    conf = str(Path(tb_dir, "etc", "slurm.conf"))
    reason = _ping(conf)
    cluster = None
    if reason is None:
        cluster = SlurmCluster(conf=conf, dir=tb_dir, accounting=_accounting(conf))
        addrs = node_addrs(cluster)
        if len(addrs) < MULTINODE_NODES or len(set(addrs.values())) < len(addrs):
            reason = (f"{conf} has nodes {addrs}: {MULTINODE_NODES} nodes with distinct "
                      "addresses are needed")
    if reason is not None:
        msg = (f"no multi-node testbed ({reason}). Start it with: "
               f"SYNTHBATCH_TESTBED_NODES={MULTINODE_NODES} SYNTHBATCH_TESTBED_DISTINCT_ADDRS=1 "
               f"SYNTHBATCH_TESTBED_ACCOUNTING=0 SYNTHBATCH_TESTBED_PORT=7017 "
               f"scripts/slurm-testbed up {MULTINODE_DIR}  (or: make testbeds)")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    monkeypatch.setenv("SLURM_CONF", conf)
    return cluster


def pytest_collection_modifyitems(config, items):
    """Mark every test under tests/integration that uses a testbed fixture with ``slurm``."""
    for item in items:
        if not set(CLUSTER_FIXTURES) & set(getattr(item, "fixturenames", ())):
            continue
        try:
            Path(str(item.path)).resolve().relative_to(_HERE)
        except ValueError:
            continue
        item.add_marker(pytest.mark.slurm)
