"""Fuzzing the state readers and what they show (docs/reliability.md).

A four-shard run (a verified winner, a failure with progress and logs, a running shard
with readiness, a submitted one) gets one of its state files damaged: random bytes, a
truncation, a random change of one field, an empty file, a file over the 1 MiB record
limit, a directory, a FIFO, a dangling symlink, a symlink to ``/etc/passwd`` or to a
valid record that carries a marker. Then every reading command runs on it (``status``
human and ``--json``, with Slurm answering or unreachable; ``runs``; ``logs``; ``retry
--dry-run``; ``merge --allow-partial``; ``cancel``):

* no command fails with exit 1 (an internal error) and none prints a traceback; every
  error is one line;
* a symlink is never followed: neither the marker nor ``/etc/passwd`` ever shows;
* a damaged record of one shard is that shard's problem: ``status`` names the file in its
  reason and the other shards keep their state; a damaged winner never reads succeeded.

A second target writes random text (every control character, escape sequences, C1
controls, unicode) into the reasons, job id and log files and checks that nothing a
command prints holds a control character other than newline and tab.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from click.testing import CliRunner, Result
from hypothesis import given
from hypothesis import strategies as st

from synthbatch.agent_stdlib.candidate import build_manifest
from synthbatch.agent_stdlib.contracts import WinnerRecord, sha256_bytes
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import ensure_dir, publish_json_immutable, write_json_atomic
from synthbatch.control.cli.main import cli
from synthbatch.control.slurm.runner import CommandResult
from synthbatch.control.slurm.scheduler import Scheduler
from tests.conftest import REPO
from tests.fakes import RUN_ID, Shard, fuzz, make_run, write_readiness

TESTBED = REPO / "examples" / "profiles" / "testbed.toml"
MARKER = "FOLLOWED-A-SYMLINK"
PASSWD = "root:x:0:0"
SQUEUE = "500_2|RUNNING|None\n500_3|PENDING|Priority\n"
SACCT = "500_1|FAILED|1:0\n"
STATE_FILES = ["run.json", "plan.json", "submissions/0001.json", "cancels/0001.json",
               "observer/lag.json"] + [
    f"shards/shard-{s:05d}/{name}" for s in range(4) for name in (
        "winner.json", "attempts/attempt-0001/attempt.json",
        "attempts/attempt-0001/readiness.json", "attempts/attempt-0001/progress.json",
        "attempts/attempt-0001/result.json")]
PER_SHARD = re.compile(r"shards/shard-(\d{5})/")
UNREADABLE = ("bytes", "truncate", "empty", "huge", "directory", "fifo", "dangling",
              "passwd", "marker")
COUNTER = itertools.count()


def _winner(layout: RunLayout, shard: int, offset: int) -> None:
    out = ensure_dir(layout.attempt(shard, 1).output)
    (out / "records.jsonl").write_text("".join(json.dumps({"index": i}) + "\n"
                                               for i in range(offset, offset + 10)))
    manifest = build_manifest(out, shard, 1, 10)
    payload = manifest.to_json().encode()
    layout.attempt(shard, 1).result_json.write_bytes(payload)
    publish_json_immutable(layout.winner_json(shard), WinnerRecord(
        shard=shard, attempt=1, records=10, result_sha256=sha256_bytes(payload),
        files=manifest.files, created_at=1.0).to_dict())


def build_template(workspace: Path) -> RunLayout:
    """The healthy run every case starts from (and what each shard shows)."""
    layout = make_run(workspace, [Shard("succeeded"), Shard("failed", "client exited 3",
                                                            progress=4),
                                  Shard("running", progress=6), Shard("submitted")])
    _winner(layout, 0, 0)
    write_readiness(layout.attempt(2, 1).readiness_json, 2, 1, 1, "ready",
                    endpoints={"tiny": "http://127.0.0.1:20000"})
    client = ensure_dir(layout.attempt(1, 1).execution_logs(1)) / "client.log"
    client.write_text("client of shard 1\n")
    ensure_dir(layout.root / "cancels")
    write_json_atomic(layout.root / "cancels" / "0001.json", {
        "schema_version": 1, "requested_at": 1.0, "shards": [], "job_ids": []})
    ensure_dir(layout.root / "observer")
    write_json_atomic(layout.root / "observer" / "lag.json",
                      {"schema_version": 1, "first_missing": {}})
    return layout


class Slurm:
    """squeue and sacct answers for the run (or an unreachable controller); scancel ends
    the jobs it names."""

    def __init__(self) -> None:
        self.up = True
        self.queue = SQUEUE

    def __call__(self, argv, timeout):  # noqa: ANN001 - the Runner protocol
        name = os.path.basename(argv[0])
        if not self.up:
            return CommandResult(argv, 1, "", f"{name}: error: Unable to contact slurm "
                                              "controller (connect failure)\n")
        if name == "scancel":
            self.queue = "".join(line + "\n" for line in self.queue.splitlines()
                                 if not any(line.startswith(j) for j in argv[1:]))
        out = {"squeue": self.queue, "sacct": SACCT}.get(name, "")
        return CommandResult(argv, 0, out, "")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("template")
    build_template(base / "ws")
    return base / "ws"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    from synthbatch.control import api
    from synthbatch.control.cli import logs as logs_cli

    slurm = Slurm()
    monkeypatch.setattr(api, "scheduler_for", lambda prof: Scheduler(runner=slurm))
    monkeypatch.setattr(logs_cli, "is_tty", lambda: True)  # logs made visible, as on a tty
    monkeypatch.setenv("HOME", str(tmp_path))
    return {"slurm": slurm, "tmp": tmp_path}


def fresh_run(env: Dict[str, Any], template: Path) -> Tuple[RunLayout, str]:
    """A copy of the template run in a new workspace and its profile (and Slurm as the
    template's jobs left it: hypothesis runs many cases in one fixture)."""
    env["slurm"].__init__()
    case = env["tmp"] / f"case-{next(COUNTER)}"
    shutil.copytree(template, case / "ws", symlinks=True)
    profile = case / "profile.toml"
    profile.write_text(TESTBED.read_text().replace('"/tmp/synthbatch-workspace"',
                                                   json.dumps(str(case / "ws"))))
    return RunLayout(case / "ws" / "runs" / RUN_ID), str(profile)


def damage(layout: RunLayout, rel: str, kind: str, data: st.DataObject) -> None:
    path = layout.root / rel
    original = path.read_bytes() if path.is_file() else b"{}"
    if path.exists() or path.is_symlink():
        os.chmod(path, 0o600)
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "bytes":
        path.write_bytes(data.draw(st.binary(max_size=300), label="bytes"))
    elif kind == "truncate":
        path.write_bytes(original[:data.draw(st.integers(0, max(0, len(original) - 1)),
                                             label="cut")])
    elif kind == "field":
        record = json.loads(original)
        key = data.draw(st.sampled_from(sorted(record) or ["x"]), label="field")
        record[key] = data.draw(st.one_of(
            st.none(), st.booleans(), st.integers(-2, 2 ** 64), st.floats(), st.text(),
            st.lists(st.integers(), max_size=2), st.just({})), label="value")
        path.write_text(json.dumps(record))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "huge":
        path.write_bytes(b" " * (1 << 20) + original)
    elif kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dangling":
        path.symlink_to(layout.root / "no-such-file")
    elif kind == "passwd":
        path.symlink_to("/etc/passwd")
    elif kind == "marker":
        target = layout.root.parent / f"elsewhere-{path.name}"
        record = json.loads(original)
        for key in ("reason", "name", "job_id"):
            if key in record:
                record[key] = MARKER
        record.setdefault("reason", MARKER) if "state" in record else None
        target.write_text(json.dumps(record))
        path.symlink_to(target)


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=True)


