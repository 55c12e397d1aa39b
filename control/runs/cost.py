"""What a run's records cost (issue 32): GPU-hours, money, tokens, per 1,000 records.

``figures`` is pure: the run's attempts (``AttemptUse``), Slurm accounting's rows
(``JobUsage``: one per execution of a job, requeues included) and the GPUs of each
deployment in, a plain ``Figures`` out; ``report`` prices it. The rules
(docs/observation.md "What records cost"):

- GPU-hours: every accounted execution, ``ElapsedRaw`` x its ``gres/gpu`` (the same sum as
  ``totals``); a running job's row is its time so far, so the figure is live.
- Wasted: executions of a job that Slurm requeued (every row of a job but its last) and
  every execution of an attempt that ended without winning (failed, cancelled, lost, or
  superseded by a retry). Counted once, inside the total, and said on their own line.
- Records: the valid records of the shards' winning attempts.
- A deployment (model alias) gets the share of each job's GPU-hours its GPUs are of the
  plan's GPUs; an LLM column gets the share of its alias's GPU-hours its tokens (prompt +
  completion, every attempt's) are of the alias's tokens.

The run's records are read once each (``attempt_uses``: every attempt's ``attempt.json``
and ``progress.json``, each shard's ``winner.json``); a damaged record is left out and
named in ``notes`` (status names it too). A finished run's figures are kept in
``<run>/cost.json`` (before pricing, keyed by the run's job ids, like ``totals.json``), so
later refreshes read one file.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from synthbatch.agent_stdlib.layout import ATTEMPT_JSON, PROGRESS_JSON, RunLayout
from synthbatch.agent_stdlib.statefile import (
    StateError,
    read_json,
    read_json_or_none,
    write_json_atomic,
)
from synthbatch.agent_stdlib.states import TERMINAL
from synthbatch.agent_stdlib.text import visible
from synthbatch.control.config.document import read_document
from synthbatch.control.errors import NotFound, SchedulerUnavailable, SynthbatchError
from synthbatch.control.runs.status.records import (
    PlanView,
    load_plan_view,
    run_job_ids,
    submission_views,
)
from synthbatch.control.runs.status.verdict import FINAL
from synthbatch.control.runs.store import attempt_numbers
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


def count(value: Any) -> int:
    """``value`` if it is a positive int (not a bool), else 0: a tolerant record's count."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _tokens(figures_: Any) -> Tokens:
    if not isinstance(figures_, dict):
        return (0, 0)
    return (count(figures_.get("tokens_in")), count(figures_.get("tokens_out")))


def _progress_tokens(path: str) -> Tuple[Dict[str, Tokens], Dict[str, Dict[str, Tokens]]]:
    """(alias -> tokens, alias -> column -> tokens) of one ``progress.json`` (empty when
    there is none or it is damaged: it is advisory)."""
    aliases = (read_json_or_none(path) or {}).get("aliases")
    if not isinstance(aliases, dict):
        return {}, {}
    columns = {str(a): {str(c): _tokens(t) for c, t in f.get("columns", {}).items()}
               for a, f in aliases.items()
               if isinstance(f, dict) and isinstance(f.get("columns"), dict)}
    return {str(a): _tokens(f) for a, f in aliases.items()}, columns


LIVE_SHARDS = 2000  # above: a running run's per-record cost figures wait for its end


def attempt_uses(layout: RunLayout, shards: int) -> Tuple[List[AttemptUse], List[str]]:
    """Every attempt of the run's ``shards`` shards, and notes on what could not be read
    (the record classes are imported only for a shard's verified winner: a running run's
    status reads its records without them)."""
    uses: List[AttemptUse] = []
    notes: List[str] = []
    for shard in range(shards):
        winner: Any = None
        try:
            if layout.winner_json(shard).exists():
                from synthbatch.agent_stdlib.publish import load_winner

                winner = load_winner(layout, shard)
        except (StateError, OSError) as err:
            notes.append(f"cost: shard {shard}: {err}")
        try:
            numbers = attempt_numbers(layout, shard)
        except OSError as err:
            notes.append(f"cost: shard {shard}: {err}")
            continue
        for number in numbers:
            path = layout.attempt_json_path(shard, number)
            try:
                record = read_json(path)
            except (StateError, OSError, ValueError) as err:
                notes.append(f"cost: shard {shard} attempt {number}: {err}")
                continue
            if record is None:
                continue
            job, state = record.get("job_id"), record.get("state")
            won = winner is not None and winner.attempt == number
            aliases, columns = _progress_tokens(path[:-len(ATTEMPT_JSON)] + PROGRESS_JSON)
            uses.append(AttemptUse(shard, number, job if isinstance(job, str) else None, won,
                                   (isinstance(state, str) and state in TERMINAL) or won,
                                   winner.records if won and winner else 0,
                                   aliases, columns))
    return uses, notes


