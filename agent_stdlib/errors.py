"""The one base of every error the agent raises on purpose (standard library only).

Each error carries a one-line message naming what is wrong (a field, a file, a step).
The allocation controller turns any :class:`AgentError` into the attempt's failure reason
(``allocation/controller.py``); anything else is reported as an internal error. The
shared records' errors (state files, contracts, attempt edges, candidates, arrays) derive
from it too, so the control plane may catch them one by one while the agent catches one
base. Signals (``allocation/signals.Interrupted``) and HTTP parse errors of the proxy are
not errors of an attempt and stay apart.
"""

from __future__ import annotations


class AgentError(Exception):
    """A failure the agent expects and can name in one line."""
