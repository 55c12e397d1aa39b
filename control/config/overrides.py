"""Slurm-style overrides on the command line: the fields people change per run.

``plan`` and ``submit`` take ``-p/--partition``, ``-A/--account``, ``-q/--qos``,
``-t/--time``, ``--reservation``, ``--gpus``, ``--deadline`` and ``--pilot``; each is checked
with the field's own rule and beats the profile (``--time`` also beats the run file's
``resources.time_limit``; ``--gpus``, ``--deadline``, ``--pilot`` are its
``resources.gpus``, ``deadline_hours``, ``pilot``: the automatic layout's budget, deadline
and measured pilot).
The plan records the values in effect; ``run.json`` records which came from the command
line.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated, Dict, Optional, Tuple

from pydantic import Field, TypeAdapter, ValidationError

from synthbatch.control.config.fields import Name, TimeLimit
from synthbatch.control.config.profile import Profile
from synthbatch.control.config.run import BenchmarkId, RunConfig
from synthbatch.control.errors import InvalidInput

# field -> (option, the rule its value follows)
OPTIONS = {"partition": ("--partition", Name), "account": ("--account", Name),
           "qos": ("--qos", Name), "time_limit": ("--time", TimeLimit),
           "reservation": ("--reservation", Name),
           "gpus": ("--gpus", Annotated[int, Field(ge=1, le=4096)]),
           "deadline_hours": ("--deadline", Annotated[float, Field(gt=0, le=8760)]),
           "pilot": ("--pilot", BenchmarkId)}
# the run's [resources], not the profile
RUN_FIELDS = ("time_limit", "gpus", "deadline_hours", "pilot")


@dataclass(frozen=True)
class Overrides:
    """Values given on the command line (None: not given)."""

    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time_limit: Optional[str] = None
    reservation: Optional[str] = None
    gpus: Optional[int] = None
    deadline_hours: Optional[float] = None
    pilot: Optional[str] = None

    def __post_init__(self) -> None:
        for name, (option, rule) in OPTIONS.items():
            given = getattr(self, name)
            if given is None:
                continue
            try:
                value = TypeAdapter(rule).validate_python(given)
            except ValidationError as err:
                why = err.errors()[0]["msg"].removeprefix("Value error, ")
                raise InvalidInput(f"{option}: {why}") from err
            object.__setattr__(self, name, value)  # run.json keeps "64"; the run, 64

    def to_dict(self) -> Dict[str, str]:
        """The values given, by field name, as text (what run.json records)."""
        return {f.name: str(getattr(self, f.name)) for f in fields(self)
                if getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, data: Optional[Dict[str, str]]) -> Overrides:
        """From ``to_dict``'s form (or None); InvalidInput names an unknown field."""
        data = dict(data or {})
        unknown = sorted(set(data) - set(OPTIONS))
        if unknown:
            raise InvalidInput(f"overrides: {unknown[0]!r} is not one of "
                               f"{', '.join(OPTIONS)}")
        return cls(**data)

    def apply(self, profile: Profile, run: RunConfig) -> Tuple[Profile, RunConfig]:
        """The profile and run with the overrides in effect."""
        given = {f.name: getattr(self, f.name) for f in fields(self)
                 if getattr(self, f.name) is not None}
        resources = {name: given.pop(name) for name in RUN_FIELDS if name in given}
        if given:
            profile = profile.model_copy(update=given)
        if resources:
            run = run.model_copy(update={"resources": run.resources.model_copy(
                update=resources)})
        return profile, run
