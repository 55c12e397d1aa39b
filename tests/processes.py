"""Which processes are still alive: the leftover-process checks of every suite."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional


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


def agent_of(run_dir: Path, job_id: str) -> Optional[int]:
    """The pid of the allocation agent (``agent-<sha>.pyz allocation``) of array task
    ``job_id`` (``12_1``) of the run in ``run_dir``."""
    job, task = job_id.split("_")
    wanted = {f"SLURM_ARRAY_JOB_ID={job}".encode(), f"SLURM_ARRAY_TASK_ID={task}".encode()}
    for line in processes_mentioning(str(run_dir)):
        pid, cmd = line.split(": ", 1)
        if ".pyz allocation " not in cmd or "srun" in cmd:
            continue
        try:
            environ = set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if wanted <= environ:
            return int(pid)
    return None
