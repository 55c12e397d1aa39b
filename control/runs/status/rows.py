"""The read model: one ``ShardRow`` per shard, built from its records in one place.

A shard's records, read tolerantly (``records.ShardView``: the verified winner, the latest
attempt, its progress) and the verdict of the one table (``verdict.Verdict``) make one
``ShardRow`` (``shard_row``). Status, watch, wait, runs, the automatic rounds, the API's
``RunStatus.shards`` and the settled index deal in it; ``to_dict`` is the row
``status --json`` prints, ``from_dict`` reads one back (the index's lines, an API result).
A named tuple: 100,000 of them are built in one refresh (a frozen dataclass costs twice
as much).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Dict, NamedTuple, Optional

from synthbatch.control.errors import MAX_REASON, one_line
from synthbatch.control.runs.status import verdict as norm

if TYPE_CHECKING:
    from synthbatch.agent_stdlib.layout import RunLayout
    from synthbatch.control.runs.status.records import ShardView

# the agent's "(log PATH: ..." or, for a replica across nodes, "(srun status N; log PATH, rank"
LOG_IN_REASON = re.compile(r"(?:\(|; )log (/[^\s:),]+)")
COUNTS = ("records", "records_done", "records_dropped", "tokens", "record_failures")


class ShardRow(NamedTuple):
    """One shard as status shows it: its state and reason, the attempt that decided it,
    its records and tokens; ``log`` for a shard that may have failed, ``aliases`` (the
    built-in generator's figures per model alias) for a running one."""

    index: int
    state: str
    reason: Optional[str]
    attempt: Optional[int]
    job_id: Optional[str]
    records: int
    records_done: int = 0
    records_dropped: int = 0
    tokens: int = 0
    record_failures: int = 0
    log: Optional[str] = None
    aliases: Optional[Dict[str, Dict[str, Any]]] = None

    def to_dict(self) -> Dict[str, Any]:
        """The row ``status --json`` prints (``log`` only where a failure may be,
        ``aliases`` only where there are some)."""
        row: Dict[str, Any] = {
            "index": self.index, "state": self.state, "reason": self.reason,
            "attempt": self.attempt, "job_id": self.job_id, "records": self.records,
            "records_done": self.records_done, "records_dropped": self.records_dropped,
            "tokens": self.tokens, "record_failures": self.record_failures,
        }
        if self.aliases is not None:
            row["aliases"] = self.aliases
        if self.state in norm.MAYBE_FAILED:
            row["log"] = self.log
        return row

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> ShardRow:
        """A row as ``to_dict`` made it (fields it does not know are ignored; a missing
        count is 0)."""
        get = data.get
        return cls(data["index"], data["state"], get("reason"), get("attempt"),
                   get("job_id"), get("records", 0), get("records_done", 0),
                   get("records_dropped", 0), get("tokens", 0), get("record_failures", 0),
                   get("log"), get("aliases"))


def log_path(layout: RunLayout, shard: ShardView, reason: Optional[str]) -> Optional[str]:
    """The log a failure points at: the one named in the reason, else Slurm's output."""
    match = LOG_IN_REASON.search(reason or "")
    if match:
        return match.group(1)
    job = shard.attempt.job_id if shard.attempt else None
    if job:
        path = layout.slurm_logs / f"slurm-{job}.out"
        if path.exists():
            return str(path)
    return None


def shard_row(layout: RunLayout, shard: ShardView, size: int,
              verdict: norm.Verdict) -> ShardRow:
    """The one place a shard's row is made: its records (``shard``), its size in the plan
    and the verdict of the table."""
    attempt, progress = shard.attempt, shard.progress
    state = verdict.state
    done = size if state == norm.SUCCEEDED else (progress.records_done if progress else 0)
    reason = verdict.reason
    if reason is None and state not in norm.FINAL and shard.progress_problem:
        reason = one_line(shard.progress_problem, MAX_REASON)  # advisory: only shown, never decides
    return ShardRow(
        shard.index, state, reason,
        attempt.number if attempt else shard.winner_attempt,
        attempt.job_id if attempt else None,
        size, min(done, size),
        progress.dropped if progress else 0,
        progress.tokens if progress else 0,
        progress.failures if progress else 0,
        log_path(layout, shard, verdict.reason) if state in norm.MAYBE_FAILED else None,
        progress.aliases if progress is not None and progress.aliases
        and state == norm.RUNNING else None)
