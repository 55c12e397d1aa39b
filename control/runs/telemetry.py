"""Serving telemetry as status shows it (issue 32): per replica, flags, where time goes;
and the restarts inside a shard's allocation (``status --shard N``).

The agent writes ``telemetry.json`` per attempt (``agent_stdlib/allocation/telemetry.py``).
Here, pure functions turn those records into what ``status`` says: the last values per
replica (``status --shard N``), a flag per idle or saturated model alias across the
running shards (``status``), and where a shard's time went. Every threshold is below.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Tuple

from synthbatch.agent_stdlib import states
from synthbatch.agent_stdlib.layout import AttemptLayout, RunLayout
from synthbatch.agent_stdlib.statefile import StateError, load_record
from synthbatch.control.errors import one_line

if TYPE_CHECKING:  # the record classes load only when a file is read: status stays light
    from synthbatch.agent_stdlib.contracts import ProgressRecord, TelemetryRecord
    from synthbatch.control.runs.status.rows import ShardRow

# ---- thresholds (the one place)
WINDOW_POINTS = 12  # the flags look at the last 12 samples (a minute at 5 s)
MIN_POINTS = 3  # fewer samples per replica than this: no saturation flag yet
# idle is only said over a whole window per replica (the client's first requests come a
# moment after the servers are ready)
IDLE_BUSY = 0.10  # busy (share of samples with a request running) below this ...
IDLE_WAITING = 0.0  # ... and never more than this waiting: over-provisioned
SATURATED_WAITING = 4.0  # mean requests waiting per replica at or above this: saturated
SATURATED_KV = 0.95  # or the KV cache at least this full (mean over the window)
FRESH_S = 60.0  # telemetry older than this (agent gone) is not flagged
FLAG_SHARDS = 8  # status reads at most this many running shards' telemetry, evenly spread

# Indices of contracts.TELEMETRY_SERIES (test_telemetry checks they name the same order).
RUNNING, WAITING, KV, TOK_S, IN_FLIGHT = range(5)


def read(path: Path) -> Tuple[Optional[TelemetryRecord], Optional[str]]:
    """(the record, None) or (None, why it cannot be read) — a damaged file is said, not
    raised; a missing one is (None, None)."""
    try:
        from synthbatch.agent_stdlib.contracts import TelemetryRecord

        return load_record(path, TelemetryRecord), None
    except StateError as err:
        return None, one_line(str(err), 300)


@dataclass(frozen=True)
class AliasLoad:
    """One alias's load over the flag window, across the shards sampled."""

    alias: str
    replicas: int
    points: int  # replica-samples in the window
    busy: float  # share of replica-samples with at least one request running
    waiting: float  # mean requests waiting per replica
    kv: Optional[float]  # mean KV-cache usage (None: not exported)


def alias_loads(records: Iterable[TelemetryRecord]) -> List[AliasLoad]:
    """Each alias's load over the last ``WINDOW_POINTS`` samples of every record."""
    acc: Dict[str, Dict[str, Any]] = {}
    for record in records:
        aliases = [r.alias for r in record.replicas]
        for alias in aliases:
            acc.setdefault(alias, {"replicas": 0, "n": 0, "busy": 0, "waiting": 0.0,
                                   "kv": []})["replicas"] += 1
        for pt in record.series[-WINDOW_POINTS:]:
            for alias, values in zip(aliases, pt.values):
                entry = acc[alias]
                running = values[RUNNING]
                if running is None:
                    continue
                entry["n"] += 1
                entry["busy"] += running > 0
                entry["waiting"] += values[WAITING] or 0.0
                if values[KV] is not None:
                    entry["kv"].append(values[KV])
    return [AliasLoad(alias=a, replicas=e["replicas"], points=e["n"],
                      busy=e["busy"] / e["n"] if e["n"] else 0.0,
                      waiting=e["waiting"] / e["n"] if e["n"] else 0.0,
                      kv=sum(e["kv"]) / len(e["kv"]) if e["kv"] else None)
            for a, e in sorted(acc.items())]