def _figures_data(found: Figures) -> Dict[str, Any]:
    """``found`` as ``cost.json`` keeps it: each part as ``[gpu_hours, tokens_in,
    tokens_out, alias]``."""
    return {**vars(found), "aliases": {a: astuple(p) for a, p in found.aliases.items()},
            "columns": {c: astuple(p) for c, p in found.columns.items()}}


def _figures_from(data: Any) -> Optional[Figures]:
    try:
        return Figures(data["gpu_hours"], data["wasted_gpu_hours"],
                       data["requeued_gpu_hours"], int(data["records"]),
                       int(data["tokens_in"]), int(data["tokens_out"]),
                       {str(a): Part(*p) for a, p in data["aliases"].items()},
                       {str(c): Part(*p) for c, p in data["columns"].items()})
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # damaged: counted again


def cached(layout: RunLayout, job_ids: Sequence[str]) -> Optional[Figures]:
    """The kept figures of a finished run whose job ids are still ``job_ids``."""
    kept = read_json_or_none(layout.cost_json)
    if kept is None or kept.get("job_ids") != list(job_ids):
        return None
    return _figures_from(kept.get("figures"))


def run_cost(layout: RunLayout, rows: Optional[Sequence[JobUsage]], job_ids: Sequence[str],
             price: Optional[float], currency: str = "$", keep: bool = False,
             gpu_hours_from: Optional[str] = None,
             facts: Optional[Tuple[int, Optional[str], Dict[str, int]]] = None, *,
             kept: Optional[Figures]) -> Dict[str, Any]:
    """The run's priced figures (``report``); ``rows``: accounting's rows of ``job_ids``
    (None: no accounting); ``keep``: the run is over and accounting has every job, so the
    figures are kept in ``cost.json``; ``facts``: ``_plan_facts`` if already read;
    ``kept``: ``cached``'s answer, read by the caller (None: no figures kept).

    A run of more than ``LIVE_SHARDS`` shards that is not over gets its GPU-hours and cost
    so far only: its attempts' records are read once, when it is over (a refresh of a
    100,000-shard run must not open every attempt's files)."""
    found = kept
    notes: List[str] = []
    if found is None:
        shards, _, gpus = facts or _plan_facts(layout)
        if not keep and shards > LIVE_SHARDS:
            uses, notes = [], [f"cost: per-1,000-record figures and the time of failed "
                               f"attempts are counted once the run is over ({shards} "
                               f"shards are not read on every refresh)"]
        else:
            uses, notes = attempt_uses(layout, shards)
        found = figures(uses, rows, gpus)
        if keep and not notes:
            try:
                write_json_atomic(layout.cost_json, {"schema_version": 1,
                                                        "job_ids": list(job_ids),
                                                        "figures": _figures_data(found)})
            except OSError:
                pass  # a read-only run directory: counted again next time
    out = report(found, price, currency, gpu_hours_from)
    if notes:
        out["notes"] = notes[:10]
    return out


