"""``synthbatch plan``: validate and resolve a run, render its script, write nothing (a
Data Designer config is also checked on this node when its client environment is here,
``control/runs/ddcheck.py``).

``dry_run`` is what ``control.api.plan`` returns: the plan, its sha256, the batch script
and the human summary. ``resolve`` is the shared first half of ``plan`` and ``submit``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

from agent_stdlib.contracts import Plan, sha256_bytes, split_dd_config
from agent_stdlib.layout import job_name, run_dir
from control.config.client import DataDesignerClient
from control.config.loader import load_model
from control.config.profile import Profile, load_profile
from control.config.run import RunConfig
from control.images import registry
from control.planning.planner import config_path, make_plan
from control.planning.summary import plan_summary
from control.runs.ddcheck import check_on_login_node
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
    client_config: Optional[Path] = None  # a Data Designer config file the run pinned


def resolve(run_file: Path, profile: Optional[str] = None, run_id: Optional[str] = None,
            max_array_size: Optional[int] = None, agent_sha256: str = "") -> Resolved:
    """Load the profile, the run config and the image registry; make the plan."""
    prof, profile_path = load_profile(profile)
    config = load_model(run_file, RunConfig)
    images = registry.load(Path(prof.workspace))
    plan = make_plan(config, prof, run_id or new_run_id(config.name),
                     run_file.resolve().parent, images=images, run_file=run_file,
                     profile_file=profile_path, max_array_size=max_array_size,
                     agent_sha256=agent_sha256)
    plan = pin_client_config(plan, config, run_file.resolve().parent)
    payload = plan.to_json().encode("utf-8")
    return Resolved(plan, payload, sha256_bytes(payload), prof, profile_path, run_file,
                    client_config_file(config, run_file.resolve().parent))


def client_config_file(config: RunConfig, config_dir: Path) -> Optional[Path]:
    """The host path of a Data Designer client's config file, when the login node sees it."""
    client = config.client
    if not isinstance(client, DataDesignerClient):
        return None
    path = Path(config_path(split_dd_config(client.data_designer)[0], config_dir))
    return path if path.is_file() else None


def pin_client_config(plan: Plan, config: RunConfig, config_dir: Path) -> Plan:
    """``plan`` with the Data Designer config's sha256 pinned: every shard then runs the
    config as submitted, and one edited mid-run fails its shard instead of changing the
    data silently (``agent_stdlib/client/data_designer.py``)."""
    spec, path = plan.client_data_designer, client_config_file(config, config_dir)
    if spec is None or path is None:
        return plan
    return plan.replace(client_data_designer=dataclasses.replace(
        spec, config_sha256=sha256_bytes(path.read_bytes())))


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
    summary = plan_summary(plan, resolved.plan_sha256, resolved.profile.gpus_per_node)
    out = {
        "plan": plan.to_dict(),
        "plan_sha256": resolved.plan_sha256,
        "script": preview_script(resolved),
        "shards": len(plan.shards),
        "records": plan.total_records,
    }
    if plan.client_data_designer is not None:
        check = check_on_login_node(plan, resolved.plan_bytes, run_file,
                                    Path(resolved.profile.workspace))
        out["data_designer"] = check
        lines = [f"data designer: config checked with {check['python']}"] \
            if check["checked"] else []
        summary = summary.rstrip("\n") + "\n" + "".join(
            f"{line}\n" for line in lines + [f"data designer: {n}" for n in check["notes"]])
    return {**out, "summary": summary}