def commands(layout: RunLayout, profile: str, env: Dict[str, Any]) -> List[Result]:
    """Every reading command, each checked for exit 1, tracebacks and multi-line errors."""
    results = []
    for args in (("status", RUN_ID), ("status", RUN_ID, "--json"), ("runs",),
                 ("runs", "--json"), ("logs", RUN_ID, "--shard", "1"),
                 ("logs", RUN_ID, "--shard", "1", "--json"),
                 ("retry", RUN_ID, "--dry-run", "--json"),
                 ("merge", RUN_ID, "--allow-partial", "--json",
                  "--output", str(layout.root.parent / "merged.jsonl"))):
        results.append(run(*args, "--profile", profile))
    env["slurm"].up = False
    results += [run("status", RUN_ID, "--profile", profile),
                run("status", RUN_ID, "--json", "--profile", profile)]
    env["slurm"].up = True
    results.append(run("cancel", RUN_ID, "--shard", "3", "--json", "--profile", profile))
    for result in results:
        assert result.exit_code != 1, (result.output, result.exception)
        assert "Traceback" not in result.output
        if result.exit_code:
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            assert lines and len(lines[-1]) < 1000, result.stderr
    return results


@pytest.fixture(scope="module")
def baseline(template: Path, tmp_path_factory: pytest.TempPathFactory) -> List[str]:
    """What status shows for each shard of the healthy run."""
    from synthbatch.control.runs.status.refresh import observe

    copy = tmp_path_factory.mktemp("baseline") / "ws"
    shutil.copytree(template, copy, symlinks=True)
    view = observe(RunLayout(copy / "runs" / RUN_ID), Scheduler(runner=Slurm()))
    return [row["state"] for row in view["shards"]]


