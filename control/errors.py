"""The control plane's one error hierarchy; each class carries its CLI exit code."""

from __future__ import annotations

from typing import Optional

OK = 0
INTERNAL = 1
INVALID_INPUT = 2
NOT_FOUND = 3
CONFLICT = 4
SCHEDULER_UNAVAILABLE = 5


class SynthbatchError(Exception):
    """Base error: a one-line message, an exit code and an optional hint."""

    exit_code = INTERNAL
    code = "internal"

    def __init__(self, message: str, hint: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class InvalidInput(SynthbatchError):
    """An authored file or an argument is wrong; the message names the field or file."""

    exit_code = INVALID_INPUT
    code = "invalid_input"


class NotFound(SynthbatchError):
    """A run, shard or file that was asked for does not exist."""

    exit_code = NOT_FOUND
    code = "not_found"


class Conflict(SynthbatchError):
    """The request contradicts the durable state (e.g. merge with missing winners)."""

    exit_code = CONFLICT
    code = "conflict"


class SchedulerUnavailable(SynthbatchError):
    """Slurm could not be reached or did not answer in time."""

    exit_code = SCHEDULER_UNAVAILABLE
    code = "scheduler_unavailable"


class SchedulerRejected(SynthbatchError):
    """Slurm answered and refused the request (definite: nothing happened)."""

    exit_code = INVALID_INPUT
    code = "scheduler_rejected"
