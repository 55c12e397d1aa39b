"""The Python API behind every CLI command; each returns what ``--json`` prints.

Imports of the planner, bundle builder and renderer happen inside the functions that need
them, so that ``status``, ``runs``, ``logs`` and ``cancel`` start quickly. Those commands
(and ``merge``) read the profile with ``control.config.workspace`` (the three fields they
use, no pydantic); ``plan``, ``submit`` and ``retry`` validate the whole profile.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

from agent_stdlib.layout import RunLayout, runs_root
from control.config.workspace import WorkspaceProfile, load_workspace_profile
from control.errors import InvalidInput, SchedulerUnavailable, SynthbatchError
from control.runs.store import load_run, run_layout
from control.slurm.scheduler import Scheduler

if TYPE_CHECKING:
    from agent_stdlib.contracts import ShardSpec
    from control.config.profile import Profile


def scheduler_for(profile: Union[Profile, WorkspaceProfile]) -> Scheduler:
    """The Slurm client configured by a profile."""
    return Scheduler(slurm_bin=profile.slurm_bin, timeout_s=profile.scheduler_timeout_s)


def _profile(profile: Optional[str]) -> Profile:
    from control.config.profile import load_profile

    return load_profile(profile)[0]


def _run(run_id: str, profile: Optional[str]) -> tuple[WorkspaceProfile, RunLayout]:
    prof = load_workspace_profile(profile)
    return prof, run_layout(Path(prof.workspace), run_id)


def run_dir(run_id: str, profile: Optional[str] = None) -> RunLayout:
    """The directory layout of an existing run of the profile's workspace."""
    return _run(run_id, profile)[1]


def _max_array_size(prof: Profile, scheduler: Optional[Scheduler]) -> Optional[int]:
    try:
        return (scheduler or scheduler_for(prof)).max_array_size()
    except SchedulerUnavailable:
        return None  # plan without the cluster: one array, as large as the run


def plan(run_file: Path, profile: Optional[str] = None,
         scheduler: Optional[Scheduler] = None) -> Dict[str, Any]:
    """Dry run: validate and resolve the run, render the batch script, submit nothing."""
    from control.runs.plan import dry_run

    return dry_run(run_file, profile,
                   max_array_size=_max_array_size(_profile(profile), scheduler))


def preview(run_file: Path, profile: Optional[str] = None, count: int = 5,
            endpoints: Sequence[str] = (), api_key_env: Optional[str] = None,
            timeout_s: float = 600.0) -> Dict[str, Any]:
    """The first ``count`` records of the run's recipe, made here by the agent bundle's
    generator against ``endpoints`` (``ALIAS=URL``); nothing is submitted."""
    from control import bundle
    from control.runs.preview import parse_endpoints, run_preview

    prof = _profile(profile)
    urls = parse_endpoints(endpoints)
    try:
        pyz = bundle.locate_agent_bundle(Path(prof.workspace) / ".cache" / "bundles")
    except bundle.BundleError as err:
        raise InvalidInput(f"agent bundle: {err}") from err
    return run_preview(run_file, profile, count, urls, pyz, api_key_env, timeout_s)


def submit(run_file: Path, profile: Optional[str] = None,
           scheduler: Optional[Scheduler] = None, run_id: Optional[str] = None,
           shards: Optional[Sequence[ShardSpec]] = None) -> Dict[str, Any]:
    """Plan, stage, commit and submit a run; return its id and job id (``run_id`` and
    ``shards``: a benchmark case's deterministic id and sized points)."""
    from control import bundle
    from control.runs import submit as submitting
    from control.runs.plan import resolve

    prof = _profile(profile)
    workspace = Path(prof.workspace)
    try:
        pyz = bundle.locate_agent_bundle(workspace / ".cache" / "bundles")
    except bundle.BundleError as err:
        raise InvalidInput(f"agent bundle: {err}") from err
    agent_sha256 = bundle.sha256_file(pyz)
    sched = scheduler or scheduler_for(prof)
    resolved = resolve(run_file, profile, run_id=run_id, max_array_size=sched.max_array_size(),
                       agent_sha256=agent_sha256, shards=shards)
    plan = resolved.plan
    staged = submitting.stage_run(
        workspace, plan,
        {"run" + run_file.suffix: run_file,
         "profile" + resolved.profile_path.suffix: resolved.profile_path},
        pyz, agent_sha256, resolved.plan_bytes, resolved.plan_sha256)
    try:
        submitting.commit_run(staged, prof.backend)
    except BaseException:
        submitting.remove_uncommitted(staged.layout)
        raise
    records = submitting.submit_all(staged, prof, sched, {s.index: 1 for s in plan.shards})
    return {"run_id": plan.run_id, "run_dir": str(staged.layout.root),
            "job_id": records[0].job_id, "job_ids": [r.job_id for r in records],
            "shards": len(plan.shards)}


