"""Fakes shared by test modules (import them from here, never from another test module)."""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, settings

from synthbatch.agent_stdlib import states
from synthbatch.agent_stdlib.attempts import advance_attempt, create_attempts, load_attempt
from synthbatch.agent_stdlib.contracts import (
    AliasProgress,
    AttemptRecord,
    DeploymentSpec,
    GenerateSpec,
    Plan,
    ProgressRecord,
    ReadinessRecord,
    ResourceSpec,
    ResultManifest,
    RunRecord,
    RuntimeSpec,
    ShardSpec,
    SubmissionRecord,
    WinnerRecord,
)
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import (
    ensure_dir,
    publish_immutable,
    publish_json_immutable,
    write_json_atomic,
)
from synthbatch.control.cli.main import cli
from synthbatch.control.config.loader import load_model
from synthbatch.control.config.profile import Profile
from synthbatch.control.config.run import RunConfig
from synthbatch.control.planning.arrays import array_chunks
from synthbatch.control.planning.planner import make_plan, split_records
from synthbatch.control.slurm.runner import CommandResult
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


def create_attempt(path: Path, run_id: str, shard: int, attempt: int,
                   resume_from: Optional[int] = None) -> AttemptRecord:
    """One fresh ``created`` attempt record (through the bulk writer submit and retry use)."""
    create_attempts([(path, run_id, shard, attempt, resume_from)])
    return load_attempt(path)


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


def first_record(layout: RunLayout, shard: int) -> Any:
    """The first revision of ``shard``'s attempt 1 as its submission record implies it
    (what an agent starting it, or a cancel ending it, advances)."""
    from synthbatch.control.runs.status.reconcile import implied_first
    from synthbatch.control.runs.status.records import load_plan_view, shard_scanner

    view = shard_scanner(layout)(shard).attempt
    assert view is not None, f"no submission names shard {shard}"
    return implied_first(load_plan_view(layout).run_id, shard, view)


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
    "sbatch": {"--parsable": False, "--hold": False, "--array": True, "--job-name": True,
               # the automatic retry round's job (control/runs/autoretry.py)
               **{f: True for f in ("--cpus-per-task", "--mem", "--time", "--output",
                                    "--kill-on-invalid-dep", "--dependency", "--partition",
                                    "--account", "--begin")}},
    "scontrol": {"-o": False},
    "sacctmgr": {"-n": False, "-P": False},
    "scancel": {},
    "sinfo": {"-h": False, "-o": True, "-N": False, "-p": True},
    "squeue": {"-h": False, "-t": True, "-j": True, "-o": True, "-n": True},
    "sacct": {"-n": False, "-P": False, "-X": False, "-D": False, "-j": True, "--format": True},
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
    """sbatch answers increasing ids (or refuses); sbatch/release/scancel calls are
    recorded."""

    def __init__(self, refuse: bool = False, delay_s: float = 0.0, next_id: int = 900,
                 fail_on: Optional[int] = None) -> None:
        self.calls: List[List[str]] = []
        self.next_id = next_id
        self.refuse = refuse
        self.fail_on = fail_on  # the n-th sbatch (1-based) is refused
        self.delay_s = delay_s
        self.lock = threading.Lock()

    def __call__(self, argv, timeout):  # noqa: ANN001 - the Runner protocol
        name = argv[0].rsplit("/", 1)[-1]
        with self.lock:
            self.calls.append(list(argv))
        if name == "sbatch":
            time.sleep(self.delay_s)
            if self.refuse or len(self.sbatch()) == self.fail_on:
                return CommandResult(argv, 1, "", "sbatch: error: invalid partition\n")
            with self.lock:
                self.next_id += 1
                return CommandResult(argv, 0, f"{self.next_id}\n", "")
        assert (name == "scontrol" and argv[1] == "release") or name == "scancel", argv
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
             submitted_at: float = NOW - 3600, per_shard: int = 10,
             run_id: str = RUN_ID) -> RunLayout:
    """A run directory written with the real record writers."""
    base = make_plan(load_model(QUICKSTART, RunConfig), load_model(TESTBED, Profile), run_id,
                     QUICKSTART.parent)
    plan = replace(base, shards=tuple(ShardSpec(i, i * per_shard, per_shard)
                                      for i in range(len(shards))),
                   total_records=per_shard * len(shards), arrays=array_chunks(len(shards)))
    layout = RunLayout(ensure_dir(workspace / "runs" / run_id))
    publish_immutable(layout.plan_json, plan.to_json().encode(), mode=0o400)
    ensure_dir(layout.submissions)
    ensure_dir(layout.slurm_logs)
    for index, shard in enumerate(shards):
        write_shard(layout, index, shard, job_id, per_shard, run_id)
    record = SubmissionRecord(number=1, argv=("sbatch",), job_id=job_id,
                              attempts={str(i): 1 for i in range(len(shards))},
                              submitted_at=submitted_at, released=released)
    write_json_atomic(layout.submission_json(1), record.to_dict())
    if committed:
        run = RunRecord(run_id=run_id, name=plan.name, created_at=NOW, plan_sha256="0" * 64,
                        agent_pyz="agent-x.pyz", agent_sha256="0" * 64, backend="slurm",
                        job_name=f"synthbatch-{run_id}", shard_count=len(shards))
        publish_immutable(layout.run_json, run.to_json().encode())
    return layout


