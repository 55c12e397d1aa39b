"""The Python API behind every CLI command; each returns what ``--json`` prints."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from agent_stdlib.contracts import sha256_bytes
from control import bundle
from control.config.loader import load_model
from control.config.profile import Profile, load_profile
from control.config.run import RunConfig
from control.errors import InvalidInput, SynthbatchError
from control.planning.planner import make_plan, new_run_id
from control.runs import submit as submitting
from control.runs.merge import merge_run
from control.runs.observe import observe
from control.runs.store import load_run, run_layout, runs_root
from control.slurm.renderer import BatchScript, render_batch_script
from control.slurm.scheduler import Scheduler


def scheduler_for(profile: Profile) -> Scheduler:
    """The Slurm client configured by a profile."""
    return Scheduler(slurm_bin=profile.slurm_bin, timeout_s=profile.scheduler_timeout_s)


def _load_run_config(run_file: Path) -> RunConfig:
    return load_model(run_file, RunConfig)


def plan(run_file: Path, profile: Optional[str] = None) -> Dict[str, Any]:
    """Dry run: validate and resolve the run, render the batch script, submit nothing."""
    prof, _ = load_profile(profile)
    config = _load_run_config(run_file)
    resolved = make_plan(config, prof, new_run_id(config.name), run_file.resolve().parent)
    run_dir = runs_root(Path(prof.workspace)) / resolved.run_id
    script = render_batch_script(BatchScript(
        job_name=submitting.job_name(resolved.run_id), run_dir=str(run_dir),
        agent_pyz="agent-<sha256>.pyz", agent_sha256="<sha256>",
        plan_sha256=sha256_bytes(resolved.to_json().encode("utf-8")), submission=1,
        python=prof.python, resources=resolved.resources, signal_lead_s=prof.signal_lead_s,
        slurm_bin=prof.slurm_bin))
    return {"plan": resolved.to_dict(), "script": script,
            "shards": len(resolved.shards), "records": resolved.total_records}


def submit(run_file: Path, profile: Optional[str] = None,
           scheduler: Optional[Scheduler] = None) -> Dict[str, Any]:
    """Plan, stage, commit and submit a run; return its id and job id."""
    prof, profile_path = load_profile(profile)
    config = _load_run_config(run_file)
    workspace = Path(prof.workspace)
    resolved = make_plan(config, prof, new_run_id(config.name), run_file.resolve().parent)
    try:
        pyz = bundle.locate_agent_bundle(workspace / ".cache" / "bundles")
    except bundle.BundleError as err:
        raise InvalidInput(f"agent bundle: {err}") from err
    staged = submitting.stage_run(
        workspace, resolved,
        {"run" + run_file.suffix: run_file, "profile" + profile_path.suffix: profile_path},
        pyz, bundle.sha256_file(pyz))
    try:
        submitting.commit_run(staged, prof.backend)
    except BaseException:
        submitting.remove_uncommitted(staged.layout)
        raise
    sched = scheduler or scheduler_for(prof)
    attempts = {shard.index: 1 for shard in resolved.shards}
    record = submitting.submit_attempts(staged, prof, sched, attempts, 1, [])
    return {"run_id": resolved.run_id, "run_dir": str(staged.layout.root),
            "job_id": record.job_id, "shards": len(resolved.shards)}


def status(run_id: str, profile: Optional[str] = None,
           scheduler: Optional[Scheduler] = None) -> Dict[str, Any]:
    """The run's shards by state, records done, and failures with reasons."""
    prof, _ = load_profile(profile)
    layout = run_layout(Path(prof.workspace), run_id)
    return observe(layout, scheduler or scheduler_for(prof))


def merge(run_id: str, output: Optional[Path] = None, allow_partial: bool = False,
          profile: Optional[str] = None) -> Dict[str, Any]:
    """Concatenate the winners of a run in shard order; return the merge manifest."""
    prof, _ = load_profile(profile)
    layout = run_layout(Path(prof.workspace), run_id)
    return merge_run(layout, output.resolve() if output else None, allow_partial)


def runs(profile: Optional[str] = None) -> Dict[str, Any]:
    """Runs in the workspace, newest first."""
    prof, _ = load_profile(profile)
    root = runs_root(Path(prof.workspace))
    found: List[Dict[str, Any]] = []
    for folder in sorted(root.iterdir() if root.is_dir() else [], reverse=True):
        try:
            record = load_run(run_layout(Path(prof.workspace), folder.name))
        except SynthbatchError:
            continue
        except Exception as err:  # noqa: BLE001 - one bad run must not hide the rest
            found.append({"run_id": folder.name, "problem": str(err)})
            continue
        if record is not None:
            found.append({"run_id": record.run_id, "name": record.name,
                          "created_at": record.created_at, "shards": record.shard_count})
    found.sort(key=lambda r: r.get("created_at", 0), reverse=True)
    return {"runs": found}
