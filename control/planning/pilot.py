"""A measured pilot for the automatic layout, and the deadline it sizes (pure: the
benchmark's state is read by ``control/benchmark/pilot.py``).

A pilot is one finished point of a ``synthbatch benchmark`` of the same models. From its
records it measures, per alias, a record's **work** in GPU-seconds:

    work[a] = completion tokens per record of a x service seconds per token of a
              x GPUs of one replica of a

where the service seconds per token are the ``SERVICE_PERCENTILE`` percentile of each
request's ``latency_ms / completion_tokens`` (the least queued requests: queueing behind a
bottleneck is not the model's cost). It assumes every replica batches the same number of
requests at once (the engine's batch), as the estimate does. The split then gives each
deployment GPUs in proportion to its measured work instead of tokens x active parameters.

For a deadline it also gives the allocation's records/s: the point's measured records/s,
scaled by how much more the new layout's bottleneck deployment can do than the pilot's
(``min over a of GPUs[a] / work[a]``, new against pilot). ``shards_for_deadline`` turns
that into shards (each one job of the layout's GPUs), with ``size`` of
``control/planning/sizing.py`` (the rule ``benchmark analyze`` sizes jobs with).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from synthbatch.control.planning.layout import LayoutError
from synthbatch.control.planning.sizing import percentile, size

SERVICE_PERCENTILE = 10.0


@dataclass(frozen=True)
class Pilot:
    """What one benchmark point measured."""

    benchmark_id: str
    case: str
    concurrency: int
    records: int
    records_per_s: float
    boot_s: float  # ready -> first record (the model load is not in it)
    error_rate: float
    gpus: Dict[str, int]  # per alias: the GPUs of all its replicas in the pilot
    replica_gpus: Dict[str, int]  # per alias: GPUs of one replica in the pilot
    tokens: Dict[str, float]  # per alias: completion tokens per record
    seconds_per_token: Dict[str, float]  # per alias: service time of one token

    def work(self, alias: str) -> float:
        """GPU-seconds of a record on ``alias`` (see the module's rule)."""
        return (self.tokens[alias] * self.seconds_per_token[alias]
                * self.replica_gpus[alias])

    def describe(self, alias: str) -> str:
        """Where ``alias``'s work comes from, for the plan's line."""
        return (f"measured by pilot {self.benchmark_id} ({self.case} @ concurrency "
                f"{self.concurrency}): {self.tokens[alias]:.0f} tokens a record x "
                f"{self.seconds_per_token[alias] * 1000:.1f} ms a token (p"
                f"{SERVICE_PERCENTILE:g}) x {self.replica_gpus[alias]} GPU(s) a replica = "
                f"{self.work(alias):.3g} GPU-s a record")

    def rate(self, gpus: Mapping[str, int]) -> float:
        """Records/s of an allocation giving each alias ``gpus[alias]`` GPUs: the pilot's
        records/s x (the new bottleneck's capacity / the pilot's)."""
        def capacity(given: Mapping[str, int]) -> float:
            return min(given[a] / self.work(a) for a in self.tokens)
        return self.records_per_s * capacity(gpus) / capacity(self.gpus)


class PilotError(ValueError):
    """A pilot that cannot be used; the message says why in one line."""


def measure(benchmark_id: str, row: Mapping[str, Any], deployments: Mapping[str, Tuple[int,
            int]], cells: Iterable[Mapping[str, Any]]) -> Pilot:
    """A pilot from one benchmark point: its ``row`` (``analyze.point``), its deployments
    (alias -> (GPUs a replica, replicas)) and its records' request cells (each with
    ``model``, ``latency_ms`` and ``usage.completion_tokens``)."""
    records = row.get("records") or 0
    rate = row.get("records_per_s")
    if not records or not rate:
        raise PilotError(f"{row.get('case')} @ concurrency {row.get('concurrency')}: "
                         "no records/s measured")
    tokens: Dict[str, float] = {}
    per_token: Dict[str, list] = {}
    for cell in cells:
        alias, latency = cell.get("model"), cell.get("latency_ms")
        usage = cell.get("usage")
        out = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if (not isinstance(alias, str) or isinstance(out, bool) or not isinstance(out, int)
                or out <= 0 or not isinstance(latency, (int, float))):
            continue
        tokens[alias] = tokens.get(alias, 0.0) + out
        per_token.setdefault(alias, []).append(float(latency) / 1000.0 / out)
    missing = sorted(set(deployments) - set(per_token))
    if missing:
        raise PilotError(f"no request of {missing[0]!r} with latency_ms and usage in the "
                         "records (a recipe's records carry them in _meta)")
    seconds = {a: percentile(v, SERVICE_PERCENTILE) or 0.0 for a, v in per_token.items()}
    zero = sorted(a for a in deployments if seconds[a] <= 0)
    if zero:
        raise PilotError(f"{zero[0]!r}: no time measured per token")
    return Pilot(benchmark_id=benchmark_id, case=str(row.get("case")),
                 concurrency=int(row.get("concurrency") or 0), records=int(records),
                 records_per_s=float(rate), boot_s=float(row.get("boot_s") or 0.0),
                 error_rate=float(row.get("error_rate") or 0.0),
                 gpus={a: g * r for a, (g, r) in deployments.items()},
                 replica_gpus={a: g for a, (g, _) in deployments.items()},
                 tokens={a: tokens[a] / records for a in deployments},
                 seconds_per_token={a: seconds[a] for a in deployments})


@dataclass(frozen=True)
class DeadlineShards:
    """The shards a deadline asks for, and why."""

    count: int
    reason: str


def shards_for_deadline(records: int, deadline_hours: float, rate: float, gpus: int,
                        boot_s: float, error_rate: float, shards: int,
                        throttle: Optional[int], source: str,
                        time_limit_s: Optional[float] = None) -> DeadlineShards:
    """Shards (one job of ``gpus`` GPUs each, all at once) that make ``records`` within the
    deadline at ``rate`` records/s a job; never fewer than ``shards`` (the run's), nor
    than fit each in the jobs' ``time_limit_s``. A deadline that cannot be met is a
    LayoutError saying how many GPUs it would need."""
    row = {"case": "run", "concurrency": 0, "records_per_s": rate, "boot_s": boot_s,
           "gpus": gpus, "error_rate": error_rate}
    sized = size(row, {"deadline_hours": deadline_hours, "records": records})
    where = "resources.deadline_hours"
    if not sized["feasible"]:
        raise LayoutError(where, f"{deadline_hours:g} h cannot be met: {sized['why']}")
    jobs = sized["jobs"]
    if time_limit_s is not None and time_limit_s < deadline_hours * 3600:
        if time_limit_s <= boot_s:
            raise LayoutError(where, f"the time limit ({time_limit_s:.0f} s) is not longer "
                              f"than the boot ({boot_s:.0f} s)")
        jobs = max(jobs, math.ceil(records / (rate * (time_limit_s - boot_s))))
    need = (f"{records} records in {deadline_hours:g} h need {jobs} job(s) of {gpus} GPU(s) "
            f"at once ({jobs * gpus} GPUs) at {rate:.3g} records/s a job ({source})")
    if jobs > records:
        raise LayoutError(where, f"{need}: more jobs than records")
    if throttle and throttle < jobs:
        raise LayoutError(where, f"{need}, but the array runs at most {throttle} at once "
                          f"(shards.throttle / array_throttle): {throttle * gpus} GPUs")
    count = max(jobs, shards)
    wall = boot_s + records / count / rate
    raised = f"; shards {shards} -> {count}" if count > shards else f"; shards {count}"
    return DeadlineShards(count, f"deadline {deadline_hours:g} h: {need}; each shard "
                          f"~{wall / 3600:.2f} h with boot {boot_s:.0f} s (the model load "
                          f"is not in it: keep slack){raised}")


def shard_count(records: int, count: Optional[int], per_shard: Optional[int]) -> int:
    """The shards a run's ``[shards]`` makes."""
    return count if count is not None else math.ceil(records / (per_shard or records))