PATHS = {"submitted": ["submitted"], "pending": ["submitted", "pending"],
         "running": ["submitted", "running"], "winner": ["submitted", "running", "succeeded"],
         "succeeded": ["submitted", "running", "succeeded"],
         "failed": ["submitted", "running", "failed"],
         "cancelled": ["submitted", "running", "cancelled"], "created": []}


def write_shard(layout: RunLayout, index: int, shard: Shard, job_id: Optional[str],
                per_shard: int, run_id: str = RUN_ID) -> None:
    if shard.state == "implied":  # a first attempt as submit leaves it: nothing on disk
        return
    paths = layout.attempt(index, 1)
    ensure_dir(paths.root)
    create_attempt(paths.attempt_json, run_id, index, 1)
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


def fake_slurm_bin(tmp_path: Path, **scripts: str) -> Path:
    """A slurm_bin folder whose commands are small shell scripts."""
    folder = tmp_path / "fakebin"
    folder.mkdir()
    for name, body in scripts.items():
        path = folder / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(0o755)
    return folder


def profile_with_bin(profile_file: Path, folder: Path) -> str:
    """``profile_file`` with its ``slurm_bin`` set to ``folder``; its path."""
    profile_file.write_text(profile_file.read_text() + f'slurm_bin = "{folder}"\n')
    return str(profile_file)


# ------------------------------------------------ documentation

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def fenced_blocks(path: Path, info: Optional[str] = None) -> List[str]:
    """The fenced code blocks of a Markdown file, in order; with ``info``, only those whose
    info string is exactly it (``bash testbed``, ``toml run``)."""
    return [body for tag, body in FENCE.findall(path.read_text(encoding="utf-8"))
            if info is None or tag.strip() == info]


def fenced_infos(path: Path) -> List[str]:
    """The info strings of every fenced block of a Markdown file."""
    return [tag.strip() for tag, _ in FENCE.findall(path.read_text(encoding="utf-8"))]


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


