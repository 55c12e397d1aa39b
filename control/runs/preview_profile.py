"""The profile ``synthbatch preview`` plans with when the user has none: a stand-in.

Preview submits nothing and starts no server, so what a profile pins down for a cluster
(partition, accounts, the GPUs of a node) does not matter to it; the run file is still
planned in full, so a bad run file fails as it would at submit. The stand-in's workspace
is ``~/.cache/synthbatch/preview`` (only the agent bundle's build cache goes there).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

from synthbatch.control.config.workspace import PROFILE_ENV, default_profile_path

STANDIN_WORKSPACE = Path("~/.cache/synthbatch/preview")
MAX_GPUS_PER_NODE = 64  # the profile's own bound: any run's replica fits


def profile_given(profile: Optional[str]) -> bool:
    """True when ``--profile``, ``$SYNTHBATCH_PROFILE`` or the default profile exists."""
    return bool(profile or os.environ.get(PROFILE_ENV)
                or default_profile_path().is_file())


def write_standin(folder: Path) -> Path:
    """The stand-in profile written into ``folder``; its path."""
    workspace = STANDIN_WORKSPACE.expanduser()
    workspace.mkdir(mode=0o700, parents=True, exist_ok=True)
    lines = ["schema_version = 1", 'backend = "slurm"', 'partition = "preview"',
             f"workspace = {json.dumps(str(workspace))}",
             f"python = {json.dumps(sys.executable)}",
             f"gpus_per_node = {MAX_GPUS_PER_NODE}"]
    path = folder / "preview-profile.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
