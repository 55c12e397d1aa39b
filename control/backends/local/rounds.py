"""The local backend's automatic rounds (issue 34): no plain jobs, so the supervisor does it.

On Slurm a small CPU-only job runs each round after the run's arrays
(``control.runs.autoretry``). The local scheduler has no such jobs: once every task of its
job has ended, and before it records itself stopped (so ``status`` and ``wait`` see the
round pending while it runs), the supervisor of a job of a run with automatic jobs
(``<run>/auto/round.json``) starts the same round, ``python -I -m
synthbatch.control.cli.autoround``, naming its job in ``ROUND_JOB_ENV``; the round runs only
when the run's record names that job (``autoretry.due_locally``), retries, records the
next job that owes a round (the retry's job), or merges in place.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import IO, List, Mapping, Optional

from synthbatch.agent_stdlib.layout import RunLayout

ROUND_JOB_ENV = "SYNTHBATCH_LOCAL_ROUND_JOB"  # the job whose supervisor runs the round
TIMEOUT_S = 2 * 3600  # as the merge job's time limit on Slurm


def argv(python: str, run_root: Path) -> List[str]:
    """The round's command: the control plane's Python, the run's workspace and id."""
    return [python, "-I", "-m", "synthbatch.control.cli.autoround", "--workspace",
            str(run_root.parent.parent), run_root.name]


def run_round(python: str, run_root: Path, job_id: str, env: Mapping[str, str],
              log: Optional[IO[bytes]] = None) -> Optional[int]:
    """Start the round for ``job_id`` when its run has automatic jobs; its exit status
    (None: the run has none)."""
    if not RunLayout(run_root).round_json.is_file():
        return None
    done = subprocess.run(argv(python, run_root), env={**env, ROUND_JOB_ENV: job_id},
                          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                          cwd="/", timeout=TIMEOUT_S, check=False)
    return done.returncode