def poll(what: str, check: Callable[[], Any], timeout_s: float = 30.0,
         interval_s: float = 0.05) -> Any:
    """``check()`` until it returns something truthy (returned); fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(interval_s)


# ------------------------------------------------ crash and race harness (docs/reliability.md)

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class KillSwitch:
    """Counts this process's filesystem writes and SIGKILLs it just before write ``at``.

    Installed only in a forked child (it patches ``os`` and ``open`` for good): each os
    call that changes a file or folder (an open for writing, write, fsync, replace, link,
    unlink, mkdir, sync, ...) and each ``open()`` for writing is one step. Writes the
    harness itself makes (the fake cluster's state) are not counted (``paused``).
    ``os.sync()`` is a step that flushes nothing: it syncs every filesystem of the machine
    (~20 ms here), and a process kill loses no page cache anyway.
    """

    NAMES = ("write", "pwrite", "fsync", "fdatasync", "replace", "rename", "link", "symlink",
             "unlink", "remove", "mkdir", "rmdir", "sync", "ftruncate", "truncate", "chmod",
             "mkfifo")

    def __init__(self, at: Optional[int] = None) -> None:
        self.at, self.count, self.paused = at, 0, 0

    def step(self) -> None:
        """One write step; the one numbered ``at`` never happens."""
        if self.paused:
            return
        self.count += 1
        if self.at is not None and self.count >= self.at:
            os.kill(os.getpid(), signal.SIGKILL)

    def _counted(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.step()
            return real(*args, **kwargs)
        return call

    def install(self) -> KillSwitch:
        """Patch ``os`` and ``open`` of this process; return self."""
        import builtins
        import io

        for name in self.NAMES:
            setattr(os, name, self._counted(getattr(os, name)))
        os.sync = self._counted(lambda: None)
        real_open, real_builtin = os.open, builtins.open

        def os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if flags & WRITE_FLAGS:
                self.step()
            return real_open(path, flags, *args, **kwargs)

        def builtin_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if any(c in mode for c in "wax+"):
                self.step()
            return real_builtin(file, mode, *args, **kwargs)

        os.open = os_open  # type: ignore[assignment]
        builtins.open = io.open = builtin_open  # type: ignore[assignment]
        return self


class FileCluster:
    """A fake Slurm whose jobs live in a JSON file (flock-ed), shared by forked children.

    As a Runner it answers what ``control.slurm.scheduler`` asks (``sbatch --parsable
    --hold --array``, ``scontrol release``, ``squeue``, ``sacct``, ``scancel``); the
    harness moves tasks along (``set``) as the allocations it runs start and end.
    """

    def __init__(self, path: Path, kill: Optional[KillSwitch] = None) -> None:
        self.path, self.kill = path, kill

    @contextmanager
    def _state(self) -> Any:
        import fcntl

        if self.kill is not None:
            self.kill.paused += 1
        try:
            with open(f"{self.path}.lock", "a+") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                data = json.loads(self.path.read_text()) if self.path.exists() else \
                    {"next": 1000, "jobs": {}}
                yield data
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(data))
                os.replace(tmp, self.path)
        finally:
            if self.kill is not None:
                self.kill.paused -= 1

    def jobs(self) -> Dict[str, Any]:
        """``{job id: {"name", "script", "held", "tasks": {task: {"state", "restarts"}}}}``."""
        with self._state() as data:
            return data["jobs"]

    def set(self, job: str, task: int, state: str, requeue: bool = False) -> None:
        """Move one task to ``state`` (a requeue also counts a restart)."""
        with self._state() as data:
            entry = data["jobs"][job]["tasks"][str(task)]
            entry["state"] = state
            entry["restarts"] += int(requeue)

    def runnable(self) -> List[Tuple[str, int, str, int]]:
        """``(job, task, script, restarts)`` of every released task that is pending."""
        return [(job, int(task), info["script"], entry["restarts"])
                for job, info in sorted(self.jobs().items(), key=lambda j: int(j[0]))
                if not info["held"]
                for task, entry in sorted(info["tasks"].items(), key=lambda t: int(t[0]))
                if entry["state"] == "PENDING"]

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        name, args = os.path.basename(argv[0]), list(argv[1:])
        with self._state() as data:
            out = getattr(self, f"_{name}")(data, args)
        return CommandResult(list(argv), 0, out, "")

    @staticmethod
    def _sbatch(data: Dict[str, Any], args: List[str]) -> str:
        from synthbatch.control.slurm.parsers import expand_tasks

        opts = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
        job = str(data["next"])
        data["next"] += 1
        data["jobs"][job] = {"name": opts["job-name"], "script": args[-1], "held": True,
                             "tasks": {str(t): {"state": "PENDING", "restarts": 0}
                                       for t in expand_tasks(opts["array"])}}
        return f"{job}\n"

    @staticmethod
    def _scontrol(data: Dict[str, Any], args: List[str]) -> str:
        assert args[0] == "release", args
        data["jobs"][args[1]]["held"] = False
        return ""

    @staticmethod
    def _rows(data: Dict[str, Any], args: List[str]) -> List[Tuple[str, Dict[str, Any], str]]:
        name = args[args.index("-n") + 1] if "-n" in args else None
        ids = args[args.index("-j") + 1].split(",") if "-j" in args else None
        rows = []
        for job, info in sorted(data["jobs"].items(), key=lambda j: int(j[0])):
            for task, entry in sorted(info["tasks"].items(), key=lambda t: int(t[0])):
                key = f"{job}_{task}"
                if (name is None or info["name"] == name) and \
                        (ids is None or job in ids or key in ids):
                    rows.append((key, entry, "JobHeldUser" if info["held"] else "None"))
        return rows

    def _squeue(self, data: Dict[str, Any], args: List[str]) -> str:
        every = "-t" in args  # without ``-t all`` squeue lists active jobs only
        return "".join(f"{key}|{e['state']}|{why}\n" for key, e, why in self._rows(data, args)
                       if every or e["state"] in ("PENDING", "RUNNING"))

    def _sacct(self, data: Dict[str, Any], args: List[str]) -> str:
        codes = {"FAILED": "1:0", "CANCELLED": "0:15"}
        return "".join(f"{key}|{e['state']}{' by 0' if e['state'] == 'CANCELLED' else ''}|"
                       f"{codes.get(e['state'], '0:0')}\n"
                       for key, e, _ in self._rows(data, args))

    @staticmethod
    def _scancel(data: Dict[str, Any], args: List[str]) -> str:
        for target in args:
            job, _, task = target.partition("_")
            for number, entry in data["jobs"][job]["tasks"].items():
                if (not task or number == task) and entry["state"] in ("PENDING", "RUNNING"):
                    entry["state"] = "CANCELLED"
        return ""


FAIL_AFTER = 3  # records a failing client writes before it exits 1


class FakeClient:
    """The client step, in-process: the real generator's writer (``Producer.drain``: kept
    records copied, lines written in index order, batched and fsynced by ``Output``,
    resumed by ``Output.resume``) and its ``Progress``, with records that depend only on
    their index instead of model answers; progress written after every record; ``fail``
    says which (shard, attempt) exits 1 after ``FAIL_AFTER`` records; each record takes
    ``delay_s``."""

    def __init__(self, fail: Callable[[int, int], bool], delay_s: float = 0.0) -> None:
        self.fail, self.delay_s = fail, delay_s

    def __call__(self, env: Mapping[str, str], shard: int, attempt: int) -> int:
        import threading

        from synthbatch.agent_stdlib.client import generate as gen
        from synthbatch.agent_stdlib.client.output import Output
        from synthbatch.agent_stdlib.client.records import Outcome

        offset, count = int(env["SYNTHBATCH_RECORD_OFFSET"]), int(env["SYNTHBATCH_NUM_RECORDS"])
        folder = Path(env["SYNTHBATCH_OUTPUT_DIR"])
        progress = EveryRecord(Path(env["SYNTHBATCH_PROGRESS_FILE"]), count)
        kept = gen.kept_records(env.get("SYNTHBATCH_RESUME_DIR"), folder, offset, count)
        failing = self.fail(shard, attempt)
        todo = min(count, FAIL_AFTER) if failing else count
        work = gen.Shard(offset, todo, Output(folder, offset), progress, kept)
        resumed = work.output.resume()
        progress.start_at(resumed.records + resumed.dropped, resumed.dropped, resumed.tokens)
        producer = gen.Producer(None, work, 1, threading.Event())  # type: ignore[arg-type]
        write = resumed.next_index
        try:
            for index in range(write, offset + todo):
                if index < write:
                    continue  # copied from an earlier attempt by drain
                if index not in kept:
                    if self.delay_s:
                        time.sleep(self.delay_s)
                    line = json.dumps(fake_completion(index), sort_keys=True) + "\n"
                    producer.finished[index] = Outcome(index, line.encode("utf-8"), tokens=2)
                write = producer.drain(write)
        finally:
            work.output.close()
            progress.tick(force=True)
        return 1 if failing else 0


def fake_completion(index: int) -> Dict[str, Any]:
    """The record a fake client writes for ``index`` (deterministic)."""
    return {"index": index, "prompt": f"item {index}", "completion": f"text {index}",
            "finish_reason": "stop", "model": "tiny", "served_model": "fake",
            "usage": {"completion_tokens": 2}}


class EveryRecord:
    """``generate.Progress`` that publishes after every record (the real one: ~1 Hz)."""

    def __new__(cls, path: Path, total: int) -> Any:
        from synthbatch.agent_stdlib.client.progress import Progress

        class Eager(Progress):
            def settled(self, tokens: int = 0, dropped: bool = False, count: int = 1) -> None:
                super().settled(tokens, dropped, count)
                self.write()

        return Eager(path, total)


@dataclass
class FakeManaged:
    """A finished client step as the controller sees it."""

    name: str
    log_path: Path
    code: int
    argv: Sequence[str] = ()
    step: Optional[str] = None

    def exit_code(self) -> Optional[int]:
        return self.code


def run_agent(layout: RunLayout, job: str, task: int, script: str, restarts: int,
              client: FakeClient) -> int:
    """One execution of the real allocation controller for task ``task`` of array ``job``.

    Everything the agent writes is written by its own code (attempt, readiness, output via
    ``generate``, progress, result, winner); preflight, the servers, the proxy and the
    step launcher are replaced in-process. Run it in a forked child: it sets the
    job's environment and patches the controller module.
    """
    from synthbatch.agent_stdlib.allocation import controller
    from synthbatch.agent_stdlib.allocation.invocation import invocation, parse_args
    from synthbatch.agent_stdlib.allocation.signals import SignalCoordinator
    from synthbatch.agent_stdlib.allocation.supervisor import open_log

    text = Path(script).read_text()
    args = ["--run-dir", str(layout.root), "--submission",
            re.search(r"--submission (\d+)", text).group(1),  # type: ignore[union-attr]
            "--plan-sha256", re.search(r"^plan_sha256=(\S+)$", text, re.M).group(1),  # type: ignore[union-attr]
            "--agent-pyz", str(layout.root / "agent.pyz")]
    index = re.search(r"--array-index (\d+)", text)
    args += ["--array-index", index.group(1)] if index else []
    os.environ.update(SLURM_JOB_ID=str(int(job) * 1000 + task), SLURM_ARRAY_JOB_ID=job,
                      SLURM_ARRAY_TASK_ID=str(task), SLURM_RESTART_COUNT=str(restarts),
                      SLURMD_NODENAME="node1", SLURM_JOB_NODELIST="node1",
                      SLURM_JOB_NUM_NODES="1")
    inv = invocation(parse_args(args), os.environ)

    class Supervisor:
        def __init__(self, *args: Any) -> None:
            self.children: List[Any] = []

        def start(self, name: str, argv: Sequence[str], env: Dict[str, str], log_path: Path,
                  step: bool = False) -> FakeManaged:
            os.close(open_log(log_path))
            env = dict(env, SYNTHBATCH_PLAN=str(layout.plan_json))
            return FakeManaged(name, log_path, client(env, inv.shard, inv.attempt))

        def stop_all(self, grace_s: float) -> bool:
            return True

    class Services:
        def __init__(self, plan: Any, *args: Any) -> None:
            self.endpoints = {d.alias: "http://127.0.0.1:9" for d in plan.deployments}
            self.urls: Dict[str, List[str]] = {}  # no replicas: telemetry samples nothing

        def start_servers(self, sites: Any) -> None:
            pass

        def wait_ready(self) -> None:
            pass

        def start_proxies(self) -> None:
            pass

        def backends(self) -> Dict[str, tuple]:
            from synthbatch.agent_stdlib.contracts import BackendStatus

            return {a: (BackendStatus(url=u, ready=True),) for a, u in self.endpoints.items()}

        def all_servers(self) -> List[Any]:
            return []

    controller.run_preflight = lambda ctx: {}  # type: ignore[assignment]
    # no sampling thread: its timed writes would make the run's write steps vary
    controller.from_env = lambda path: controller.Telemetry(path, 0.0)  # type: ignore
    controller.Services = Services  # type: ignore[assignment,misc]
    controller.Supervisor = Supervisor  # type: ignore[assignment,misc]
    controller.fail_on_exit = lambda servers: None  # type: ignore[assignment]
    return controller.Allocation(inv=inv, signals=SignalCoordinator()).run()


def fork_call(function: Callable[[], Any], kill_after_s: Optional[float] = None,
              log: Optional[Path] = None) -> int:
    """Run ``function`` in a forked child; its wait status (``-9`` if it was SIGKILLed).

    The child exits 0 when ``function`` returns, 3 when it raises (the traceback goes to
    its stderr: ``log`` when given, where its stdout goes too); ``kill_after_s`` SIGKILLs
    it from here after that many seconds.
    """
    import traceback

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        if log is not None:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.stdout = sys.stderr = os.fdopen(fd, "w", buffering=1)
        code = 0
        try:
            function()
        except BaseException:  # noqa: BLE001 - reported through the exit status
            traceback.print_exc()
            code = 3
        os._exit(code)
    if kill_after_s is not None:
        time.sleep(kill_after_s)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


FAKE_SLURM_BIN = """#!{python}
import os, sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from tests.fakes import FileCluster
result = FileCluster(Path(os.environ["SYNTHBATCH_FAKE_CLUSTER"]))(sys.argv, 30.0)
sys.stdout.write(result.stdout)
sys.stderr.write(result.stderr)
sys.exit(result.returncode)
"""


def file_cluster_bin(folder: Path) -> Path:
    """``sbatch``, ``squeue``, ``sacct``, ``scancel`` and ``scontrol`` executables answering
    from the FileCluster named by ``$SYNTHBATCH_FAKE_CLUSTER`` (a profile's ``slurm_bin``:
    the real CLI, in its own processes, against the fake)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = FAKE_SLURM_BIN.format(python=sys.executable, repo=str(REPO))
    for name in ("sbatch", "squeue", "sacct", "scancel", "scontrol"):
        path = folder / name
        path.write_text(script)
        path.chmod(0o755)
    return folder