def test_the_healthy_template_reads_as_built(baseline: List[str]) -> None:
    assert baseline == ["succeeded", "failed", "running", "pending"]


@fuzz(ci=120, long=5_000)
@given(data=st.data())
def test_damaged_state_files_are_reported_never_followed(env: Dict[str, Any], template: Path,
                                                         baseline: List[str],
                                                         data: st.DataObject) -> None:
    layout, profile = fresh_run(env, template)
    rel = data.draw(st.sampled_from(STATE_FILES), label="file")
    kind = data.draw(st.sampled_from(UNREADABLE + ("field",)), label="damage")
    damage(layout, rel, kind, data)
    results = commands(layout, profile, env)
    for result in results:
        assert MARKER not in result.output and PASSWD not in result.output, result.output
    status = json.loads(results[1].stdout) if results[1].exit_code == 0 else None
    shard = PER_SHARD.match(rel)
    if status is None or shard is None:
        return
    index = int(shard.group(1))
    rows = status["shards"]
    for row in rows:
        if row["index"] != index:
            assert row["state"] == baseline[row["index"]], (rel, kind, row)
    row = rows[index]
    if rel.endswith("winner.json") and kind != "field":
        assert row["state"] != "succeeded" or kind == "truncate" and \
            (layout.root / rel).read_bytes() == b"", row
    name = rel.rsplit("/", 1)[1]
    if name in ("winner.json", "attempt.json") and kind in UNREADABLE and \
            row["state"] != baseline[index]:
        assert name in (row["reason"] or ""), (rel, kind, row)


CONTROLS = "".join(map(chr, itertools.chain(range(0x20), range(0x7f, 0xa0))))
hostile = st.lists(st.sampled_from(list(CONTROLS) + ["\x1b[2J", "\x1b]0;title\x07", "é",
                                                      "\u202e", "x", " "]),
                   max_size=40).map("".join)
SHOWN_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@fuzz(ci=60, long=3_000)
@given(reason=hostile, job=hostile, log=hostile, name=hostile)
def test_what_is_shown_from_state_and_logs_is_control_character_safe(
        env: Dict[str, Any], template: Path, reason: str, job: str, log: str,
        name: str) -> None:
    layout, profile = fresh_run(env, template)
    for shard in (1, 2):
        path = layout.attempt(shard, 1).attempt_json
        record = json.loads(path.read_text())
        record.update(reason=reason, job_id=job if shard == 2 else record["job_id"])
        path.write_text(json.dumps(record))
    log_path = layout.attempt(1, 1).execution_logs(1) / "client.log"
    log_path.write_text(log)
    readiness = layout.attempt(2, 1).readiness_json
    record = json.loads(readiness.read_text())
    record["reason"] = reason
    readiness.write_text(json.dumps(record))
    plan = layout.plan_json
    os.chmod(plan, 0o600)
    data = json.loads(plan.read_text())
    data["name"] = name
    data["run_id"] = f"{RUN_ID}{name}"
    plan.write_text(json.dumps(data))
    for result in commands(layout, profile, env):
        for text in (result.stdout, result.stderr):
            assert not SHOWN_CONTROL.search(text), (result.output,)
