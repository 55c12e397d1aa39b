"""The benchmark file: a base run, deployment cases x client concurrency x a record policy,
optional targets (``docs/benchmark.md``)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Dict, List, Optional

from pydantic import Field, model_validator

from synthbatch.agent_stdlib.text import quoted
from synthbatch.control.config.fields import Name, SchemaVersion, Strict


class Records(Strict):
    """Records per point: a fixed count, or a count per unit of concurrency (exactly one)."""

    fixed: Optional[int] = Field(default=None, ge=1, le=10**8)
    per_concurrency: Optional[int] = Field(default=None, ge=1, le=10**6)

    @model_validator(mode="after")
    def _exactly_one(self) -> Records:
        if (self.fixed is None) == (self.per_concurrency is None):
            raise ValueError("give exactly one of fixed or per_concurrency")
        return self

    def at(self, concurrency: int) -> int:
        """The records of the point run at ``concurrency``."""
        return self.fixed if self.fixed is not None else self.per_concurrency * concurrency


class Targets(Strict):
    """What the recommendation sizes: records by a deadline, optionally at most N jobs."""

    records: int = Field(ge=1, le=10**12)
    deadline_hours: float = Field(gt=0, le=100_000)
    max_jobs: Optional[int] = Field(default=None, ge=1, le=1_000_000)


class Case(Strict):
    """One deployment shape: fields merged over the base run's deployments and resources."""

    name: Name
    deployments: Dict[str, Dict[str, Any]] = Field(default_factory=dict)  # alias -> fields
    resources: Dict[str, Any] = Field(default_factory=dict)


class BenchmarkConfig(Strict):
    """A whole benchmark as the user wrote it."""

    schema_version: SchemaVersion
    name: Name
    run: str = Field(min_length=1)  # the base run file, relative to the benchmark file
    concurrency: List[int] = Field(min_length=1, max_length=64)
    records: Records
    cases: List[Case] = Field(min_length=1, max_length=64)
    targets: Optional[Targets] = None

    @model_validator(mode="after")
    def _consistent(self) -> BenchmarkConfig:
        for i, value in enumerate(self.concurrency):
            if not 1 <= value <= 4096:
                raise ValueError(f"concurrency[{i}]: {value} is not in 1..4096")
        if len(set(self.concurrency)) != len(self.concurrency):
            raise ValueError("concurrency: a value is given twice")
        names = [c.name for c in self.cases]
        dupes = sorted(n for n, count in Counter(names).items() if count > 1)
        if dupes:
            raise ValueError(f"cases: name {quoted(dupes[0])} is used twice")
        return self
