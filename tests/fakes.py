"""Fakes shared by test modules (import them from here, never from another test module)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, List

from agent_stdlib.contracts import ReadinessRecord
from agent_stdlib.statefile import write_json_atomic


class Crash(Exception):
    """Stands for a process dying between two of its steps."""


def crash_on_call(real: Callable[..., Any], number: int) -> Callable[..., Any]:
    """``real``, except that its ``number``-th call raises Crash instead of running."""
    calls: List[int] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == number:
            raise Crash(f"died at call {number} of {getattr(real, '__name__', real)}")
        return real(*args, **kwargs)

    return wrapper


def write_readiness(path: Path, shard: int, attempt: int, execution: int, state: str,
                    revision: int = 1, **fields: Any) -> ReadinessRecord:
    """A ``readiness.json`` as an agent left it, written as it is (no edge check): a test's
    starting point, such as an allocation found ``ready`` after its agent vanished."""
    record = ReadinessRecord(shard=shard, attempt=attempt, execution=execution, state=state,
                             revision=revision, updated_at=time.time(), **fields)
    write_json_atomic(path, record.to_dict())
    return record
