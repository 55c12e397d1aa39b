"""The run's retry lock: ``flock`` on ``<run>/retry.lock`` (``statefile.locked``), held by
everything that selects shards to run again (retry, the automatic rounds) and by cancel
while it reads the shards, so that they converge on one outcome."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path
from typing import Optional

from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import locked, read_bytes
from synthbatch.control.errors import Conflict

LOCK_WAIT_S = 60.0


class RetryLock:
    """``flock`` on ``<run>/retry.lock``, waited for at most ``wait_s`` (0: try once)."""

    def __init__(self, layout: RunLayout, wait_s: float = LOCK_WAIT_S) -> None:
        self.path: Path = layout.retry_lock
        self.wait_s = wait_s
        self._held: Optional[contextlib.ExitStack] = None

    def __enter__(self) -> RetryLock:
        stack = contextlib.ExitStack()
        fd = stack.enter_context(locked(self.path, self.wait_s))
        if fd is None:
            stack.close()
            holder = (read_bytes(self.path) or b"").decode("utf-8", "replace").strip()
            raise Conflict(f"{self.path}: another retry of this run is in progress "
                           f"({holder or 'holder unknown'})",
                           hint="wait for it, then run status")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                      f"{time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode(), 0)
        self._held = stack
        return self

    def __exit__(self, *exc: object) -> None:
        if self._held is not None:
            self._held.close()  # closing the descriptor releases the flock
            self._held = None