def status_cost(layout: RunLayout, summary: Mapping[str, Any], used: Mapping[str, Any],
                job_ids: Optional[Sequence[str]], profile_path: Optional[Path],
                ask: Callable[[], Optional[List[JobUsage]]],
                plan: Optional[PlanView] = None) -> Dict[str, Any]:
    """``status``'s ``cost``: priced by the profile at ``profile_path`` (its ``[pricing]``
    for the run's partition), from the rows ``totals`` got this refresh (``used``), else
    the kept figures, else ``ask()`` (once, for a run counted before these figures were);
    ``reused_cells``: the LLM cells taken from earlier runs (``summary["reuse"]``), which
    cost this run no GPU time and no tokens (counted once: by the runs that made them).
    ``plan``: the refresh's plan view (the settled index keeps one: a large ``plan.json``
    is not read again for the cost)."""
    if job_ids is None:
        job_ids = run_job_ids(submission_views(layout))
    totals = summary.get("totals") or {}
    source = totals.get("gpu_hours_from")
    final = summary.get("state") in FINAL
    rows: Optional[Sequence[JobUsage]]
    kept = cached(layout, job_ids)  # read once a refresh: run_cost prices them
    if "rows" in used:
        rows = used["rows"]
    elif kept is not None or not final or totals.get("gpu_hours") is None:
        rows = None  # the kept figures stand; else Slurm could not be asked
    else:
        try:
            rows = ask()
        except SchedulerUnavailable as err:
            rows, source = None, f"Slurm could not be asked: {err.message}"
    pricing = _pricing(profile_path)
    keep = final and (bool(used.get("complete")) if "rows" in used else rows is not None)
    try:
        facts = _plan_facts(layout, plan)
        price = pricing.price(facts[1]) if pricing is not None else None
        out = run_cost(layout, rows, job_ids, price, pricing.currency if pricing else "$",
                       keep=keep, gpu_hours_from=source, facts=facts, kept=kept)
    except (StateError, OSError) as err:  # a damaged plan: status names it; no figures
        return {"gpu_hours": None, "cost": None, "notes": [f"cost: {err}"]}
    reused = summary.get("reuse") or {}  # issue 31's count: cells no request was made for
    if reused.get("cells_reused"):
        out["reused_cells"] = reused["cells_reused"]
    return out


def _pricing(path: Optional[Path]) -> Optional[Any]:
    """The profile's validated ``[pricing]`` (None: it has none; the validating model is
    imported only then, as the run-reading commands read profiles without it)."""
    if path is None or "pricing" not in read_document(path):
        return None
    from synthbatch.control.config.profile import load_pricing

    return load_pricing(path)


def _plan_facts(layout: RunLayout, plan: Optional[PlanView] = None
                ) -> Tuple[int, Optional[str], Dict[str, int]]:
    """(shards, partition, alias -> GPUs of its deployment) of the run's plan: ``plan`` (a
    refresh's, which the settled index keeps) or ``plan.json`` read as a ``PlanView``."""
    try:
        plan = plan or load_plan_view(layout)
    except (StateError, NotFound) as err:
        raise StateError(f"{layout.plan_json}: unreadable for the cost figures ({err})") \
            from err
    if plan.gpus is None:
        raise StateError(f"{layout.plan_json}: unreadable for the cost figures (its "
                         "deployments)")
    return len(plan.shard_records), plan.partition, plan.gpus


def kept_cost(layout: RunLayout, profile_path: Optional[Path]) -> Dict[str, Any]:
    """``runs``' figures of a run, from what ``status`` kept (no Slurm, no record per
    shard): ``gpu_hours`` and, with a price, ``cost`` (None: not counted yet, or no
    accounting, or not priced)."""
    numbers = (read_json_or_none(layout.totals_json) or {}).get("totals")
    hours = numbers.get("gpu_hours") if isinstance(numbers, dict) else None
    if not isinstance(hours, (int, float)) or isinstance(hours, bool):
        return {"gpu_hours": None, "cost": None}
    price, currency = run_price(layout, profile_path)
    return {"gpu_hours": hours, "cost": round(hours * price, 2) if price is not None else None,
            "currency": currency}


def card_cost(layout: RunLayout) -> Optional[Dict[str, Any]]:
    """The dataset card's cost figures (``report``): the figures ``status`` kept once the
    run was over, priced as the run's own profile (``inputs/profile.toml``) priced them;
    None when status has not counted them yet."""
    try:
        found = cached(layout, run_job_ids(submission_views(layout)))
        if found is None:
            return None
        price, currency = run_price(layout, layout.inputs / "profile.toml")
    except (SynthbatchError, StateError, OSError):
        return None  # the card says GPU-hours from totals.json, or why they are unknown
    return report(found, price, currency or "$")


def run_price(layout: RunLayout, profile_path: Optional[Path]) -> Tuple[Optional[float],
                                                                         Optional[str]]:
    """(price of one GPU-hour, currency) of the run's partition in the profile at
    ``profile_path``; (None, None) when it prices none or the plan cannot be read."""
    pricing = _pricing(profile_path)
    try:
        price = pricing.price(_plan_facts(layout)[1]) if pricing is not None else None
    except StateError:
        price = None
    return (price, pricing.currency) if price is not None and pricing else (None, None)
