"""The automatic retry round's entry point, run inside its CPU-only Slurm job.

``python -m synthbatch.control.cli.autoround --workspace WORKSPACE RUN_ID [--merge]`` (the
script ``control.runs.autoretry.render_script`` writes): one round (``--merge``: the merge
job), then exit. Not a user command.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m synthbatch.control.cli.autoround --workspace W RUN_ID``: one round."""
    from synthbatch.control.api import ROUND_JOB_ENV, autoround, due_locally, run_layout

    args = list(sys.argv[1:] if argv is None else argv)
    merging = args[3:] == ["--merge"]
    if len(args) != 3 + merging or args[0] != "--workspace":
        print("usage: python -m synthbatch.control.cli.autoround --workspace WORKSPACE RUN_ID "
              "[--merge]", file=sys.stderr)
        return 2
    workspace, run_id = args[1], args[2]
    from synthbatch.control.api import Profile, load_model, scheduler_for

    layout = run_layout(Path(workspace), run_id)
    local_job = os.environ.get(ROUND_JOB_ENV)  # the local backend's supervisor runs it
    if local_job and not merging and not due_locally(layout, local_job):
        print(f"round of run {run_id}: not job {local_job}'s to run")
        return 0
    profile = load_model(layout.inputs / "profile.toml", Profile)  # the run's own profile
    profile = profile.model_copy(update={"workspace": workspace})
    if merging:  # the merge job the last round submitted
        result = autoround.merge_job(layout)
        missing = result.get("missing_shards") or []
        gone = f"missing shards: {', '.join(map(str, missing))}" if missing else ""
        print(f"merge of run {run_id}: {result['state']} "
              f"{result.get('output') or ''} {gone} {result.get('reason') or ''}".rstrip())
        return 0 if result["state"] in ("merged", "partial") else 1
    decision = autoround.run_round(layout, profile, scheduler_for(profile))  # type: ignore[arg-type]
    if decision.halted:
        print(f"round of run {run_id}: stopped, {decision.halted}: retried "
              f"{list(decision.retry)}, nothing more submitted")
        return 0
    print(f"round of run {run_id}: retried {list(decision.retry)}, waiting "
          f"{list(decision.waiting)}, exhausted {list(decision.exhausted)}, "
          f"{'over' if decision.over else 'next round submitted'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
