"""Logs: find the right file of a shard's latest execution, print it, or follow it.

Step names: ``server-<alias>-<replica>``, ``proxy-<alias>``, ``client`` (files in
``attempts/attempt-NNNN/logs/execution-N/``) and ``slurm`` (Slurm's output of the batch
script, ``logs/slurm-<job>_<task>.out``, where the agent's own messages go).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, List, Optional

from synthbatch.agent_stdlib import states
from synthbatch.agent_stdlib.layout import AttemptLayout, RunLayout
from synthbatch.agent_stdlib.statefile import StateError, open_state_file
from synthbatch.agent_stdlib.text import visible
from synthbatch.control.errors import DamagedState, NotFound, SynthbatchError
from synthbatch.control.runs.status.records import ShardView, load_plan_view, shard_scanner
from synthbatch.control.runs.status.rows import LOG_IN_REASON
from synthbatch.control.runs.status.watch import Backoff
from synthbatch.control.runs.store import attempt_numbers

SLURM_STEP = "slurm"
CLIENT_STEP = "client"
EXECUTION = re.compile(r"^execution-(\d+)$")
TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class LogTarget:
    """The file ``logs`` shows and where it sits."""

    shard: int
    attempt: Optional[int]
    execution: Optional[int]
    step: str
    path: Path
    steps: List[str]  # every step with a log in this execution


def latest_execution(attempt_dir: Path) -> Optional[Path]:
    """The newest ``logs/execution-N`` folder of an attempt."""
    try:
        names = [n for n in os.listdir(AttemptLayout(attempt_dir).logs) if EXECUTION.match(n)]
    except FileNotFoundError:
        return None
    if not names:
        return None
    return AttemptLayout(attempt_dir).logs / max(names, key=lambda n: int(n.split("-", 1)[1]))


def step_files(execution: Optional[Path]) -> dict:
    """Step name -> log file in one execution folder."""
    if execution is None:
        return {}
    return {p.name[:-4]: p for p in sorted(execution.glob("*.log"))}


def default_shard(layout: RunLayout, count: int) -> int:
    """The shard a user most likely means: the first failed, else the first running, else 0."""
    scan = shard_scanner(layout)
    views = [scan(i) for i in range(count)]
    for wanted in (states.FAILED, states.RUNNING):
        for view in views:
            if not view.winner and view.attempt and view.attempt.state == wanted:
                return view.index
    return 0


def _default_step(view: ShardView, files: dict, slurm_log: Optional[Path]) -> str:
    match = LOG_IN_REASON.search(view.attempt.reason or "") if view.attempt else None
    if match:
        for step, path in files.items():
            if str(path) == match.group(1):
                return step
    if "client" in files:
        return "client"
    has_slurm = slurm_log is not None and slurm_log.exists()
    return SLURM_STEP if has_slurm or not files else sorted(files)[0]


def shard_index(layout: RunLayout, shard: Optional[int] = None) -> int:
    """``shard``, or the one a user most likely means; NotFound if the run has no such."""
    count = len(load_plan_view(layout).shard_records)
    index = default_shard(layout, count) if shard is None else shard
    if not 0 <= index < count:
        raise NotFound(f"shard {index}: the run has {count} shards (0-{count - 1})")
    return index


def locate(layout: RunLayout, shard: Optional[int] = None,
           step: Optional[str] = None) -> LogTarget:
    """The log to show; NotFound lists the steps that exist when ``step`` is not one."""
    return shard_target(layout, shard_index(layout, shard), step)


def shard_target(layout: RunLayout, index: int, step: Optional[str] = None) -> LogTarget:
    """``locate`` for a known, valid shard index (no plan read)."""
    view = shard_scanner(layout)(index)
    attempt = view.attempt
    # The logs are files in the attempt's folder: they are found by listing it even when
    # the attempt record is damaged (only Slurm's own log needs the record's job id). An
    # attempt folder without any record yet is a retry being created: not looked into.
    numbers = [attempt.number] if attempt else \
        attempt_numbers(layout, index) if view.problem else []
    attempt_dir = layout.attempt(index, numbers[-1]).root if numbers else None
    execution = latest_execution(attempt_dir) if attempt_dir else None
    files = step_files(execution)
    slurm_log = layout.slurm_logs / f"slurm-{attempt.job_id}.out" \
        if attempt and attempt.job_id else None
    steps = sorted(files) + ([SLURM_STEP] if slurm_log and slurm_log.exists() else [])
    chosen = step or _default_step(view, files, slurm_log)
    path = slurm_log if chosen == SLURM_STEP else files.get(chosen)
    if path is None or not path.exists():
        have = ", ".join(steps) or "none yet"
        damaged = f"; {view.problem}" if view.problem else ""
        raise NotFound(f"shard {index}: no log for step {chosen!r} (steps with logs: "
                       f"{have}){damaged}")
    number = int(execution.name.split("-", 1)[1]) if execution else None
    return LogTarget(shard=index, attempt=numbers[-1] if numbers else None,
                     execution=number, step=chosen, path=path, steps=steps)


def await_target(layout: RunLayout, index: int, step: Optional[str] = None,
                 notify: Callable[[str], None] = lambda message: None,
                 sleep: Optional[Callable[[float], None]] = None,
                 backoff: Optional[Backoff] = None) -> LogTarget:
    """``shard_target`` once the log exists, like ``tail -F``: right after submit there is
    none until the job starts. Without ``step`` it waits for the client's log (the run's
    progress), or, once the shard ended without one, takes the log a failure names.
    ``notify`` hears why it waits (once per attempt state); NotFound once the shard ended
    without the log."""
    backoff = backoff or Backoff(base_s=0.5, cap_s=5.0, floor_s=0.2)
    wanted = step or CLIENT_STEP
    said = None
    while True:
        try:
            return shard_target(layout, index, wanted)
        except NotFound:
            if shard_ended(layout, index):
                return shard_target(layout, index, step)  # raises, unless there is one
        view = shard_scanner(layout)(index)
        state = view.attempt.state if view.attempt else "not recorded yet"
        if state != said:
            notify(f"waiting for the {wanted} log of shard {index} (attempt "
                   f"{view.attempt.number if view.attempt else '?'} is {state})")
            said = state
        (sleep or time.sleep)(backoff.next(changed=False))


def newer_target(layout: RunLayout, current: LogTarget) -> Optional[LogTarget]:
    """The same step's log in a newer execution or attempt of the shard (requeue, retry),
    or None while ``current`` is still the latest (or the new one has no such log yet)."""
    try:
        target = shard_target(layout, current.shard, current.step)
    except NotFound:
        return None
    return None if target.path == current.path else target


def shard_ended(layout: RunLayout, shard: int) -> bool:
    """True once the shard has a winner or its latest attempt is terminal."""
    view = shard_scanner(layout)(shard)
    return view.winner or (view.attempt is not None and view.attempt.state in states.TERMINAL)


def _open_log(path: Path) -> BinaryIO:
    """``path`` opened as a run's file may be (``statefile.refusal``: a regular file of
    this user, never through a symlink); DamagedState naming it otherwise."""
    try:
        fd = open_state_file(path)
    except StateError as err:
        raise DamagedState(str(err)) from err
    if fd is None:
        raise NotFound(f"{path}: no such log")
    return os.fdopen(fd, "rb")


def read_tail(path: Path, limit: int = TAIL_BYTES) -> str:
    """The last ``limit`` bytes of a log as text (for ``--json``)."""
    with _open_log(path) as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - limit))
        return handle.read().decode("utf-8", "replace")


def tail_lines(path: Path, count: int, limit: int = TAIL_BYTES) -> List[str]:
    """The last ``count`` non-empty lines of a log, control characters made visible
    (tabs kept); [] when it cannot be read (``status --shard``)."""
    try:
        text = read_tail(path, limit)
    except (OSError, SynthbatchError):
        return []
    lines = [visible(line.rstrip(), "\t") for line in text.splitlines() if line.strip()]
    return lines[-count:]


def copy_from(path: Path, out: BinaryIO, offset: int) -> int:
    """Write ``path`` from ``offset`` to ``out``; return the new offset."""
    with _open_log(path) as handle:
        handle.seek(offset)
        while True:
            chunk = handle.read(1 << 16)
            if not chunk:
                break
            out.write(chunk)
            offset += len(chunk)
    out.flush()
    return offset


def follow(path: Path, out: BinaryIO, done: Callable[[], bool],
           sleep: Callable[[float], None] = time.sleep,
           backoff: Optional[Backoff] = None,
           newer: Optional[Callable[[], Optional[Path]]] = None) -> int:
    """Print ``path`` and keep printing what is appended until ``done()`` and quiet.

    Polls the file (never the scheduler), from 0.2 s backing off to 2 s while idle. While
    the file is quiet, ``newer()`` may name the log that replaced it (the next execution
    after a requeue, or a retry's attempt): the rest of the old file is printed and
    following goes on in the new one from its start.
    """
    backoff = backoff or Backoff(base_s=0.2, cap_s=2.0, floor_s=0.2)
    offset = copy_from(path, out, 0)
    while True:
        grown = os.path.getsize(path) > offset
        if not grown:
            switch = newer() if newer is not None else None
            if switch is not None and switch != path:
                copy_from(path, out, offset)
                path, offset, grown = switch, 0, True
            elif done():
                return copy_from(path, out, offset)
        offset = copy_from(path, out, offset)
        sleep(backoff.next(changed=grown))
