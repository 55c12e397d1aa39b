"""Where every state file of a run lives, and what a run's directory and jobs are called.

One place so that the control plane and the agent can never disagree about a path: only
this module builds ``<workspace>/runs/<run-id>`` and ``synthbatch-<run-id>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

JOB_PREFIX = "synthbatch-"

# File names that bulk readers match without a Path (the properties below use them too).
RUN_JSON = "run.json"
PLAN_JSON = "plan.json"
WINNER_JSON = "winner.json"
ATTEMPT_JSON = "attempt.json"
PROGRESS_JSON = "progress.json"


def runs_root(workspace: Union[str, Path]) -> Path:
    """``<workspace>/runs``: one folder per run."""
    return Path(workspace) / "runs"


def run_dir(workspace: Union[str, Path], run_id: str) -> Path:
    """``<workspace>/runs/<run-id>``."""
    return runs_root(workspace) / run_id


def bundle_cache(workspace: Union[str, Path]) -> Path:
    """``<workspace>/.cache/bundles``: the built agent bundles (``control/bundle.py``)."""
    return Path(workspace) / ".cache" / "bundles"


def benchmarks_root(workspace: Union[str, Path]) -> Path:
    """``<workspace>/benchmarks``: one folder per benchmark."""
    return Path(workspace) / "benchmarks"


def images_registry(workspace: Union[str, Path]) -> Path:
    """``<workspace>/images.json``: the workspace's image registry (its lock beside it,
    ``images.json.lock``)."""
    return Path(workspace) / "images.json"


def local_backend_root(workspace: Union[str, Path]) -> Path:
    """``<workspace>/local``: the local backend's job table."""
    return Path(workspace) / "local"


def job_name(run_id: str) -> str:
    """The Slurm job name of every job of a run (finds unrecorded submissions by name)."""
    return JOB_PREFIX + run_id


def shard_name(shard: int) -> str:
    """``shard-00012``: the folder of a shard under ``shards/``."""
    return f"shard-{shard:05d}"


# The attempt a submit makes of every shard. It has no folder and no ``attempt.json``
# until its agent starts it (or cancel/status ends it): its submission record implies its
# first revision (``attempts.implied_attempt``). A retry's attempts (2, 3, ...) always have
# a ``created`` record before any submission record names them.
FIRST_ATTEMPT = 1


ATTEMPTS = "attempts"  # a shard's folder of attempt folders
_ATTEMPT_PREFIX = "attempt-"


def attempt_name(attempt: int) -> str:
    """``attempt-0002``: the folder of an attempt under ``shards/shard-NNNNN/attempts/``."""
    return f"{_ATTEMPT_PREFIX}{attempt:04d}"


def attempt_number(name: str) -> Optional[int]:
    """The number of an attempt folder's name (``attempt-0002`` -> 2); None for any other
    name (four or more ASCII digits, as :func:`attempt_name` writes them)."""
    digits = name[len(_ATTEMPT_PREFIX):]
    if not name.startswith(_ATTEMPT_PREFIX) or len(digits) < 4 or \
            not (digits.isascii() and digits.isdigit()):
        return None
    return int(digits)


def attempt_path(shard_folder: str, attempt: int) -> str:
    """``<shard folder>/attempts/attempt-NNNN`` as a string (bulk readers skip Path)."""
    return f"{shard_folder}/{ATTEMPTS}/{attempt_name(attempt)}"


