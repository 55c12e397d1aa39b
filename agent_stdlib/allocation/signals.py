"""Termination signal coordinator: handlers only record; the main loop acts.

Owned by the entrypoint, installed once, and passed explicitly to whoever must react:

* ``check()`` raises :class:`Interrupted` for the first signal at a safe point of the
  main loop (never from inside a handler);
* ``critical()`` wraps "spawn a child and register it": a signal arriving inside is held
  and replayed when the block ends, so no child can escape registration;
* ``defer()`` marks the start of cleanup: later signals change nothing except that a
  SIGTERM/SIGINT makes ``urgent`` true, which shortens the remaining grace.

SIGUSR1 (``#SBATCH --signal=B:USR1@lead``) means "time limit or preemption soon": it is a
request to stop gracefully, not a demand to die now.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator, List, Optional

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
HARD = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})


class Interrupted(Exception):
    """Raised by ``SignalCoordinator.check`` once a termination signal has arrived."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def soft(self) -> bool:
        """True for SIGUSR1: stop gracefully, keep partial output, maybe requeue."""
        return self.signum == signal.SIGUSR1


class SignalCoordinator:
    """Records termination signals; the owner decides when and how to act on them."""

    def __init__(self) -> None:
        self.received: List[int] = []
        self._held: List[int] = []
        self._critical = 0
        self._deferred = False
        self._installed = False

    def install(self) -> None:
        """Install the recording handler for every handled signal (once per process)."""
        if self._installed:
            raise RuntimeError("signal coordinator already installed")
        for signum in HANDLED:
            signal.signal(signum, self._record)
        self._installed = True

    def _record(self, signum: int, _frame: object) -> None:
        (self._held if self._critical else self.received).append(signum)

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        """Hold signals while a child is spawned and registered; replay them afterwards."""
        self._critical += 1
        try:
            yield
        finally:
            self._critical -= 1
            if not self._critical and self._held:
                self.received.extend(self._held)
                self._held.clear()

    @property
    def first(self) -> Optional[int]:
        """The first signal received, if any."""
        return self.received[0] if self.received else None

    @property
    def urgent(self) -> bool:
        """True once a hard signal (TERM/INT/HUP) arrived: Slurm's KillWait is running."""
        return any(s in HARD for s in self.received)

    def defer(self) -> None:
        """Stop raising from ``check`` (cleanup is running; a second signal changes nothing)."""
        self._deferred = True

    def check(self) -> None:
        """Raise Interrupted if a signal arrived and cleanup has not started."""
        if self.received and not self._deferred and not self._critical:
            raise Interrupted(self.received[0])
