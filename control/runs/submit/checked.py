"""A run resolved and checked on the login node, before anything is written."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Sequence

from synthbatch.agent_stdlib.layout import bundle_cache
from synthbatch.control.errors import InvalidInput

if TYPE_CHECKING:
    from synthbatch.agent_stdlib.contracts import ShardSpec
    from synthbatch.control.config.overrides import Overrides
    from synthbatch.control.config.profile import Profile
    from synthbatch.control.slurm.scheduler import Scheduler


class Checked(NamedTuple):
    """A run resolved and checked, before anything is written."""

    resolved: Any  # control.runs.plan.Resolved
    run_file: Path
    pyz: Path
    agent_sha256: str
    warnings: List[str]
    overrides: Dict[str, str]
    profile: Optional[str]  # the profile reference, as the loaders take it


def agent_bundle(prof: Profile) -> Path:
    """The workspace's agent bundle (InvalidInput when there is none or it is damaged)."""
    from synthbatch.control import bundle

    try:
        return bundle.locate_agent_bundle(bundle_cache(prof.workspace))
    except bundle.BundleError as err:
        raise InvalidInput(f"agent bundle: {err}") from err


def checked(run_file: Path, profile: Optional[str], prof: Profile, sched: Scheduler,
            over: Overrides, checks: bool, run_id: Optional[str],
            shards: Optional[Sequence[ShardSpec]], read_pilot: Callable[..., Any]) -> Checked:
    """Resolve and check a run (InvalidInput for what ``plan``'s checks call an error);
    ``read_pilot`` reads a measured pilot (``control.benchmark.pilot.read_pilot``)."""
    from synthbatch.control import bundle
    from synthbatch.control.runs.checks import errors, warnings
    from synthbatch.control.runs.plan import login_checks, resolve

    pyz = agent_bundle(prof)
    agent_sha256 = bundle.sha256_file(pyz)
    resolved = resolve(run_file, profile, run_id=run_id,
                       max_array_size=sched.max_array_size(), agent_sha256=agent_sha256,
                       overrides=over, shards=shards, read_pilot=read_pilot)
    found = login_checks(resolved, sched) if checks else []
    bad = errors(found)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise InvalidInput(f"submit refused: {bad[0].line()}{more}",
                           hint=f"synthbatch plan {run_file} shows every check")
    return Checked(resolved, run_file, pyz, agent_sha256, [f.line() for f in warnings(found)],
                   over.to_dict(), profile)
