"""The order of a submit: check, take reused cells, stage and commit, submit, start the
automatic rounds; and a benchmark's cases, one held array per shape."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Union

from synthbatch.agent_stdlib.layout import bundle_cache
from synthbatch.control.errors import InvalidInput
from synthbatch.control.runs.submit import arrays
from synthbatch.control.runs.submit.arrays import Staged

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
    """Resolve and check a run, nothing written yet (InvalidInput for what ``plan``'s checks
    call an error); ``read_pilot`` reads a measured pilot
    (``control.benchmark.pilot.read_pilot``)."""
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


def staged(ready: Checked, prof: Profile) -> Staged:
    """Stage and commit a checked run (run.json written); a failed commit leaves nothing."""
    resolved, run_file = ready.resolved, ready.run_file
    inputs = {"run" + run_file.suffix: run_file,
              "profile" + resolved.profile_path.suffix: resolved.profile_path}
    if resolved.client_config is not None:  # a copy of what the plan pinned, for the record
        inputs["data-designer" + resolved.client_config.suffix] = resolved.client_config
    done = arrays.stage_run(Path(prof.workspace), resolved.plan, inputs, ready.pyz,
                            ready.agent_sha256, resolved.plan_bytes, resolved.plan_sha256)
    try:
        arrays.commit_run(done, prof.backend, warnings=ready.warnings, overrides=ready.overrides)
    except BaseException:
        arrays.remove_uncommitted(done.layout)
        raise
    return done


def submit_run(run_file: Path, profile: Optional[str], prof: Profile, sched: Scheduler,
               over: Overrides, *, checks: bool, run_id: Optional[str],
               shards: Optional[Sequence[ShardSpec]], reuse: Sequence[str],
               merge_to: Union[str, Path, None], merge_format: Optional[str],
               allow_partial: bool, read_pilot: Callable[..., Any]) -> Dict[str, Any]:
    """Plan, check, stage, commit and submit a run; its submission as plain data
    (``run_id``, ``run_dir``, ``job_id``, ``job_ids``, ``shards``, ``warnings``,
    ``overrides``). Refuses (InvalidInput, nothing written) a bad ``merge_to`` and what
    ``plan``'s checks call an error."""
    from synthbatch.control.runs.automerge import auto_settings, target  # issue 34
    from synthbatch.control.runs.autoround import start  # attempts 2..N, no one around
    from synthbatch.control.runs.reuse import with_reuse  # issue 31

    if merge_to is not None:  # a bad --merge-to is refused before anything else is asked
        target(str(merge_to), Path.cwd(), None)
    ready = checked(run_file, profile, prof, sched, over, checks, run_id, shards, read_pilot)
    resolved, notes = with_reuse(ready.resolved, Path(prof.workspace), reuse)
    ready = ready._replace(resolved=resolved, warnings=ready.warnings + notes)
    auto = auto_settings(resolved.config, ready.run_file, resolved.plan.max_attempts,
                         merge_to, merge_format, allow_partial)
    stage = staged(ready, prof)
    records = arrays.submit_all(stage, resolved.profile, sched,
                         {s.index: 1 for s in stage.plan.shards}, implied=True, withdraw=True)
    start(stage.layout, resolved.profile, sched, stage.plan.run_id,
          [r.job_id for r in records if r.job_id], auto)
    plan = stage.plan
    return {"run_id": plan.run_id, "run_dir": str(stage.layout.root),
            "job_id": records[0].job_id, "job_ids": [r.job_id for r in records],
            "shards": len(plan.shards), "warnings": ready.warnings,
            "overrides": ready.overrides}


def submit_cases(bench_file: Path, cases: Sequence[tuple[Any, Path]],
                 profile: Optional[str], prof: Profile, sched: Scheduler,
                 over: Overrides, read_pilot: Callable[..., Any]) -> Dict[str, Dict[str, Any]]:
    """Check every case (``(case, its run file)``), then submit the cases of one shape as
    one Slurm array (``control.runs.shared``; each case stays an ordinary run at its own
    task offset)."""
    from synthbatch.control.runs.plan import at_first_task
    from synthbatch.control.runs.shared import groups, submit_shared

    ready = []
    for case, path in cases:
        try:
            ready.append(checked(path, profile, prof, sched, over, True, case.run_id,
                                 case.shards, read_pilot))
        except InvalidInput as err:
            raise InvalidInput(f"{bench_file}: case {case.case}: {err.message}") from err
    size = sched.max_array_size() if prof.backend == "slurm" else 1
    found: Dict[str, Dict[str, Any]] = {}
    for group in groups([r.resolved.plan for r in ready], size):
        members = [ready[i]._replace(resolved=at_first_task(ready[i].resolved, task, size))
                   for i, task in group]
        stages = [staged(m, prof) for m in members]
        records: List[Any]
        if len(stages) == 1:
            records = arrays.submit_all(stages[0], members[0].resolved.profile, sched,
                                 {s.index: 1 for s in stages[0].plan.shards}, implied=True)
        else:
            records = submit_shared(stages, members[0].resolved.profile, sched)
        for i, stage in enumerate(stages):
            mine = records if len(stages) == 1 else [records[i]]
            found[stage.plan.run_id] = {"job_ids": [r.job_id for r in mine],
                                        "shared_with": [s.plan.run_id for s in stages
                                                        if s is not stage]}
    return found
