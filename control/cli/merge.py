"""``synthbatch merge``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import click

from control.cli.common import common


@click.command("merge")
@click.argument("run_id")
@click.option("--output", type=click.Path(path_type=Path), default=None,
              help="Output JSONL file (default: <run>/merged/records.jsonl).")
@click.option("--allow-partial", is_flag=True, help="Merge the shards that have winners.")
@common
def merge_cmd(run_id: str, output: Optional[Path], allow_partial: bool,
              profile: Optional[str]) -> Any:
    """Concatenate the verified winners of RUN_ID in shard order."""
    from control import api

    data = api.merge(run_id, output, allow_partial, profile)
    return {"data": data,
            "text": f"merged {data['records']} records into {data['output']}"}
