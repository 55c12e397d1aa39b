"""Typed results of the Python API (``control.api``): plan, status, merge, runs.

Each is a frozen dataclass over the data ``--json`` prints: the fields a script reads are
typed attributes, ``data`` keeps the whole object (new keys included) and ``to_dict()``
returns it. ``from_dict`` reads only what it types, so a key added to the JSON later
never breaks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, Optional, Tuple

from synthbatch.agent_stdlib.states import CANCELLED, FAILED, SUCCEEDED
from synthbatch.control.runs.status.rows import ShardRow

Data = Dict[str, Any]


def _picked(cls: Any, data: Data, **made: Any) -> Any:
    """``cls`` over ``data``: each typed field read by its name (absent: its default),
    except those ``made`` gives."""
    names = {f.name for f in fields(cls)} - {"data"} - set(made)
    return cls(data=data, **{n: data[n] for n in names if n in data}, **made)


@dataclass(frozen=True)
class Result:
    """Base: the JSON object behind the typed fields."""

    data: Data = field(repr=False, compare=False)

    def to_dict(self) -> Data:
        """What ``--json`` prints."""
        return self.data


@dataclass(frozen=True)
class Check:
    """One login-node check of ``plan``: error, warning, node (checked there) or ok."""

    level: str
    field: str
    message: str


@dataclass(frozen=True)
class PlanResult(Result):
    """``plan``: the resolved run, its summary and script, and what the checks found."""

    run_id: str = ""
    name: str = ""
    shards: int = 0
    records: int = 0
    plan_sha256: str = ""
    summary: str = ""
    script: str = ""
    checks: Tuple[Check, ...] = ()
    overrides: Dict[str, str] = field(default_factory=dict)
    layout: Tuple[Dict[str, Any], ...] = ()  # what the automatic layout chose, and why

    @property
    def errors(self) -> Tuple[Check, ...]:
        """The checks that make ``submit`` refuse."""
        return tuple(c for c in self.checks if c.level == "error")

    @property
    def warnings(self) -> Tuple[Check, ...]:
        """The checks ``submit`` keeps in ``run.json``."""
        return tuple(c for c in self.checks if c.level == "warning")

    @property
    def ok(self) -> bool:
        """True when nothing stops a submit."""
        return not self.errors

    @classmethod
    def from_dict(cls, data: Data) -> PlanResult:
        """From ``plan --json``'s object."""
        plan = data.get("plan", {})
        return _picked(cls, data, run_id=plan.get("run_id", ""), name=plan.get("name", ""),
                       checks=tuple(Check(c["level"], c["field"], c["message"])
                                    for c in data.get("checks", [])),
                       overrides=dict(data.get("overrides", {})),
                       layout=tuple(data.get("layout", ())))


@dataclass(frozen=True)
class Failure:
    """A shard that failed, was lost or cancelled with a reason, and the log to read."""

    shard: int
    state: str
    reason: Optional[str]
    log: Optional[str]


@dataclass(frozen=True)
class RunStatus(Result):
    """``status`` (and ``wait``): the run's state, records, rate, failures, shards.

    ``elapsed_s``, ``records_per_s``, ``tokens_per_s`` and ``gpu_hours`` are a finished
    run's numbers (``gpu_hours`` from Slurm accounting; None without it).
    """

    run_id: str = ""
    name: str = ""
    state: str = ""
    records: int = 0
    records_done: int = 0
    tokens: int = 0
    rate: float = 0.0
    eta_s: Optional[float] = None
    counts: Dict[str, int] = field(default_factory=dict)
    notes: Tuple[str, ...] = ()
    scheduler_error: Optional[str] = None
    elapsed_s: Optional[float] = None
    records_per_s: Optional[float] = None
    tokens_per_s: Optional[float] = None
    gpu_hours: Optional[float] = None

    @property
    def finished(self) -> bool:
        """True once the run cannot change by itself (succeeded, failed, cancelled)."""
        return self.state in (SUCCEEDED, FAILED, CANCELLED)

    @property
    def succeeded(self) -> bool:
        """True when every shard succeeded."""
        return self.state == SUCCEEDED

    @property
    def failures(self) -> Tuple[Failure, ...]:
        """Failed, lost and cancelled shards with their reasons and logs (built when read:
        a run of 10,000 shards pays nothing for what it does not look at)."""
        return tuple(Failure(f["shard"], f["state"], f.get("reason"), f.get("log"))
                     for f in self.data.get("failures", []))

    @property
    def cost(self) -> Dict[str, Any]:
        """GPU-hours, cost and tokens so far, per 1,000 records, per model alias and per
        LLM column, and what failed attempts wasted (docs/observation.md "What records
        cost"); money figures are None without a price in the profile."""
        return dict(self.data.get("cost") or {})

    @property
    def shards(self) -> Tuple[ShardRow, ...]:
        """Every shard: status's read model (built when read)."""
        return tuple(map(ShardRow.from_dict, self.data.get("shards", [])))

    @classmethod
    def from_dict(cls, data: Data) -> RunStatus:
        """From ``status --json``'s object."""
        numbers = data.get("totals") or {}
        return _picked(cls, data, counts=dict(data.get("counts", {})),
                       notes=tuple(data.get("notes", [])),
                       **{k: numbers.get(k) for k in (
                           "elapsed_s", "records_per_s", "tokens_per_s", "gpu_hours")})


@dataclass(frozen=True)
class MergeResult(Result):
    """``merge``: where the records went, how many, and which shards were left out."""

    output: str = ""
    manifest: str = ""
    records: int = 0
    sha256: str = ""  # the manifest's digest: files_sha256 (jsonl), the file's (parquet)
    complete: bool = False
    missing_shards: Tuple[int, ...] = ()

    @classmethod
    def from_dict(cls, data: Data) -> MergeResult:
        """From ``merge --json``'s object."""
        return _picked(cls, data, sha256=data.get("files_sha256") or data.get("sha256", ""),
                       complete=bool(data.get("complete")),
                       missing_shards=tuple(data.get("missing_shards", [])))


@dataclass(frozen=True)
class RunSummary(Result):
    """One run in ``runs``: from its directory alone (no Slurm)."""

    run_id: str = ""
    name: str = ""
    state: str = ""
    created_at: float = 0.0
    shards: int = 0
    records: Optional[int] = None
    records_done: Optional[int] = None
    elapsed_s: Optional[float] = None
    problem: Optional[str] = None
    gpu_hours: Optional[float] = None  # as status kept it once the run was over
    cost: Optional[float] = None  # gpu_hours x the profile's price (None: not priced)
    story: Optional[str] = None  # "retrying (attempt 2 of 3)", "merging" (issue 34)

    @classmethod
    def from_dict(cls, data: Data) -> RunSummary:
        """From one item of ``runs --json``."""
        return _picked(cls, data)
