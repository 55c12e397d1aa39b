"""Human renderings of status: the summary, the watch frame (bars or grid), plain lines."""

from __future__ import annotations

import re
import time
from typing import Any, Dict, List, Optional, Sequence

from synthbatch.agent_stdlib.states import TERMINAL
from synthbatch.agent_stdlib.text import visible
from synthbatch.control.readapi import cache_line, norm, shard_lines

Status = Dict[str, Any]

LIST_LIMIT = 50  # list every shard up to this many; beyond, failures and counts only
FAILURE_LIMIT = 20
REASON_SHOWN = 300  # a reason's first characters in the summary (its cause comes first)
BAR_LIMIT = 40  # a bar per shard up to this many shards; beyond, a compact grid
BAR_WIDTH = 24
GRID_WIDTH = 64
GLYPH = {state: report.glyph for state, report in norm.REPORT.items()}


def state_cell(states: Sequence[str]) -> re.Pattern[str]:
    """Where a line drawn here has its state column (groups ``lead`` and ``state``): the
    headline (``run ID: STATE``), a shard row, a failure row, a watch bar, a ``runs``
    row. A state word elsewhere (a reason, a note, a multi-line reason's next line that is
    not shaped like a row) is not a state column."""
    word = "(?P<state>" + "|".join(states) + ")"
    return re.compile(r"^(?P<lead>run [^\s:]+: |  shard +\d+  "
                      r"|  shard +\d+ +(?:\[[#.]*\] +)?\d+/\d+ +|[A-Za-z0-9][\w.-]*  +)"
                      + word + r"(?= |$)", re.M)


