"""``synthbatch runs``: the runs of the workspace."""

from __future__ import annotations

from typing import Any, Optional

import click

from synthbatch.control.cli.common import common
from synthbatch.control.cli.render import runs_text


@click.command("runs")
@common
def runs_cmd(profile: Optional[str]) -> Any:
    """List the runs of the workspace, newest first, with their state."""
    from synthbatch.control import api

    runs = [r.to_dict() for r in api.runs(profile)]
    return {"data": {"runs": runs}, "text": runs_text(runs), "colour": True}
