"""The control plane's one error hierarchy; each class carries its CLI exit code.

Also ``one_line``: the redaction, escaping and capping every message goes through.
"""

from __future__ import annotations

import functools
from typing import Optional, Sequence

from synthbatch.agent_stdlib.text import visible
from synthbatch.control.secrets import redact_text

# Exit statuses of every command (README and docs/observation.md list them).
OK = 0  # done; for ``wait`` and ``submit --wait``: every shard succeeded
INTERNAL = 1
INVALID_INPUT = 2
NOT_FOUND = 3
CONFLICT = 4
SCHEDULER_UNAVAILABLE = 5
RUN_FAILED = 6  # the run ended and a shard failed (or was lost)
RUN_CANCELLED = 7  # the run ended, no shard failed, at least one was cancelled
STILL_RUNNING = 8  # ``wait --timeout`` passed before the run ended
RUN_STUCK = 9  # the run cannot end: every open shard pends with a reason Slurm keeps

MAX_MESSAGE = 500
# a failure reason read from a record: kept whole (the agent's are a few KB, cause first);
# the cap only bounds what a damaged or hostile file can make status carry and print
MAX_REASON = 16 * 1024
REDACTED = "***"


def redact(text: str) -> str:
    """``text`` with secret values (tokens, ``--api-key`` values, URL userinfo) replaced
    by ``***``; the rules are ``control.secrets``'s."""
    return redact_text(text, REDACTED)


@functools.lru_cache(maxsize=4096)  # status repeats the same few reasons thousands of times
def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` redacted, on one line, control characters made visible, at most ``limit``
    characters: every message and every reason quoted from a state file or a log."""
    flat = visible(" ".join(redact(str(text)).split()))
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class SynthbatchError(Exception):
    """Base error: a one-line message, an exit code, an optional hint and ``details``
    (one line per problem, when there are several)."""

    exit_code = INTERNAL
    code = "internal"

    def __init__(self, message: str, hint: Optional[str] = None,
                 details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = tuple(details)


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


class DamagedState(Conflict):
    """A state file the command needs is unreadable, half-published or off-contract (the
    message names it): a run-level record (``plan.json``, ``run.json``) or a record a
    command that changes state must trust. Readers report per-shard damage instead."""

    code = "damaged_state"


class EvidenceConflict(Conflict):
    """Two sources of terminal evidence about one job disagree; the message names both."""

    code = "conflicting_evidence"


class SchedulerUnavailable(SynthbatchError):
    """Slurm could not be reached, or answered with something unusable."""

    exit_code = SCHEDULER_UNAVAILABLE
    code = "scheduler_unavailable"


class SchedulerUncertain(SchedulerUnavailable):
    """A command's effect is unknown (timeout, garbled answer): it may have happened."""

    code = "scheduler_uncertain"


class SchedulerRejected(SynthbatchError):
    """Slurm answered and refused the request (definite: nothing happened)."""

    exit_code = INVALID_INPUT
    code = "scheduler_rejected"


class RunFailed(SynthbatchError):
    """The run being waited for ended with failed (or lost) shards."""

    exit_code = RUN_FAILED
    code = "run_failed"


class RunCancelled(SynthbatchError):
    """The run being waited for ended with cancelled shards and no failed one."""

    exit_code = RUN_CANCELLED
    code = "run_cancelled"


class RunStuck(SynthbatchError):
    """The run being waited for cannot end by itself: every shard that is not over pends
    with a reason Slurm calls permanent (``control.runs.status.pending``)."""

    exit_code = RUN_STUCK
    code = "run_stuck"


class StillRunning(SynthbatchError):
    """The wait's time limit passed before the run ended."""

    exit_code = STILL_RUNNING
    code = "still_running"
