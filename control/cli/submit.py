"""``synthbatch submit``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import click

from control.cli.common import common


@click.command("submit")
@click.argument("run_file", type=click.Path(path_type=Path))
@common
def submit_cmd(run_file: Path, profile: Optional[str]) -> Any:
    """Submit RUN_FILE as one Slurm job array; print the run id."""
    from control import api

    data = api.submit(run_file, profile)
    return {"data": data, "text": data["run_id"]}