def harness_plan(shards: int, per_shard: int, max_attempts: int = 5) -> Any:
    """The fake-server example planned for ``shards`` shards of ``per_shard`` records."""
    base = make_plan(load_model(QUICKSTART, RunConfig), testbed_profile(), RUN_ID,
                     QUICKSTART.parent)
    return replace(base, shards=tuple(ShardSpec(i, i * per_shard, per_shard)
                                      for i in range(shards)),
                   total_records=shards * per_shard, arrays=array_chunks(shards),
                   max_attempts=max_attempts)


@functools.lru_cache(maxsize=1)
def testbed_profile() -> Profile:
    """examples/profiles/testbed.toml, validated (once)."""
    return load_model(TESTBED, Profile)


@dataclass
class World:
    """A workspace of one run (``RUN_ID``), its FileCluster and an agent bundle stand-in."""

    root: Path

    @property
    def ws(self) -> Path:
        return self.root / "ws"

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.ws / "runs" / RUN_ID)

    def cluster(self, kill: Optional[KillSwitch] = None) -> FileCluster:
        return FileCluster(self.root / "cluster.json", kill)

    @property
    def agent(self) -> Path:
        path = self.root / "agent.pyz"
        if not path.exists():
            path.write_bytes(b"agent bundle stand-in\n")
        return path

    def submit(self, plan: Any, cluster: FileCluster) -> Any:
        """``synthbatch submit`` of ``plan``: stage, commit, one held array, release."""
        from synthbatch.agent_stdlib.contracts import sha256_bytes
        from synthbatch.control.runs.submit.arrays import commit_run, stage_run, submit_all
        from synthbatch.control.slurm.scheduler import Scheduler

        staged = stage_run(self.ws, plan, {"run.toml": QUICKSTART, "profile.toml": TESTBED},
                           self.agent, sha256_bytes(self.agent.read_bytes()))
        commit_run(staged, "slurm")
        submit_all(staged, testbed_profile(), Scheduler(runner=cluster),
                   {s.index: 1 for s in plan.shards}, implied=True)
        return staged


