"""Fakes shared by test modules (import them from here, never from another test module)."""

from __future__ import annotations

import copy
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, settings

from agent_stdlib import states
from agent_stdlib.attempts import advance_attempt, create_attempt
from agent_stdlib.contracts import (
    ProgressRecord,
    ReadinessRecord,
    RunRecord,
    ShardSpec,
    SubmissionRecord,
    WinnerRecord,
)
from agent_stdlib.layout import RunLayout
from agent_stdlib.statefile import (
    ensure_dir,
    publish_immutable,
    publish_json_immutable,
    write_json_atomic,
)
from control.cli.main import cli
from control.config.loader import load_model
from control.config.profile import Profile
from control.config.run import RunConfig
from control.planning.arrays import array_chunks
from control.planning.planner import make_plan
from control.slurm.runner import CommandResult
from tests.conftest import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

QUICKSTART = REPO / "examples" / "fake-server.toml"
TESTBED = REPO / "examples" / "profiles" / "testbed.toml"
RUN_ID = "obs-20240101-000000-abcdef"
NOW = 1_700_000_000.0



# ------------------------------------------------ fuzzing budgets (docs/reliability.md)

LONG = os.environ.get("SYNTHBATCH_LONG", "") == "1"


def budget(ci: int, long: int) -> int:
    """How many cases a fuzz or crash target runs: ``ci`` in ``make test``, ``long`` with
    ``SYNTHBATCH_LONG=1`` (the long mode, run by hand)."""
    return long if LONG else ci


