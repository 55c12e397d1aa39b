"""Stage a checked run's directory and commit its ``run.json``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from synthbatch.control.runs.submit import arrays
from synthbatch.control.runs.submit.arrays import Staged

if TYPE_CHECKING:
    from synthbatch.control.config.profile import Profile
    from synthbatch.control.runs.submit.checked import Checked


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