def run_jobs(world: World, cluster: FileCluster, client: FakeClient) -> None:
    """Run an allocation for every released pending task, one after the other (Slurm)."""
    for job, task, script, restarts in cluster.runnable():
        cluster.set(job, task, "RUNNING")
        code = run_agent(world.layout, job, task, script, restarts, client)
        cluster.set(job, task, "COMPLETED" if code == 0 else "FAILED")


def drive(world: World, cluster: FileCluster, client: FakeClient, rounds: int = 10) -> None:
    """Status, retry and allocations, as a user and Slurm go on, until status says the run
    succeeded (and no task is left to run: a job requeued after its attempt succeeded
    still runs, and exits); AssertionError if ``rounds`` do not get there."""
    from synthbatch.control.runs.retry import retry_run
    from synthbatch.control.runs.status.refresh import observe
    from synthbatch.control.slurm.scheduler import Scheduler

    layout, sched = world.layout, Scheduler(runner=cluster)
    for _ in range(rounds):
        data = observe(layout, sched)
        if data["state"] == "succeeded" and not cluster.runnable():
            return
        if {"failed", "cancelled", "lost", "created"} & set(data["counts"]):
            retry_run(layout, testbed_profile(), sched)  # what a user does about those
        run_jobs(world, cluster, client)
    raise AssertionError(f"did not converge: {observe(layout, sched)}")


