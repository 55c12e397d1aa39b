"""Fakes shared by test modules (import them from here, never from another test module)."""

from __future__ import annotations

from typing import Any, Callable, List


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
