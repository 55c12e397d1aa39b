"""``synthbatch plan``: the dry run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import click

from control.cli.common import common


@click.command("plan")
@click.argument("run_file", type=click.Path(path_type=Path))
@common
def plan_cmd(run_file: Path, profile: Optional[str]) -> Any:
    """Validate and resolve RUN_FILE; print the plan summary and the batch script."""
    from control import api

    data = api.plan(run_file, profile)
    text = f"{data['summary'].rstrip()}\n--- batch script ---\n{data['script']}"
    return {"data": data, "text": text}