# --------------------------------------------------- a benchmark point's durable state


def meta_line(index: int, ms: float) -> Dict[str, Any]:
    """A recipe's record: per-request figures under ``_meta.columns``."""
    return {"index": index, "_meta": {"columns": {"text": {"latency_ms": ms}}}}


def template_line(index: int, ms: float) -> Dict[str, Any]:
    """A prompt template form's record: its one request's figures are top-level."""
    return {"index": index, "prompt": "p", "completion": "c", "finish_reason": "stop",
            "model": "tiny", "served_model": "m", "usage": {"completion_tokens": 3},
            "latency_ms": ms}


def fill(layout: RunLayout, shard: int, records: int, seconds: float, latencies: List[float],
         done: bool = True, errors: Dict[str, int] = None, shape=meta_line) -> None:
    """A point's progress, result and records as the generator and agent write them."""
    paths = layout.attempt(shard, 1)
    write_json_atomic(paths.progress_json, ProgressRecord(
        records_done=records, records_total=records, tokens=10 * records, requests_per_s=1.0,
        updated_at=NOW + seconds, started_at=NOW, first_record_at=NOW + 0.5,
        aliases={"gen": AliasProgress(requests=records, tokens_out=10 * records,
                                      errors=errors or {})}).to_dict())
    if done:
        write_json_atomic(paths.result_json, ResultManifest(
            shard=shard, attempt=1, records=records, files=(), created_at=NOW + seconds + 1)
            .to_dict())
    paths.output.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(shape(i, ms)) for i, ms in enumerate(latencies)]
    (paths.output / "records-000000000000.jsonl").write_text("\n".join(lines) + "\n{torn")


