"""Attempt and readiness states, and the one function that owns every attempt edge.

Depends only on agent_stdlib.errors; both the agent and the control plane use it.
"""

from __future__ import annotations

from typing import Dict, FrozenSet

from agent_stdlib.errors import AgentError

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

READINESS_STATES = (
    "pending",
    "starting",
    "ready",
    "restarting",
    "stopping",
    "stopped",
    "failed",
)
READY_STOPPED, READY_FAILED = "stopped", "failed"
READINESS_CLOSED: FrozenSet[str] = frozenset({READY_STOPPED, READY_FAILED})  # nothing served


class TransitionError(AgentError):
    """An attempt was asked to take an edge that does not exist."""


def check_transition(current: str, new: str) -> None:
    """Raise TransitionError unless ``current -> new`` is a legal attempt edge."""
    if current not in ATTEMPT_EDGES:
        raise TransitionError(f"unknown attempt state {current!r}")
    if new not in ATTEMPT_EDGES[current]:
        raise TransitionError(f"illegal attempt transition {current} -> {new}")