def fuzz(ci: int, long: int) -> settings:
    """Hypothesis settings of one fuzz target: ``budget(ci, long)`` examples, no deadline
    (2 shared cores), derandomized in CI (the same cases every run: a failure reproduces),
    random in the long mode (new cases every run; a failure prints its reproduction)."""
    return settings(max_examples=budget(ci, long), deadline=None, derandomize=not LONG,
                    database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


class Crash(Exception):
    """Stands for a process dying between two of its steps."""


def crash_on_call(real: Callable[..., Any], number: int) -> Callable[..., Any]:
    """``real``, except that its ``number``-th call raises Crash instead of running."""
    calls: List[int] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == number:
            raise Crash(f"died at call {number} of {getattr(real, '__name__', real)}")
        return real(*args, **kwargs)

    return wrapper


def write_readiness(path: Path, shard: int, attempt: int, execution: int, state: str,
                    revision: int = 1, **fields: Any) -> ReadinessRecord:
    """A ``readiness.json`` as an agent left it, written as it is (no edge check): a test's
    starting point, such as an allocation found ``ready`` after its agent vanished."""
    record = ReadinessRecord(shard=shard, attempt=attempt, execution=execution, state=state,
                             revision=revision, updated_at=time.time(), **fields)
    write_json_atomic(path, record.to_dict())
    return record


# ------------------------------------------------ Slurm

# Flags each command may carry; a value flag consumes the next argv word.
FLAGS: Dict[str, Dict[str, bool]] = {
    "sbatch": {"--parsable": False, "--hold": False, "--array": True, "--job-name": True},
    "scontrol": {},
    "scancel": {},
    "sinfo": {"-h": False, "-o": True},
    "squeue": {"-h": False, "-t": True, "-j": True, "-o": True, "-n": True},
    "sacct": {"-n": False, "-P": False, "-X": False, "-j": True, "--format": True},
}

Reply = Tuple[int, str, str]


class FakeSlurm:
    """A runner that dispatches on the command name and fails on unexpected flags."""

    def __init__(self, timeout_s: float = 30.0, prefix: str = "") -> None:
        self.calls: List[List[str]] = []
        self.replies: Dict[str, Callable[[List[str]], Reply]] = {}
        self.timeout_s = timeout_s
        self.prefix = prefix

    def on(self, name: str, code: int = 0, stdout: str = "", stderr: str = "") -> None:
        self.replies[name] = lambda args: (code, stdout, stderr)

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        argv = list(argv)
        self.calls.append(argv)
        assert timeout_s == self.timeout_s
        path = argv[0]
        assert path.startswith(self.prefix), path
        name = path[len(self.prefix):]
        if name not in FLAGS or name not in self.replies:
            pytest.fail(f"unexpected command {argv!r}")
        self._check_flags(name, argv[1:])
        code, stdout, stderr = self.replies[name](argv[1:])
        return CommandResult(argv=argv, returncode=code, stdout=stdout, stderr=stderr)

    @staticmethod
    def _check_flags(name: str, args: List[str]) -> None:
        allowed = FLAGS[name]
        words = iter(args)
        for word in words:
            if not word.startswith("-"):
                continue
            flag, eq, _ = word.partition("=")
            if flag not in allowed:
                pytest.fail(f"{name}: unexpected flag {word!r} in {args!r}")
            if allowed[flag] and not eq:
                next(words)
            if not allowed[flag] and eq:
                pytest.fail(f"{name}: flag {flag} takes no value")

    def only_call(self) -> List[str]:
        assert len(self.calls) == 1, self.calls
        return self.calls[0]


class SbatchRecorder:
    """sbatch answers increasing ids (or refuses); sbatch/release calls are recorded."""

    def __init__(self, refuse: bool = False, delay_s: float = 0.0, next_id: int = 900) -> None:
        self.calls: List[List[str]] = []
        self.next_id = next_id
        self.refuse = refuse
        self.delay_s = delay_s
        self.lock = threading.Lock()

    def __call__(self, argv, timeout):  # noqa: ANN001 - the Runner protocol
        name = argv[0].rsplit("/", 1)[-1]
        with self.lock:
            self.calls.append(list(argv))
        if name == "sbatch":
            time.sleep(self.delay_s)
            if self.refuse:
                return CommandResult(argv, 1, "", "sbatch: error: invalid partition\n")
            with self.lock:
                self.next_id += 1
                return CommandResult(argv, 0, f"{self.next_id}\n", "")
        assert name == "scontrol" and argv[1] == "release", argv
        return CommandResult(argv, 0, "", "")

    def sbatch(self) -> List[List[str]]:
        return [c for c in self.calls if c[0].endswith("sbatch")]


# ------------------------------------------------ run directories

@dataclass
class Shard:
    """How a test shard should look on disk."""

    state: str = "submitted"  # latest attempt state; "winner" publishes a winner
    reason: Optional[str] = None
    progress: Optional[int] = None  # records done
    updated_at: float = NOW


def make_run(workspace: Path, shards: List[Shard], job_id: Optional[str] = "500",
             committed: bool = True, released: bool = True,
             submitted_at: float = NOW - 3600, per_shard: int = 10) -> RunLayout:
    """A run directory written with the real record writers."""
    base = make_plan(load_model(QUICKSTART, RunConfig), load_model(TESTBED, Profile), RUN_ID,
                     QUICKSTART.parent)
    plan = replace(base, shards=tuple(ShardSpec(i, i * per_shard, per_shard)
                                      for i in range(len(shards))),
                   total_records=per_shard * len(shards), arrays=array_chunks(len(shards)))
    layout = RunLayout(ensure_dir(workspace / "runs" / RUN_ID))
    publish_immutable(layout.plan_json, plan.to_json().encode(), mode=0o400)
    ensure_dir(layout.submissions)
    ensure_dir(layout.slurm_logs)
    for index, shard in enumerate(shards):
        write_shard(layout, index, shard, job_id, per_shard)
    record = SubmissionRecord(number=1, argv=("sbatch",), job_id=job_id,
                              attempts={str(i): 1 for i in range(len(shards))},
                              submitted_at=submitted_at, released=released)
    write_json_atomic(layout.submission_json(1), record.to_dict())
    if committed:
        run = RunRecord(run_id=RUN_ID, name=plan.name, created_at=NOW, plan_sha256="0" * 64,
                        agent_pyz="agent-x.pyz", agent_sha256="0" * 64, backend="slurm",
                        job_name=f"synthbatch-{RUN_ID}", shard_count=len(shards))
        publish_immutable(layout.run_json, run.to_json().encode())
    return layout


PATHS = {"submitted": ["submitted"], "pending": ["submitted", "pending"],
         "running": ["submitted", "running"], "winner": ["submitted", "running", "succeeded"],
         "succeeded": ["submitted", "running", "succeeded"],
         "failed": ["submitted", "running", "failed"],
         "cancelled": ["submitted", "running", "cancelled"], "created": []}


def write_shard(layout: RunLayout, index: int, shard: Shard, job_id: Optional[str],
                per_shard: int) -> None:
    paths = layout.attempt(index, 1)
    ensure_dir(paths.root)
    create_attempt(paths.attempt_json, RUN_ID, index, 1)
    for step in PATHS[shard.state]:
        extra = {"job_id": f"{job_id}_{index}", "submission": 1} if step == "submitted" else {}
        reason = shard.reason if step in states.TERMINAL else None
        advance_attempt(paths.attempt_json, step, reason=reason, **extra)
    if shard.updated_at != NOW or shard.state in states.TERMINAL or shard.state == "winner":
        data = json.loads(paths.attempt_json.read_text())
        data["updated_at"] = shard.updated_at
        write_json_atomic(paths.attempt_json, data)
    if shard.progress is not None:
        write_json_atomic(paths.progress_json, ProgressRecord(
            records_done=shard.progress, records_total=per_shard, tokens=7 * shard.progress,
            requests_per_s=2.5, updated_at=NOW - 5).to_dict())
    if shard.state == "winner":
        publish_json_immutable(layout.winner_json(index), WinnerRecord(
            shard=index, attempt=1, records=per_shard, result_sha256="0" * 64, files=(),
            created_at=NOW).to_dict())


# ------------------------------------------------ authored inputs

def run_data() -> Dict[str, Any]:
    """The quickstart run as plain data (a fresh copy each call)."""
    return copy.deepcopy(tomllib.loads(QUICKSTART.read_text(encoding="utf-8")))


def profile_data() -> Dict[str, Any]:
    return copy.deepcopy(tomllib.loads(TESTBED.read_text(encoding="utf-8")))


def write_json(tmp_path: Path, data: Any, name: str = "run.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# ------------------------------------------------ the command line


def invoke(*args: str) -> Result:
    """Run ``synthbatch ARGS`` in-process; never raises (the result holds the exit code)."""
    return CliRunner().invoke(cli, list(args), catch_exceptions=True)