# ------------------------------------------------------------ plans, Slurm lines, metrics


LINE = ("PartitionName={name} Default={default} MaxNodes={max_nodes} MaxTime={max_time} "
        "MaxCPUsPerNode=UNLIMITED Nodes=node[1-2] State={state} TotalCPUs=16 "
        "TotalNodes={total} MaxMemPerNode={max_mem} AllowAccounts={accounts} AllowQos=ALL "
        "TRES=cpu=16,mem=8G,node=2,gres/gpu=8\n")


def partition(name: str = "debug", default: str = "YES", max_nodes: str = "UNLIMITED",
              max_time: str = "UNLIMITED", state: str = "UP", total: int = 2,
              max_mem: str = "UNLIMITED", accounts: str = "ALL") -> str:
    """One ``scontrol show partition -o`` line."""
    return LINE.format(name=name, default=default, max_nodes=max_nodes, max_time=max_time,
                       state=state, total=total, max_mem=max_mem, accounts=accounts)


def make_plan_for(records: int, count: int, run_id: str = "r-20240101-000000-abcdef") -> Plan:
    """A one-deployment prompt-template plan of ``records`` in ``count`` shards."""
    return Plan(
        run_id=run_id, name="r", total_records=records,
        shards=tuple(split_records(records, count, None)),
        deployments=(DeploymentSpec(
            alias="tiny", engine="openai", model="m", served_name="m",
            command=("python3", "serve.py", "--port", "{port}"), env={}, gpus_per_replica=0,
            replicas=1, startup_timeout_s=60.0, readiness_path="/health",
            max_queued_requests=64),),
        client=GenerateSpec(model="tiny", prompt_template="{index}", system_prompt=None,
                            max_tokens=8, temperature=0.0, concurrency=1, max_retries=0,
                            request_timeout_s=10.0),
        resources=ResourceSpec(partition=None, account=None, qos=None, time_limit="10",
                               nodes=1, gpus=0, gpu_request="gres", cpus=1, mem_mb=1024),
        runtime=RuntimeSpec(launcher="srun", python="/usr/bin/python3", port_base=20000,
                            env_allow=(), step_mem_mb=512, grace_s=5.0),
        max_attempts=3,
    )