@dataclass(frozen=True)
class RunLayout:
    """Paths inside ``<workspace>/runs/<run-id>/``."""

    root: Path

    @property
    def run_json(self) -> Path:
        """The commit marker, written last at submit."""
        return self.root / RUN_JSON

    @property
    def plan_json(self) -> Path:
        """The immutable resolved plan."""
        return self.root / PLAN_JSON

    @property
    def inputs(self) -> Path:
        """Exact copies of the authored files."""
        return self.root / "inputs"

    @property
    def submissions(self) -> Path:
        """One record and one batch script per sbatch call."""
        return self.root / "submissions"

    @property
    def slurm_logs(self) -> Path:
        """Slurm's own stdout/stderr of batch scripts."""
        return self.root / "logs"

    @property
    def image_hashes(self) -> Path:
        """Digests of container images, reused by later array tasks (allocation/imagehash.py)."""
        return self.root / "image-hashes"

    @property
    def merged(self) -> Path:
        """Merge output and manifest."""
        return self.root / "merged"

    @property
    def shards(self) -> Path:
        """The folder of the shard folders."""
        return self.root / "shards"

    @property
    def observer(self) -> Path:
        """What ``status`` keeps between refreshes (``lag.json``, the settled index)."""
        return self.root / "observer"

    @property
    def lag_json(self) -> Path:
        """When status first saw each job missing from squeue and accounting."""
        return self.observer / "lag.json"

    @property
    def settled_json(self) -> Path:
        """The settled index: the row of every settled shard."""
        return self.observer / "settled.json"

    @property
    def settled_lock(self) -> Path:
        """Held by every writer of the settled index."""
        return self.observer / "settled.lock"

    @property
    def cancels(self) -> Path:
        """One marker per cancelled job."""
        return self.root / "cancels"

    @property
    def totals_json(self) -> Path:
        """The run's totals, kept once accounting has a row for every job."""
        return self.root / "totals.json"

    @property
    def cost_json(self) -> Path:
        """The run's cost figures, kept for a finished run."""
        return self.root / "cost.json"

    @property
    def retry_lock(self) -> Path:
        """Held by retry, auto-retry and everything that selects shards to run again."""
        return self.root / "retry.lock"

    @property
    def auto(self) -> Path:
        """The automatic jobs' records and scripts."""
        return self.root / "auto"

    @property
    def auto_settings(self) -> Path:
        """The run's automatic settings (retry, merge)."""
        return self.auto / "settings.json"

    @property
    def auto_merge(self) -> Path:
        """The automatic merge's result."""
        return self.auto / "merge.json"

    @property
    def round_json(self) -> Path:
        """The pending round job of the run."""
        return self.auto / "round.json"

    @property
    def auto_halted(self) -> Path:
        """Written by ``cancel`` of the whole run: no automatic round submits anything."""
        return self.auto / "halted.json"

    def submission_json(self, number: int) -> Path:
        """Record of submission ``number``."""
        return self.submissions / f"{number:04d}.json"

    def submission_script(self, number: int) -> Path:
        """Batch script of submission ``number``."""
        return self.submissions / f"{number:04d}.sbatch"

    def shard_dir(self, shard: int) -> Path:
        """Directory of one shard."""
        return self.shards / shard_name(shard)

    def winner_json(self, shard: int) -> Path:
        """Immutable winner record of a shard."""
        return self.shard_dir(shard) / WINNER_JSON

    def attempts_dir(self, shard: int) -> Path:
        """The folder of a shard's attempt folders."""
        return self.shard_dir(shard) / ATTEMPTS

    def attempt(self, shard: int, attempt: int) -> AttemptLayout:
        """Layout of one attempt."""
        return AttemptLayout(self.attempts_dir(shard) / attempt_name(attempt))

    def attempt_json_path(self, shard: int, attempt: int) -> str:
        """``attempt(shard, attempt).attempt_json`` as a string, made without five Path
        objects (the bulk writers of submit and its recovery: 100,000 a run)."""
        return attempt_path(f"{self.root}/shards/{shard_name(shard)}", attempt) + \
            "/" + ATTEMPT_JSON


@dataclass(frozen=True)
class AttemptLayout:
    """Paths inside ``shards/shard-NNNNN/attempts/attempt-NNNN/``."""

    root: Path

    @property
    def attempt_json(self) -> Path:
        """The attempt's lifecycle record."""
        return self.root / ATTEMPT_JSON

    @property
    def readiness_json(self) -> Path:
        """What the allocation is serving (revisioned)."""
        return self.root / "readiness.json"

    @property
    def progress_json(self) -> Path:
        """The client's progress counters."""
        return self.root / PROGRESS_JSON

    @property
    def telemetry_json(self) -> Path:
        """The agent's serving samples (issue 32)."""
        return self.root / "telemetry.json"

    @property
    def output(self) -> Path:
        """The only directory the client writes into."""
        return self.root / "output"

    @property
    def result_json(self) -> Path:
        """The candidate manifest."""
        return self.root / "result.json"

    @property
    def logs(self) -> Path:
        """Parent of the per-execution log folders."""
        return self.root / "logs"

    def execution_logs(self, execution: int) -> Path:
        """Log folder of one execution (requeues get a new one)."""
        return self.logs / f"execution-{execution}"
