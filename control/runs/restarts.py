"""Restarts inside the allocation as ``status --shard N`` shows them.

The agent counts them in the attempt's ``readiness.json`` (``ReadinessRecord.restarts``,
``agent_stdlib/allocation/restarts.py``); this reads them back, tolerating damage.
"""

from __future__ import annotations

from typing import Dict, Optional

from synthbatch.agent_stdlib.attempts import load_readiness
from synthbatch.agent_stdlib.contracts import ContractError
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import StateError


def restart_counts(layout: RunLayout, shard: int, attempt: Optional[int]) -> Dict[str, int]:
    """What the latest execution of ``attempt`` restarted, and how often (``{}``: nothing,
    no attempt yet, or a readiness record that cannot be read)."""
    if not attempt:
        return {}
    try:
        record = load_readiness(layout.attempt(shard, attempt).readiness_json)
    except (StateError, ContractError, OSError):
        return {}
    return dict(record.restarts) if record is not None else {}