def status(run_id: str, profile: Optional[str] = None,
           scheduler: Optional[Scheduler] = None, auto_retry: bool = False) -> Dict[str, Any]:
    """Shards by state, records done, tokens, rate, ETA, failures with reasons and logs.

    ``auto_retry`` also submits the next attempt of failed shards below the run's
    ``max_attempts`` (as ``retry --auto``; skipped while another retry holds the lock) and
    adds what it submitted as ``retried``.
    """
    from control.runs.status import observe, unreachable

    prof, layout = _run(run_id, profile)
    sched = scheduler or scheduler_for(prof)
    data = observe(layout, sched)
    if not auto_retry or not data["counts"].get("failed") or unreachable(data):
        return data
    from control.errors import Conflict
    from control.runs.retry import retry_run

    try:
        done = retry_run(layout, _profile(profile), sched, auto=True, lock_wait_s=0.0)
    except Conflict as err:
        return {**data, "retried": [], "notes": [*data["notes"], err.message]}
    notes = [done.selection.skipped[s] for s in sorted(done.selection.skipped)]
    if not done.submitted:
        return {**data, "retried": [], "notes": [*data["notes"], *notes]}
    fresh = observe(layout, sched)
    return {**fresh, "retried": [c.to_dict() for c in done.submitted],
            "notes": [*fresh["notes"], *notes]}


def cancel(run_id: str, shards: Sequence[int] = (), profile: Optional[str] = None,
           scheduler: Optional[Scheduler] = None, wait_s: float = 60.0) -> Dict[str, Any]:
    """scancel the recorded jobs of the run (or of ``shards``); states become cancelled."""
    from control.runs.cancel import cancel_run

    prof, layout = _run(run_id, profile)
    return cancel_run(layout, scheduler or scheduler_for(prof), list(shards), wait_s)


def logs(run_id: str, shard: Optional[int] = None, step: Optional[str] = None,
         profile: Optional[str] = None) -> Dict[str, Any]:
    """Which log file of the latest execution to show, and the other steps that have one."""
    from control.runs.logs import locate

    _, layout = _run(run_id, profile)
    target = locate(layout, shard, step)
    return {"run_id": run_id, "shard": target.shard, "attempt": target.attempt,
            "execution": target.execution, "step": target.step, "path": str(target.path),
            "steps": target.steps}


def merge(run_id: str, output: Optional[Path] = None, allow_partial: bool = False,
          profile: Optional[str] = None, fmt: str = "jsonl") -> Dict[str, Any]:
    """Verify and concatenate the winners of a run in shard order; return the manifest."""
    from control.runs.merge import merge_run

    _, layout = _run(run_id, profile)
    return merge_run(layout, output.resolve() if output else None, allow_partial, fmt)


def retry(run_id: str, shards: Sequence[int] = (), resume: Optional[str] = None,
          dry_run: bool = False, auto: bool = False, profile: Optional[str] = None,
          scheduler: Optional[Scheduler] = None, lock_wait_s: float = 60.0) -> Dict[str, Any]:
    """Submit attempt N+1 for shards that ended without a winner (or the named ``shards``).

    Reconciles first (the same refresh as ``status``: an attempt whose job is gone from
    Slurm is recorded ``failed``/``cancelled``, a missing winner is completed), then selects
    under the run's retry lock; a named shard that has not ended is refused in the words
    status uses for it. ``auto`` takes only failed shards below the plan's
    ``max_attempts``; ``resume`` overrides the plan's resume policy. Shards whose records
    are damaged are left out and listed as ``skipped``, the others still submitted.
    Returns what was (with ``dry_run``: would be) submitted.
    """
    from control.runs.retry import retry_run
    from control.runs.status import observe, unreachable

    prof = _profile(profile)
    layout = run_layout(Path(prof.workspace), run_id)
    sched = scheduler or scheduler_for(prof)
    seen = observe(layout, sched)
    error = unreachable(seen)
    if error is not None:  # the records alone cannot say which shards ended
        raise error
    verdicts = {row["index"]: (row["state"], row["reason"]) for row in seen["shards"]}
    done = retry_run(layout, prof, sched, list(shards), resume, dry_run, auto, lock_wait_s,
                     verdicts=verdicts)
    selection = done.selection
    return {"run_id": run_id, "dry_run": dry_run, "auto": auto,
            "shards": [c.to_dict() for c in done.submitted],
            "submissions": done.submissions,
            "exhausted": [selection.exhausted[s] for s in sorted(selection.exhausted)],
            "skipped": [selection.skipped[s] for s in sorted(selection.skipped)]}


