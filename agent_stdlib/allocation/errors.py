"""Errors of one allocation: each ends the attempt with its one-line message as reason.

All derive from :class:`agent_stdlib.errors.AgentError`, the one base the controller
catches (``controller.py``); the prefix of the reason says which phase failed.
"""

from __future__ import annotations

from ..errors import AgentError


class AllocationFailure(AgentError):
    """The attempt failed for a reason worth one line in its record."""


class PreflightError(AgentError):
    """The allocation cannot run this attempt (reason prefixed ``preflight:``)."""


class LaunchError(AgentError, ValueError):
    """A step cannot be built (a missing secret, a path outside every mount)."""