def flag(load: AliasLoad) -> Optional[str]:
    """``gen: KV cache 98%, 120 waiting — add replicas``, ``judge: 2 replicas, 4% busy, 0
    waiting — over-provisioned``, or None (too few samples, or neither)."""
    if load.points < MIN_POINTS * max(1, load.replicas):
        return None
    waiting_total = load.waiting * load.replicas
    if load.waiting >= SATURATED_WAITING or (load.kv is not None and load.kv >= SATURATED_KV):
        kv = f"KV cache {load.kv:.0%}, " if load.kv is not None else ""
        return f"{load.alias}: {kv}{waiting_total:.0f} waiting — add replicas"
    if load.busy < IDLE_BUSY and load.waiting <= IDLE_WAITING \
            and load.points >= WINDOW_POINTS * load.replicas:
        noun = "replica" if load.replicas == 1 else "replicas"
        return (f"{load.alias}: {load.replicas} {noun}, {load.busy:.0%} busy, "
                f"{waiting_total:.0f} waiting — over-provisioned")
    return None


def flags(records: Iterable[TelemetryRecord]) -> List[str]:
    """The flags of every alias the records sample."""
    return [f for f in (flag(load) for load in alias_loads(records)) if f]


def replica_rows(record: TelemetryRecord) -> List[Dict[str, Any]]:
    """The last values per replica, as ``status --shard N`` and ``--json`` show them."""
    rows = []
    for r in record.replicas:
        proxy = record.proxies.get(r.alias)
        rows.append({**asdict(r), "proxy_429s": proxy.responses_429 if proxy else None,
                     "proxy_retries": proxy.retries if proxy else None})
    return rows


def time_split(record: Optional[TelemetryRecord], progress: Optional[ProgressRecord],
               submitted_at: Optional[float], now: float) -> Dict[str, Optional[float]]:
    """Where one execution's time went, in seconds (None: not reached or not known):
    queue (submitted -> job start), servers (job start -> every server ready), first record
    (ready -> first record settled), generation (first record -> stopping, or now), and
    shutdown (stopping -> everything gone)."""
    start, ready, stopping, stopped = (record.started_at, record.ready_at, record.stopping_at,
                                       record.stopped_at) if record else (None,) * 4
    first = progress.first_record_at if progress else None

    def span(a: Optional[float], b: Optional[float]) -> Optional[float]:
        return round(max(0.0, b - a), 1) if a is not None and b is not None else None

    return {"queue_s": span(submitted_at, start), "servers_s": span(start, ready),
            "first_record_s": span(ready, first),
            "generation_s": span(first, stopping if stopping is not None else
                                 (now if start is not None and stopped is None else None)),
            "shutdown_s": span(stopping, stopped)}


def latency_split(record: Optional[TelemetryRecord],
                  progress: Optional[ProgressRecord]) -> List[Dict[str, Any]]:
    """Per LLM column: answers, mean latency as the client measured it (sent -> answer),
    the alias's mean proxy queue time (arrival at the proxy -> forwarded to a replica),
    and the rest (``engine_s``: the column's mean minus that queue time: the engine's
    own queue and generation, and the loopback transport); per alias also the engine time
    the proxy measured (``alias_engine_s``, forwarded -> response written)."""
    rows: List[Dict[str, Any]] = []
    if progress is None:
        return rows
    for alias, figures in sorted(progress.aliases.items()):
        proxy = record.proxies.get(alias) if record is not None else None
        queue = proxy.queue_s / proxy.timed if proxy and proxy.timed else None
        upstream = proxy.upstream_s / proxy.timed if proxy and proxy.timed else None
        for column, part in sorted(figures.columns.items()):
            answers = part.requests
            if answers <= 0:
                continue
            mean = part.latency_s / answers
            rows.append({"column": column, "alias": alias, "answers": answers,
                         "mean_s": round(mean, 4),
                         "proxy_queue_s": None if queue is None else round(queue, 4),
                         "engine_s": None if queue is None else round(max(0.0, mean - queue),
                                                                     4),
                         "alias_engine_s": None if upstream is None else round(upstream, 4)})
    return rows


