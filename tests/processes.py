"""Which processes are still alive: the leftover-process checks of every suite."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List


def processes_mentioning(*needles: str) -> List[str]:
    """``pid: command line`` of live processes (not this one) containing any of ``needles``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if any(n in cmd for n in needles):
            found.append(f"{entry.name}: {cmd}")
    return found
