"""Human renderings of status: the summary, the watch frame (bars or grid), plain lines."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

Status = Dict[str, Any]

LIST_LIMIT = 50  # list every shard up to this many; beyond, failures and counts only
FAILURE_LIMIT = 20
BAR_LIMIT = 40  # a bar per shard up to this many shards; beyond, a compact grid
BAR_WIDTH = 24
GRID_WIDTH = 64
GLYPH = {"succeeded": "#", "running": ">", "cancelling": "x", "pending": ".",
         "created": " ", "failed": "F", "cancelled": "C", "lost": "L", "unknown": "?"}


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
    """Tokens, rate and ETA on one line (and dropped records, when there are)."""
    dropped = data.get("records_dropped", 0)
    return (f"  tokens {data.get('tokens', 0):,}  rate {data.get('rate', 0.0):.2f} records/s"
            f"  ETA {duration(data.get('eta_s'))}"
            + (f"  dropped {dropped:,}" if dropped else ""))


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


def _notes(data: Status) -> List[str]:
    lines = []
    if data.get("accounting") is False:
        lines.append("  accounting is disabled on this cluster: using squeue and the agent's "
                     "records only")
    if data.get("scheduler_error"):
        hint = f" (hint: {data['scheduler_hint']})" if data.get("scheduler_hint") else ""
        lines.append(f"  scheduler unavailable: {data['scheduler_error']}{hint}")
    lines.extend(f"  note: {note}" for note in data.get("notes", []))
    return lines


def failure_lines(data: Status) -> List[str]:
    """One line per failure (capped), with the log to read."""
    failures = data.get("failures", [])
    lines = [f"failures ({len(failures)}):"] if failures else []
    for item in failures[:FAILURE_LIMIT]:
        lines.append(f"  shard {item['shard']:>5}  {item['state']:<10} {item['reason'] or ''}")
        if item.get("log"):
            lines.append(f"  {'':>11}log: {item['log']}")
    if len(failures) > FAILURE_LIMIT:
        lines.append(f"  ... and {len(failures) - FAILURE_LIMIT} more (see --json)")
    return lines


def shard_line(shard: Dict[str, Any]) -> str:
    """One shard as a table row."""
    reason = f"  {shard['reason']}" if shard.get("reason") else ""
    return (f"  shard {shard['index']:>5}  {shard['state']:<10} "
            f"{shard['records_done']:>8}/{shard['records']:<8} "
            f"attempt {shard['attempt']}  job {shard['job_id'] or '-'}{reason}")


def status_text(data: Status) -> str:
    """The human rendering of ``status``."""
    lines = [headline(data), metrics(data), *alias_lines(data), *_notes(data)]
    if len(data["shards"]) <= LIST_LIMIT:
        lines.extend(shard_line(s) for s in data["shards"])
    lines.extend(failure_lines(data))
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


def frame(data: Status) -> List[str]:
    """The ``--watch`` screen: summary, a bar per shard or a grid, failures."""
    lines = [headline(data), metrics(data), *alias_lines(data), *_notes(data)]
    shards = data["shards"]
    if len(shards) <= BAR_LIMIT:
        lines.extend(f"  shard {s['index']:>3} {bar(s['records_done'], s['records'])} "
                     f"{s['records_done']:>6}/{s['records']:<6} {s['state']}" for s in shards)
    else:
        lines.extend(grid(shards))
    lines.extend(failure_lines(data))
    return lines


def plain_line(data: Status) -> str:
    """The one-line form of a refresh, for output that is not a terminal."""
    down = f"  scheduler unavailable: {data['scheduler_error']}" \
        if data.get("scheduler_error") else ""
    return f"{headline(data)}{metrics(data)}{down}"


def runs_text(runs: List[Dict[str, Any]]) -> str:
    """``runs``: one line per run, newest first."""
    lines = []
    for run in runs:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(run.get("created_at", 0)))
        lines.append(f"{run['run_id']}  {run.get('state', '?'):<11} {created}  "
                     f"{run.get('shards', '?')} shards" +
                     (f"  ({run['problem']})" if run.get("problem") else ""))
    return "\n".join(lines) or "no runs"
