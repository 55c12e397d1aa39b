"""Termination signal coordinator: handlers only record; the main loop acts."""

from __future__ import annotations

import signal
from typing import List, Optional

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)


class Interrupted(Exception):
    """Raised by ``SignalCoordinator.check`` once a termination signal has arrived."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


class SignalCoordinator:
    """Records termination signals; ``check()`` turns the first one into Interrupted."""

    def __init__(self) -> None:
        self.received: List[int] = []
        self._deferred = False

    def install(self) -> None:
        """Install the recording handler for every handled signal."""
        for signum in HANDLED:
            signal.signal(signum, self._record)

    def _record(self, signum: int, _frame: object) -> None:
        self.received.append(signum)

    @property
    def first(self) -> Optional[int]:
        """The first signal received, if any."""
        return self.received[0] if self.received else None

    def defer(self) -> None:
        """Stop raising from ``check`` (cleanup is running; a second signal changes nothing)."""
        self._deferred = True

    def check(self) -> None:
        """Raise Interrupted if a signal arrived and cleanup has not started."""
        if self.received and not self._deferred:
            raise Interrupted(self.received[0])