def duration(seconds: Optional[float]) -> str:
    """``1:02:03`` for seconds, ``-`` when unknown."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def headline(data: Status) -> str:
    """``run ID: STATE  records D/T  shards: N state, ...``."""
    counts = ", ".join(f"{n} {state}" for state, n in data["counts"].items())
    return (f"run {data['run_id']}: {data['state']}  records {data['records_done']}/"
            f"{data['records']}  shards: {counts}")


def metrics(data: Status) -> str:
    """Tokens, rate and ETA on one line; a finished run's numbers instead of rate and ETA;
    the records clients gave up on, and the records dropped (``on_error``), if any."""
    totals = data.get("totals") or {}
    tokens = f"  tokens {data.get('tokens', 0):,}"
    failed = data.get("record_failures", 0)
    dropped = data.get("records_dropped", 0)
    failures = (f"  record failures {failed:,}" if failed else "") + (
        f"  dropped {dropped:,}" if dropped else "")
    if data.get("state") in TERMINAL and totals:
        return tokens + finished_numbers(totals) + failures
    so_far = finished_numbers(totals) if "elapsed_s" in totals else ""
    return (f"{tokens}  rate {data.get('rate', 0.0):.2f} records/s"
            f"  ETA {duration(data.get('eta_s'))}{so_far}{failures}")


def alias_lines(data: Status) -> List[str]:
    """One line per model alias the running generators talk to."""
    lines = []
    for alias, f in (data.get("aliases") or {}).items():
        errors = ", ".join(f"{kind} x{n:,}" for kind, n in sorted(f.get("errors", {}).items()))
        lines.append(f"  model {alias}: {f.get('in_flight', 0):,}/{f.get('concurrency', 0):,}"
                     f" in flight over {f.get('shards', 0)} shard(s), {f.get('requests', 0):,}"
                     f" requests, tokens in {f.get('tokens_in', 0):,} out "
                     f"{f.get('tokens_out', 0):,}" + (f", errors {errors}" if errors else ""))
    return lines


def cost_lines(data: Status) -> List[str]:
    """GPU-hours, cost and tokens per 1,000 records (``control.runs.cost.lines``)."""
    from synthbatch.control.readapi import cost_lines as lines

    return [f"  {line}" for line in lines(data.get("cost") or {})]


def finished_numbers(totals: Dict[str, Any]) -> str:
    """``  elapsed 0:05:00  1.20 records/s  35.2 tokens/s  GPU-hours 0.17`` (so far, while
    the run goes on); ``(active 0:03:20)`` when idle time before a retry is left out of
    the averages."""
    line = f"  elapsed {duration(totals.get('elapsed_s'))}"
    active = totals.get("active_s")
    if active is not None and duration(active) != duration(totals.get("elapsed_s")):
        line += f" (active {duration(active)})"
    if totals.get("records_per_s") is not None:
        line += (f"  {totals['records_per_s']:.2f} records/s  "
                 f"{totals.get('tokens_per_s') or 0:.1f} tokens/s (average)")
    if totals.get("gpu_hours") is not None:
        hours = totals["gpu_hours"]
        line += f"  GPU-hours {hours:.2f}" if hours >= 1 else f"  GPU-hours {hours:.3f}"
    elif totals.get("gpu_hours_from"):
        line += f"  GPU-hours unknown ({totals['gpu_hours_from']})"
    return line


def spans(indices: List[int]) -> str:
    """``0-2,5`` for [0, 1, 2, 5] (the compression ``--array`` uses)."""
    from synthbatch.control.readapi import array_spec

    return array_spec(indices, 0) if indices else ""


def blocked_lines(data: Status) -> List[str]:
    """Pending shards Slurm will not start by themselves: the reason and what to do."""
    lines = []
    for group in data.get("blocked") or []:
        what = "can never start" if group["never"] else "waiting"
        lines.append(f"  {what}: shard(s) {spans(group['shards'])} pending {group['reason']}: "
                     f"{group['hint']}")
    return lines


def backend_lines(data: Status) -> List[str]:
    """``backend local``: where the run's supervisors are and whether they still run."""
    backend = data.get("backend") or {}
    if backend.get("name") != "local":
        return []
    found = backend.get("supervisors", [])
    lines = []
    for item in [i for i in found if i.get("alive")] or found[-1:]:  # else the latest
        where = f"pid {item.get('pid', '?')} on {item.get('host', '?')}"
        if item.get("problem"):
            state = item["problem"]
        elif item.get("alive"):
            state = f"running, heartbeat {item.get('heartbeat_age_s', 0):g} s ago"
        elif item.get("stopped"):
            state = "stopped: its tasks ended"
        elif item.get("alive") is None:
            state, where = "not started", "-"
        else:
            state = "gone"
        lines.append(f"  backend local: job {item['job_id']} supervisor {where} ({state}; "
                     f"log {item.get('log', '?')})")
    return lines or ["  backend local"]


def _notes(data: Status) -> List[str]:
    from synthbatch.control.readapi import reuse_line as line  # issue 31

    reused = line(data.get("reuse"))
    lines = ([f"  {reused}"] if reused else []) + backend_lines(data) + blocked_lines(data)
    if data.get("accounting") is False:
        lines.append("  accounting is disabled on this cluster: using squeue and the agent's "
                     "records only")
    if data.get("scheduler_error"):
        hint = f" (hint: {data['scheduler_hint']})" if data.get("scheduler_hint") else ""
        lines.append(f"  scheduler unavailable: {data['scheduler_error']}{hint}")
    lines.extend(f"  note: {note}" for note in data.get("notes", []))
    lines.extend(f"  serving: {flag}" for flag in data.get("serving_flags") or [])  # issue 32
    return lines + auto_lines(data)


def auto_lines(data: Status) -> List[str]:
    """The pending automatic job (what it will do) and the merge on completion (issue 34)."""
    lines = []
    job = data.get("auto_retry")
    if job:
        does = "merge" if job.get("action") == "merge" else "retry"
        what = job.get("story") or "waits for the shards' jobs to end"
        lines.append(f"  automatic job {job['job_id']} pending ({does}): {what}")
    merge = data.get("merge")
    if merge:
        missing = merge.get("missing_shards") or []
        gone = f"; missing shards: {', '.join(map(str, missing))}" if missing else ""
        why = f" ({merge['reason']})" if merge.get("reason") else ""
        lines.append(f"  merge to {merge.get('to')}: {merge.get('state')}{gone}{why}")
    return lines