def runs(profile: Optional[str] = None) -> Dict[str, Any]:
    """Runs in the workspace, newest first, with their state from the run directory alone."""
    from control.runs.listing import durable_state

    prof = load_workspace_profile(profile)
    root = runs_root(Path(prof.workspace))
    found: List[Dict[str, Any]] = []
    for folder in sorted(root.iterdir() if root.is_dir() else [], reverse=True):
        try:
            layout = run_layout(Path(prof.workspace), folder.name)
            record = load_run(layout)
        except SynthbatchError:
            continue
        except Exception as err:  # noqa: BLE001 - one bad run must not hide the rest
            found.append({"run_id": folder.name, "state": "unknown", "problem": str(err)})
            continue
        if record is not None:
            found.append({"run_id": record.run_id, "name": record.name,
                          "created_at": record.created_at, "shards": record.shard_count,
                          **durable_state(layout, record.shard_count)})
    found.sort(key=lambda r: r.get("created_at", 0), reverse=True)
    return {"runs": found}


def benchmark_run(bench_file: Path, profile: Optional[str] = None,
                  scheduler: Optional[Scheduler] = None) -> Dict[str, Any]:
    """Compile a benchmark file and submit each case's run that does not exist yet (a case
    already submitted is left alone: resubmitting is idempotent)."""
    from control.benchmark import store
    from control.benchmark.sweep import compile_sweep
    from control.config.benchmark import BenchmarkConfig
    from control.config.loader import load_model, read_document

    config = load_model(bench_file, BenchmarkConfig)
    base_file = (bench_file.resolve().parent / config.run).resolve()
    if not base_file.is_file():
        raise InvalidInput(f"{bench_file}: run: {config.run}: no such file")
    try:
        bench_id, case_runs = compile_sweep(config, read_document(base_file))
    except InvalidInput as err:
        raise InvalidInput(f"{bench_file}: {err.message}") from err
    prof = load_workspace_profile(profile)
    workspace = Path(prof.workspace)
    store.save(workspace, store.manifest(bench_id, config, case_runs))
    cases = []
    for case in case_runs:
        try:
            run_layout(workspace, case.run_id)
        except SynthbatchError:
            path = store.case_file(base_file, case.run_id, case.run)
            try:
                done = submit(path, profile, scheduler, run_id=case.run_id, shards=case.shards)
            except InvalidInput as err:
                raise InvalidInput(f"{bench_file}: case {case.case}: {err.message}") from err
            cases.append({"case": case.case, "run_id": case.run_id, "submitted": True,
                          "job_ids": done["job_ids"]})
        else:
            cases.append({"case": case.case, "run_id": case.run_id, "submitted": False})
    return {"benchmark_id": bench_id, "cases": cases}


def _benchmark_data(bench_id: str, profile: Optional[str]) -> Dict[str, Any]:
    from control.benchmark import store
    from control.benchmark.analyze import analyze

    prof = load_workspace_profile(profile)
    workspace = Path(prof.workspace)
    manifest = store.load(workspace, bench_id)
    layouts: Dict[str, Optional[RunLayout]] = {}
    for case in manifest["cases"]:
        try:
            layouts[case["run_id"]] = run_layout(workspace, case["run_id"])
        except SynthbatchError:
            layouts[case["run_id"]] = None
    from control.benchmark.accounting import job_times

    sched = scheduler_for(prof)
    return analyze(manifest, layouts, lambda ids: job_times(sched, ids))


def benchmark_analyze(bench_id: str, profile: Optional[str] = None) -> Dict[str, Any]:
    """Every point's figures, the Pareto front and the recommendation, from durable state."""
    return _benchmark_data(bench_id, profile)


def benchmark_report(bench_id: str, output: Optional[Path] = None,
                     profile: Optional[str] = None) -> Dict[str, Any]:
    """Write the report directory (default ``<workspace>/benchmarks/<id>/report``)."""
    from control.benchmark import report, store

    data = _benchmark_data(bench_id, profile)
    folder = output or store.bench_dir(
        Path(load_workspace_profile(profile).workspace), bench_id) / "report"
    return {"benchmark_id": bench_id, "report_dir": str(folder),
            "files": report.write(data, folder), "complete": data["complete"],
            "missing": data["missing"]}