def parse_metrics(text: str) -> Dict[str, float]:
    """Map metric name (labels dropped) to value."""
    values = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$", line)
        assert match, line
        values[match.group(1)] = float(match.group(3))
    return values


def plan_json(path: Path, profile: Path) -> Dict[str, object]:
    """``synthbatch plan PATH --json``: its exit code, its JSON, its stderr."""
    result = invoke("plan", str(path), "--profile", str(profile), "--json")
    return {"code": result.exit_code, **json.loads(result.stdout),
            "stderr": result.stderr}


class RoundQueue:
    """A scheduler double for the automatic rounds: ``submit_job`` numbers jobs; ``queue``
    says which still wait."""

    def __init__(self) -> None:
        self.submitted: List[List[str]] = []
        self.alive: set = set()

    def submit_job(self, argv: Sequence[str]) -> str:
        self.submitted.append(list(argv))
        job = str(700 + len(self.submitted))
        self.alive.add(job)
        return job

    def queue(self, job_ids: Sequence[str]) -> list:
        from types import SimpleNamespace

        return [SimpleNamespace(state="PENDING") for j in job_ids if j in self.alive]


def round_profile(tmp_path: Path) -> Any:
    """The profile fields a round reads: its workspace, no partition or account."""
    from types import SimpleNamespace

    return SimpleNamespace(workspace=str(tmp_path), partition=None, account=None)
