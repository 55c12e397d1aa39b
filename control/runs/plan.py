"""``synthbatch plan``: validate and resolve a run, render its script, write nothing.

``dry_run`` is what ``control.api.plan`` returns: the plan, its sha256, the batch script
and the human summary. ``resolve`` is the shared first half of ``plan`` and ``submit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from agent_stdlib.contracts import Plan, ShardSpec, sha256_bytes
from agent_stdlib.layout import job_name, run_dir
from control.config.client import GenerateClient
from control.config.loader import load_model
from control.config.profile import Profile, load_profile
from control.config.run import RunConfig
from control.images import registry
from control.planning.planner import make_plan
from control.planning.summary import plan_summary
from control.runs.seeds import check_seed_data
from control.runs.store import new_run_id
from control.slurm.renderer import BatchScript, render_batch_script


@dataclass(frozen=True)
class Resolved:
    """A run resolved against its profile: the plan and where it came from."""

    plan: Plan
    plan_bytes: bytes  # plan.json exactly as it is staged
    plan_sha256: str  # of plan_bytes: computed here once, named by run.json and the script
    profile: Profile
    profile_path: Path
    run_file: Path


def resolve(run_file: Path, profile: Optional[str] = None, run_id: Optional[str] = None,
            max_array_size: Optional[int] = None, agent_sha256: str = "",
            shards: Optional[Sequence[ShardSpec]] = None) -> Resolved:
    """Load the profile, the run config and the image registry; make the plan (with
    ``shards`` in place of the planner's split: a benchmark's sized points)."""
    prof, profile_path = load_profile(profile)
    config = load_model(run_file, RunConfig)
    images = registry.load(Path(prof.workspace))
    plan = make_plan(config, prof, run_id or new_run_id(config.name),
                     run_file.resolve().parent, images=images, run_file=run_file,
                     profile_file=profile_path, max_array_size=max_array_size,
                     agent_sha256=agent_sha256)
    if shards is not None:
        plan = plan.replace(shards=tuple(shards))
    if isinstance(config.client, GenerateClient):
        plan = check_seed_data(plan, config.client, run_file)
    payload = plan.to_json().encode("utf-8")
    return Resolved(plan, payload, sha256_bytes(payload), prof, profile_path, run_file)


def preview_script(resolved: Resolved) -> str:
    """The batch script of the first submission, with placeholder agent digests."""
    prof, plan = resolved.profile, resolved.plan
    return render_batch_script(BatchScript(
        job_name=job_name(plan.run_id), run_dir=str(run_dir(prof.workspace, plan.run_id)),
        agent_pyz="agent-<sha256>.pyz", agent_sha256=plan.agent_sha256 or "<sha256>",
        plan_sha256=resolved.plan_sha256, submission=1, python=prof.python,
        resources=plan.resources, signal_lead_s=prof.signal_lead_s,
        slurm_bin=prof.slurm_bin))


def dry_run(run_file: Path, profile: Optional[str] = None,
            max_array_size: Optional[int] = None) -> Dict[str, Any]:
    """Everything ``synthbatch plan`` prints; no state is written anywhere."""
    resolved = resolve(run_file, profile, max_array_size=max_array_size)
    plan = resolved.plan
    return {
        "plan": plan.to_dict(),
        "plan_sha256": resolved.plan_sha256,
        "script": preview_script(resolved),
        "summary": plan_summary(plan, resolved.plan_sha256, resolved.profile.gpus_per_node),
        "shards": len(plan.shards),
        "records": plan.total_records,
    }