def _num(value: Optional[float], fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def shard_lines(detail: Dict[str, Any]) -> List[str]:
    """``status --shard N``'s serving lines (from ``shard_telemetry``'s data)."""
    lines = []
    split = detail.get("time") or {}
    if any(v is not None for v in split.values()):
        names = (("queue_s", "queue"), ("servers_s", "servers ready"),
                 ("first_record_s", "first record"), ("generation_s", "generation"),
                 ("shutdown_s", "shutdown"))
        lines.append("time: " + ", ".join(f"{label} {_num(split.get(key), '{:.1f}')}s"
                                          for key, label in names
                                          if split.get(key) is not None))
    if detail.get("latency"):
        lines.append("latency per LLM column:")
    for row in detail.get("latency") or []:
        lines.append(f"  {one_line(row['column'], 60)} ({one_line(row['alias'], 40)}): "
                     f"{row['answers']} answers, mean {_ms(row['mean_s'])} ms = proxy queue "
                     f"{_ms(row['proxy_queue_s'])} ms + engine {_ms(row['engine_s'])} ms")
    if detail.get("replicas"):
        lines.append("serving (last sample):")
    for row in detail.get("replicas") or []:
        text = (f"  {one_line(row['alias'], 40)} {one_line(row['url'], 120)}: "
                f"{_num(row['running'])} running, {_num(row['waiting'])} waiting, "
                f"KV {_num(row['kv_cache_usage'], '{:.0%}')}, "
                f"prefix hits {_num(row['prefix_hit_rate'], '{:.0%}')}, "
                f"{_num(row['gen_tokens_per_s'], '{:.1f}')} tok/s, proxy in flight "
                f"{_num(row['proxy_in_flight'])}, 429s {_num(row['proxy_429s'])}")
        if row.get("error"):
            text += f" (last sample: {one_line(row['error'], 120)})"
        lines.append(text)
    if detail.get("problem"):
        lines.append(f"telemetry: {detail['problem']}")
    return lines


def serving_figures(attempt_root: Path, progress: Optional[ProgressRecord],
                    now: float) -> Dict[str, Any]:
    """A benchmark point's ``time`` (``time_split``, without the queue) and
    ``latency_split``, from its attempt's folder (``benchmark analyze``)."""
    found = shard_telemetry(attempt_root, progress, None, now)
    return {"time": found["time"], "latency_split": found["latency"]}


def shard_telemetry(attempt_root: Path, progress: Optional[ProgressRecord],
                    submitted_at: Optional[float], now: float) -> Dict[str, Any]:
    """One attempt's serving data for ``status --shard N``: ``replicas``, ``time``,
    ``flags`` and ``problem`` (a damaged telemetry file)."""
    record, problem = read(AttemptLayout(attempt_root).telemetry_json)
    return {"replicas": replica_rows(record) if record else [],
            "time": time_split(record, progress, submitted_at, now),
            "flags": flags([record]) if record else [],
            "latency": latency_split(record, progress),
            "problem": problem}


def _load(path: Path, cls: Any) -> Any:
    try:
        return load_record(path, cls)
    except (StateError, OSError):
        return None


def restart_counts(layout: RunLayout, shard: int, attempt: Optional[int]) -> Dict[str, int]:
    """What the latest execution of ``attempt`` restarted inside its allocation, and how
    often, as the agent counted it in ``readiness.json`` (``ReadinessRecord.restarts``,
    ``agent_stdlib/allocation/restarts.py``); ``{}``: nothing, no attempt yet, or a
    readiness record that cannot be read."""
    if not attempt:
        return {}
    from synthbatch.agent_stdlib.contracts import ReadinessRecord

    record = _load(layout.attempt(shard, attempt).readiness_json, ReadinessRecord)
    return dict(record.restarts) if record is not None else {}


def shard_serving(layout: RunLayout, shard: int, attempt: Optional[int],
                  now: float) -> Dict[str, Any]:
    """``shard_telemetry`` of a shard's attempt, read from the run directory."""
    if attempt is None:
        return shard_telemetry(layout.root / "none", None, None, now)
    from synthbatch.agent_stdlib.contracts import (
        AttemptRecord,
        ProgressRecord,
        SubmissionRecord,
    )

    paths = layout.attempt(shard, attempt)
    record = _load(paths.attempt_json, AttemptRecord)
    submission = _load(layout.submission_json(record.submission), SubmissionRecord) \
        if record is not None and record.submission is not None else None
    return shard_telemetry(paths.root, _load(paths.progress_json, ProgressRecord),
                           submission.submitted_at if submission else None, now)


def run_flags(layout: RunLayout, rows: Iterable[ShardRow], now: float) -> List[str]:
    """The flags across the running shards (``rows``: status rows; fresh telemetry only),
    read from at most ``FLAG_SHARDS`` of them, evenly spread (a refresh of 10,000 running
    shards opens 8 more files, not 10,000)."""
    running = [r for r in rows if r.state == states.RUNNING and r.attempt is not None]
    step = max(1, -(-len(running) // FLAG_SHARDS))
    records = []
    for row in running[::step]:
        record, _ = read(layout.attempt(row.index, row.attempt).telemetry_json)
        if record is not None and now - record.updated_at <= FRESH_S:
            records.append(record)
    return flags(records)
