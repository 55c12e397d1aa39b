"""Attempt and readiness states, and the one table of legal edges of each.

Depends only on agent_stdlib.errors; both the agent and the control plane use it.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, Optional

from .errors import AgentError

CREATED = "created"
SUBMITTED = "submitted"
PENDING = "pending"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"

ATTEMPT_STATES = (CREATED, SUBMITTED, PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLED)
TERMINAL: FrozenSet[str] = frozenset({SUCCEEDED, FAILED, CANCELLED})

# Every legal attempt edge. Anything not listed is a bug or a stale writer.
ATTEMPT_EDGES: Dict[str, FrozenSet[str]] = {
    CREATED: frozenset({SUBMITTED, CANCELLED, FAILED}),  # sbatch accepted / run abandoned
    SUBMITTED: frozenset({PENDING, RUNNING, CANCELLED, FAILED}),  # queued / agent started
    PENDING: frozenset({RUNNING, CANCELLED, FAILED}),  # agent started / never ran
    RUNNING: frozenset({RUNNING, SUCCEEDED, FAILED, CANCELLED}),  # requeue epoch / outcome
    SUCCEEDED: frozenset(),
    FAILED: frozenset(),
    CANCELLED: frozenset(),
}

# Readiness: what one execution of an attempt is serving (``readiness.json``, revisioned).
READY_PENDING = "pending"
READY_STARTING = "starting"  # first execution: preflight and servers starting
READY_RESTARTING = "restarting"  # a later execution (requeue) of a running attempt
READY = "ready"  # every replica answered its probe; endpoints are published
READY_STOPPING = "stopping"  # cleanup has begun
READY_STOPPED = "stopped"  # every managed process confirmed gone
READY_FAILED = "failed"  # cleanup could not confirm that, or the agent vanished (status)
READINESS_STATES = (READY_PENDING, READY_STARTING, READY, READY_RESTARTING, READY_STOPPING,
                    READY_STOPPED, READY_FAILED)
READINESS_CLOSED: FrozenSet[str] = frozenset({READY_STOPPED, READY_FAILED})  # nothing served
BEGIN = frozenset({READY_STARTING, READY_RESTARTING})  # how an execution opens

# Every legal readiness edge; ``None`` is "no readiness.json yet". An execution opens with
# starting/restarting and ends stopped or failed. A new execution (a requeue) may open from
# any state, since the one before may have vanished at any point (kill -9, node failure);
# ``failed`` is reachable from every open state: status closes out the readiness of an
# allocation whose agent vanished.
READINESS_EDGES: Dict[Optional[str], FrozenSet[str]] = {
    None: BEGIN | {READY_PENDING},
    READY_PENDING: BEGIN | {READY_STOPPING, READY_FAILED},
    READY_STARTING: BEGIN | {READY, READY_STOPPING, READY_FAILED},
    READY_RESTARTING: BEGIN | {READY, READY_STOPPING, READY_FAILED},
    READY: BEGIN | {READY_STOPPING, READY_FAILED},
    READY_STOPPING: BEGIN | {READY_STOPPED, READY_FAILED},
    READY_STOPPED: BEGIN,
    READY_FAILED: BEGIN,
}


class TransitionError(AgentError):
    """An attempt was asked to take an edge that does not exist."""


def check_transition(current: str, new: str) -> None:
    """Raise TransitionError unless ``current -> new`` is a legal attempt edge."""
    if current not in ATTEMPT_EDGES:
        raise TransitionError(f"unknown attempt state {current!r}")
    if new not in ATTEMPT_EDGES[current]:
        raise TransitionError(f"illegal attempt transition {current} -> {new}")


def check_readiness(current: Optional[str], new: str) -> None:
    """Raise TransitionError unless ``current -> new`` is a legal readiness edge."""
    if current not in READINESS_EDGES:
        raise TransitionError(f"unknown readiness state {current!r}")
    if new not in READINESS_EDGES[current]:
        raise TransitionError(f"illegal readiness transition {current or 'none'} -> {new}")
