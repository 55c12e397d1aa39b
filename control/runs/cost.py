"""What a run's records cost (issue 32): GPU-hours, money, tokens, per 1,000 records.

Pure: the run's attempts (``AttemptUse``), Slurm accounting's rows (``JobUsage``: one per
execution of a job, requeues included) and the GPUs of each deployment in, a plain
``Figures`` out; ``report`` prices it. The rules (docs/observation.md "What records cost"):

- GPU-hours: every accounted execution, ``ElapsedRaw`` x its ``gres/gpu`` (the same sum as
  ``totals``); a running job's row is its time so far, so the figure is live.
- Wasted: executions of a job that Slurm requeued (every row of a job but its last) and
  every execution of an attempt that ended without winning (failed, cancelled, lost, or
  superseded by a retry). Counted once, inside the total, and said on their own line.
- Records: the valid records of the shards' winning attempts.
- A deployment (model alias) gets the share of each job's GPU-hours its GPUs are of the
  plan's GPUs; an LLM column gets the share of its alias's GPU-hours its tokens (prompt +
  completion, every attempt's) are of the alias's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from synthbatch.agent_stdlib.text import visible
from synthbatch.control.slurm.parsers import JobUsage

Tokens = Tuple[int, int]  # (prompt, completion)


@dataclass(frozen=True)
class AttemptUse:
    """One attempt of one shard as the cost figures need it."""

    shard: int
    attempt: int
    job_id: Optional[str]  # its array task (``12_3``); None: never submitted
    won: bool  # the shard's verified winner names this attempt
    over: bool  # its state is terminal (a running attempt wastes nothing yet)
    records: int = 0  # valid records of a winner
    aliases: Mapping[str, Tokens] = field(default_factory=dict)
    columns: Mapping[str, Mapping[str, Tokens]] = field(default_factory=dict)  # alias ->


@dataclass(frozen=True)
class Part:
    """The figures of one model alias or one LLM column."""

    gpu_hours: Optional[float]
    tokens_in: int
    tokens_out: int
    alias: Optional[str] = None  # a column's alias


@dataclass(frozen=True)
class Figures:
    """A run's cost figures before pricing (``gpu_hours`` None: no accounting); not
    rounded (``report`` rounds what it shows, after pricing and dividing)."""

    gpu_hours: Optional[float]
    wasted_gpu_hours: Optional[float]
    requeued_gpu_hours: Optional[float]
    records: int
    tokens_in: int
    tokens_out: int
    aliases: Dict[str, Part]
    columns: Dict[str, Part]


def _hours(rows: Sequence[JobUsage]) -> float:
    return sum(row.elapsed_s * row.gpus for row in rows) / 3600.0


def figures(uses: Sequence[AttemptUse], rows: Optional[Sequence[JobUsage]],
            gpus: Mapping[str, int]) -> Figures:
    """The figures of a run (``rows`` None: the cluster keeps no accounting; ``gpus``:
    alias -> its GPUs in one allocation, ``replicas`` x ``gpus_per_replica``)."""
    records = sum(u.records for u in uses if u.won)
    alias_tokens: Dict[str, List[int]] = {}
    column_tokens: Dict[str, List[Any]] = {}
    for use in uses:
        for alias, (t_in, t_out) in use.aliases.items():
            total = alias_tokens.setdefault(alias, [0, 0])
            total[0], total[1] = total[0] + t_in, total[1] + t_out
        for alias, columns in use.columns.items():
            for column, (t_in, t_out) in columns.items():
                part = column_tokens.setdefault(column, [alias, 0, 0])
                part[1], part[2] = part[1] + t_in, part[2] + t_out
    tokens_in = sum(t[0] for t in alias_tokens.values())
    tokens_out = sum(t[1] for t in alias_tokens.values())
    if rows is None:
        return Figures(None, None, None, records, tokens_in, tokens_out,
                       {a: Part(None, t[0], t[1]) for a, t in sorted(alias_tokens.items())},
                       {c: Part(None, p[1], p[2], p[0]) for c, p in sorted(column_tokens.items())})
    by_job: Dict[str, List[JobUsage]] = {}
    for row in rows:
        by_job.setdefault(row.job_id, []).append(row)
    requeued = sum(_hours(executions[:-1]) for executions in by_job.values())
    lost = sum(_hours(by_job[u.job_id][-1:]) for u in uses
               if u.over and not u.won and u.job_id in by_job)
    total = _hours(rows)
    aliases, columns = attribute(total, gpus, alias_tokens, column_tokens)
    return Figures(total, requeued + lost, requeued, records, tokens_in, tokens_out, aliases,
                   columns)


def attribute(total: float, gpus: Mapping[str, int], alias_tokens: Mapping[str, Sequence[int]],
              column_tokens: Mapping[str, Sequence[Any]]) -> Tuple[Dict[str, Part],
                                                                   Dict[str, Part]]:
    """Each model alias's and LLM column's share of ``total`` GPU-hours (the rule in the
    module's docstring): ``gpus`` alias -> its GPUs, ``alias_tokens`` alias -> (in, out),
    ``column_tokens`` column -> (alias, in, out)."""
    share = sum(gpus.values())
    alias_hours = {a: total * n / share if share else 0.0 for a, n in gpus.items()}
    aliases = {a: Part(alias_hours.get(a, 0.0), *alias_tokens.get(a, [0, 0]))
               for a in sorted(set(gpus) | set(alias_tokens))}
    columns = {}
    for column, (alias, t_in, t_out) in sorted(column_tokens.items()):
        of_alias = sum(alias_tokens.get(alias, [0, 0]))
        hours = alias_hours.get(alias, 0.0) * (t_in + t_out) / of_alias if of_alias else 0.0
        columns[column] = Part(hours, t_in, t_out, alias)
    return aliases, columns


def per_1000(value: Optional[float], records: int, digits: int = 4) -> Optional[float]:
    """``value`` per 1,000 records (None: unknown, or no record yet), rounded to
    ``digits``: the one rule of every per-1,000 figure (status, card, benchmark)."""
    return round(value * 1000.0 / records, digits) if value is not None and records else None


def _money(hours: Optional[float], price: Optional[float]) -> Optional[float]:
    return hours * price if hours is not None and price is not None else None


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 4)


def part_report(part: Part, records: int, price: Optional[float]) -> Dict[str, Any]:
    """One alias's or column's figures priced at ``price``, as plain data (per 1,000
    ``records`` too)."""
    cost = _money(part.gpu_hours, price)
    out: Dict[str, Any] = {} if part.alias is None else {"alias": part.alias}
    return {**out, "gpu_hours": _round(part.gpu_hours), "cost": _round(cost),
            "tokens_in": part.tokens_in, "tokens_out": part.tokens_out,
            "per_1000_records": {"gpu_hours": per_1000(part.gpu_hours, records),
                                 "cost": per_1000(cost, records),
                                 "tokens_in": per_1000(part.tokens_in, records, 1),
                                 "tokens_out": per_1000(part.tokens_out, records, 1)}}


def report(found: Figures, price: Optional[float], currency: str = "$",
           gpu_hours_from: Optional[str] = None) -> Dict[str, Any]:
    """The figures priced at ``price`` per GPU-hour, as plain data (``--json``'s ``cost``);
    every money figure is None without a price, never 0."""
    records = found.records
    run = part_report(Part(found.gpu_hours, found.tokens_in, found.tokens_out), records, price)
    return {"price_per_gpu_hour": price, "currency": currency if price is not None else None,
            "gpu_hours_from": gpu_hours_from, "records": records, **run,
            "wasted": {"gpu_hours": _round(found.wasted_gpu_hours),
                       "cost": _round(_money(found.wasted_gpu_hours, price)),
                       "requeued_gpu_hours": _round(found.requeued_gpu_hours)},
            "aliases": {a: part_report(p, records, price) for a, p in found.aliases.items()},
            "columns": {c: part_report(p, records, price) for c, p in found.columns.items()}}


def _amount(value: Optional[float], currency: Optional[str]) -> str:
    return "—" if value is None or currency is None else f"{currency}{value:,.2f}"


def lines(cost: Mapping[str, Any]) -> List[str]:
    """``status``'s few human lines of a ``report`` (empty when there is nothing yet)."""
    if not cost or (cost.get("gpu_hours") is None and not cost.get("records")):
        return []
    cur = cost.get("currency")
    per = cost.get("per_1000_records") or {}
    hours = cost.get("gpu_hours")
    out = [f"cost: GPU-hours {'—' if hours is None else hours}"
           f"  cost {_amount(cost.get('cost'), cur)}"
           f"  per 1,000 records: {_fmt(per.get('gpu_hours'))} GPU-hours, "
           f"{_amount(per.get('cost'), cur)}, tokens {_fmt(per.get('tokens_in'))} in / "
           f"{_fmt(per.get('tokens_out'))} out"]
    for kind in ("aliases", "columns"):
        parts = []
        for name, part in (cost.get(kind) or {}).items():
            each = part.get("per_1000_records") or {}
            parts.append(f"{visible(name)} {_fmt(each.get('gpu_hours'))} GPU-h"
                         + (f" {_amount(each.get('cost'), cur)}" if cur else ""))
        if parts:
            out.append(f"  per 1,000 records by {'model' if kind == 'aliases' else 'column'}: "
                       + ", ".join(parts))
    if cost.get("reused_cells"):
        out.append(f"  reused {cost['reused_cells']:,} cells: no GPU time or tokens here "
                   "(counted once, by the runs that made them)")
    wasted = cost.get("wasted") or {}
    if wasted.get("gpu_hours"):
        out.append(f"  wasted on failed attempts and requeues: {wasted['gpu_hours']} GPU-hours"
                   + (f" ({_amount(wasted.get('cost'), cur)})" if cur else ""))
    return out


def _fmt(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:g}"
