"""The local backend's automatic rounds (issue 34): no plain jobs, so the supervisor does it.

On Slurm a small CPU-only job runs each round after the run's arrays
(``control.runs.autoretry``). The local scheduler has no such jobs: the supervisor of a job
that the run's round record (``<run>/auto/round.json``) names runs the same round
(``python -I -m synthbatch.control.cli.autoround``) once every task of its job has ended,
before it records itself stopped, so ``status`` and ``wait`` see the round pending while
it runs. The round retries, records the next job that owes a round (the retry's job), or
merges in place; a supervisor that was asked to stop (cancel, SIGTERM) runs none.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import IO, List, Mapping, Optional

from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.control.runs import autoretry

TIMEOUT_S = 2 * 3600  # as the merge job's time limit on Slurm


def due(run_root: Path, job_id: str) -> bool:
    """Whether the run's recorded round is this job's to run (it names the job)."""
    pending = autoretry.load_pending(RunLayout(run_root))
    if not pending or pending.get("action") == autoretry.MERGE:
        return False
    return pending["job_id"] == job_id or job_id in (pending.get("after") or [])


def argv(python: str, run_root: Path) -> List[str]:
    """The round's command: the control plane's Python, the run's workspace and id."""
    return [python, "-I", "-m", "synthbatch.control.cli.autoround", "--workspace",
            str(run_root.parent.parent), run_root.name]


def run_round(python: str, run_root: Path, job_id: str, env: Mapping[str, str],
              log: Optional[IO[bytes]] = None) -> Optional[int]:
    """Run the round when it is due for ``job_id``; its exit status (None: not due)."""
    if not (run_root / "auto").is_dir() or not due(run_root, job_id):
        return None
    done = subprocess.run(argv(python, run_root), env={**env, autoretry.LOCAL_ROUND_JOB: job_id},
                          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                          cwd="/", timeout=TIMEOUT_S, check=False)
    return done.returncode