def shown(reason: Optional[str]) -> str:
    """A reason as the summary shows it: its first ``REASON_SHOWN`` characters (the agent
    puts the cause first; ``status --shard N`` and ``--json`` show it whole)."""
    if not reason or len(reason) <= REASON_SHOWN:
        return reason or ""
    return reason[: REASON_SHOWN - 1] + "…"


def failure_lines(data: Status) -> List[str]:
    """One line per failure (capped), with the log to read."""
    failures = data.get("failures", [])
    lines = [f"failures ({len(failures)}):"] if failures else []
    for item in failures[:FAILURE_LIMIT]:
        lines.append(f"  shard {item['shard']:>5}  {item['state']:<10} {shown(item['reason'])}")
        if item.get("log"):
            lines.append(f"  {'':>11}log: {item['log']}")
        if len(item.get("reason") or "") > REASON_SHOWN:
            lines.append(f"  {'':>11}whole reason: synthbatch status {data.get('run_id', '')} "
                         f"--shard {item['shard']}")
    if len(failures) > FAILURE_LIMIT:
        lines.append(f"  ... and {len(failures) - FAILURE_LIMIT} more (see --json)")
    return lines


def shard_line(shard: Dict[str, Any], budget: Optional[int] = None) -> str:
    """One shard as a table row (``budget``: the run's max_attempts, "attempt 2 of 3")."""
    reason = f"  {shown(shard['reason'])}" if shard.get("reason") else ""
    of = f" of {budget}" if budget else ""
    return (f"  shard {shard['index']:>5}  {shard['state']:<10} "
            f"{shard['records_done']:>8}/{shard['records']:<8} "
            f"attempt {shard['attempt']}{of}  job {shard['job_id'] or '-'}{reason}")


def status_text(data: Status) -> str:
    """The human rendering of ``status``."""
    lines = [headline(data), metrics(data), *alias_lines(data), *cost_lines(data),
             *_notes(data)]
    if len(data["shards"]) <= LIST_LIMIT:
        lines.extend(shard_line(s, data.get("max_attempts")) for s in data["shards"])
    lines.extend(failure_lines(data))
    return "\n".join(lines)


def shard_text(detail: Dict[str, Any]) -> str:
    """``status --shard N``: the shard's row, its whole reason, and its log's last lines."""
    row = detail["shard"]
    lines = [f"run {detail['run_id']} shard {row['index']}: {row['state']}  records "
             f"{row['records_done']}/{row['records']}  attempt {row['attempt']}"
             f"{' of ' + str(detail['max_attempts']) if detail.get('max_attempts') else ''}"
             f"  job {row['job_id'] or '-'}"]
    if row.get("reason"):
        lines.append(f"reason: {row['reason']}")
    if detail.get("restarts"):
        # not at import: plain status does not load the wire contracts (their import cost)
        from synthbatch.agent_stdlib.contracts import restarts_text

        lines.append(f"restarts: {visible(restarts_text(detail['restarts']))}")
    lines.extend(filter(None, (cache_line(a, f) for a, f in (row.get("aliases") or {}).items())))
    lines.extend(shard_lines(detail.get("serving") or {}))  # issue 32
    if detail.get("log"):
        tail = detail.get("log_tail") or []
        lines.append(f"log: {detail['log']}" + (f" (last {len(tail)} lines)" if tail else
                                                 " (empty or unreadable)"))
        lines.extend(f"  {line}" for line in tail)
    return "\n".join(lines)


def bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    """``[#########.......]`` for ``done`` of ``total``."""
    filled = width if total <= 0 else min(width, done * width // total)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def grid(shards: List[Dict[str, Any]], width: int = GRID_WIDTH) -> List[str]:
    """One glyph per shard, ``width`` per row, and the legend."""
    glyphs = "".join(GLYPH.get(s["state"], "?") for s in shards)
    rows = [f"  {glyphs[i:i + width]}" for i in range(0, len(glyphs), width)]
    legend = "  " + "  ".join(f"{g.strip() or '_'}={s}" for s, g in GLYPH.items())
    return rows + [legend]


def bar_line(shard: Dict[str, Any], width: Optional[int] = None) -> str:
    """One shard's watch row: its bar narrowed (or left out) so that the row, state word
    last, fits in ``width`` columns."""
    head = f"  shard {shard['index']:>3} "
    tail = f" {shard['records_done']:>6}/{shard['records']:<6} {shard['state']}"
    room = BAR_WIDTH if width is None else min(BAR_WIDTH, width - len(head) - len(tail) - 2)
    if room < 4:
        return head + tail[1:]
    return head + bar(shard["records_done"], shard["records"], room) + tail


def frame(data: Status, width: Optional[int] = None) -> List[str]:
    """The ``--watch`` screen: summary, a bar per shard or a grid, failures (bars fit in
    ``width`` columns when given)."""
    lines = [headline(data), metrics(data), *alias_lines(data), *cost_lines(data),
             *_notes(data)]
    shards = data["shards"]
    if len(shards) <= BAR_LIMIT:
        lines.extend(bar_line(s, width) for s in shards)
    else:
        lines.extend(grid(shards))
    lines.extend(failure_lines(data))
    return lines


def pending_part(data: Status) -> str:
    """``  pending: 2 BadConstraints (can never start), 1 Resources``: Slurm's reasons."""
    never = {g["reason"] for g in data.get("blocked") or [] if g.get("never")}
    found = data.get("pending_reasons") or {}
    return "  pending: " + ", ".join(
        f"{n} {reason}" + (" (can never start)" if reason in never else "")
        for reason, n in found.items()) if found else ""


def plain_line(data: Status) -> str:
    """The one-line form of a refresh, for output that is not a terminal."""
    down = f"  scheduler unavailable: {data['scheduler_error']}" \
        if data.get("scheduler_error") else ""
    return f"{headline(data)}{metrics(data)}{pending_part(data)}{down}"


RUNS_HEADER = ("RUN", "STATE", "RECORDS", "SHARDS", "SUBMITTED", "GPU-HOURS", "COST",
               "ELAPSED")


def table(header: Sequence[str], rows: List[Sequence[str]]) -> List[str]:
    """Columns padded to their widest cell (the last one is not padded)."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    return ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip()
            for row in [header, *rows]]


def runs_text(runs: List[Dict[str, Any]]) -> str:
    """``runs``: an aligned table, newest first; a run that cannot be read says why."""
    rows = []
    for run in runs:
        submitted = time.strftime("%Y-%m-%d %H:%M", time.localtime(run["created_at"])) \
            if "created_at" in run else "-"
        records = f"{run['records_done']}/{run['records']}" if "records" in run else "-"
        settled = run.get("counts", {}).get(norm.SUCCEEDED, 0)
        shards = f"{settled}/{run['shards']}" if "shards" in run else "-"
        elapsed = duration(run.get("elapsed_s")) if "elapsed_s" in run else "-"
        note = f"  ({run['problem']})" if run.get("problem") else ""
        hours = run.get("gpu_hours")
        cost = f"{run.get('currency') or ''}{run['cost']:,.2f}" \
            if run.get("cost") is not None else "—"
        state = run.get("story") or run.get("state", "?")  # "retrying (attempt 2 of 3)"
        rows.append((run["run_id"], state, records, shards, submitted,
                     "—" if hours is None else f"{hours:g}", cost, elapsed + note))
    return "\n".join(table(RUNS_HEADER, rows)) if rows else "no runs"
