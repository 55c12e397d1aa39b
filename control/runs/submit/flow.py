"""The order of a submit: check, take reused cells, stage and commit, submit, start the
automatic rounds; and a benchmark's cases, one held array per shape."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from synthbatch.control.errors import InvalidInput
from synthbatch.control.runs.submit.checked import checked
from synthbatch.control.runs.submit.stage import staged

if TYPE_CHECKING:
    from synthbatch.agent_stdlib.contracts import ShardSpec
    from synthbatch.control.config.overrides import Overrides
    from synthbatch.control.config.profile import Profile
    from synthbatch.control.slurm.scheduler import Scheduler


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
    from synthbatch.control.runs.submit.arrays import submit_all

    if merge_to is not None:  # a bad --merge-to is refused before anything else is asked
        target(str(merge_to), Path.cwd(), None)
    ready = checked(run_file, profile, prof, sched, over, checks, run_id, shards, read_pilot)
    resolved, notes = with_reuse(ready.resolved, Path(prof.workspace), reuse)
    ready = ready._replace(resolved=resolved, warnings=ready.warnings + notes)
    auto = auto_settings(resolved.config, ready.run_file, resolved.plan.max_attempts,
                         merge_to, merge_format, allow_partial)
    stage = staged(ready, prof)
    records = submit_all(stage, resolved.profile, sched,
                         {s.index: 1 for s in stage.plan.shards}, implied=True, withdraw=True)
    start(stage.layout, resolved.profile, sched, stage.plan.run_id,
          [r.job_id for r in records if r.job_id], auto)
    plan = stage.plan
    return {"run_id": plan.run_id, "run_dir": str(stage.layout.root),
            "job_id": records[0].job_id, "job_ids": [r.job_id for r in records],
            "shards": len(plan.shards), "warnings": ready.warnings,
            "overrides": ready.overrides}


def submit_cases(bench_file: Path, cases: Sequence[Tuple[Any, Path]],
                 profile: Optional[str], prof: Profile, sched: Scheduler,
                 over: Overrides, read_pilot: Callable[..., Any]) -> Dict[str, Dict[str, Any]]:
    """Check every case (``(case, its run file)``), then submit the cases of one shape as
    one Slurm array (``control.runs.shared``; each case stays an ordinary run at its own
    task offset)."""
    from synthbatch.control.runs.plan import at_first_task
    from synthbatch.control.runs.shared import groups, submit_shared
    from synthbatch.control.runs.submit.arrays import submit_all

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
            records = submit_all(stages[0], members[0].resolved.profile, sched,
                                 {s.index: 1 for s in stages[0].plan.shards}, implied=True)
        else:
            records = submit_shared(stages, members[0].resolved.profile, sched)
        for i, stage in enumerate(stages):
            mine = records if len(stages) == 1 else [records[i]]
            found[stage.plan.run_id] = {"job_ids": [r.job_id for r in mine],
                                        "shared_with": [s.plan.run_id for s in stages
                                                        if s is not stage]}
    return found
