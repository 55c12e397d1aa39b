"""``synthbatch merge``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import click

from synthbatch.control.cli.common import common, run_id_argument


@click.command("merge")
@run_id_argument()
@click.option("--output", type=click.Path(path_type=Path), default=None,
              help="Output file (jsonl, default <run>/merged/records.jsonl) or folder (parquet, "
                   "default <run>/merged/data).")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "parquet"]), default="jsonl",
              show_default=True, help="parquet: a folder of Parquet files.")
@click.option("--allow-partial", is_flag=True,
              help="Merge the shards with a sound winner; name the others (and why) in the "
                   "manifest.")
@click.option("--no-stats", is_flag=True,
              help="Leave the column statistics out of the dataset card (a jsonl merge then "
                   "reads no record: a plain copy, for very large runs).")
@common
def merge_cmd(run_id: str, output: Optional[Path], fmt: str, allow_partial: bool,
              no_stats: bool, profile: Optional[str]) -> Any:
    """Concatenate the verified winners of RUN_ID in shard order; write a manifest."""
    from synthbatch.control import api

    data = api.merge(run_id, output, allow_partial, profile, fmt=fmt, stats=not no_stats).to_dict()
    text = f"merged {data['records']} records into {data['output']}"
    if data.get("dropped"):
        where = data.get("dropped_files", [])
        text += (f"\n  dropped: {data['dropped']} record(s) the client gave up on, in shard(s) "
                 f"{', '.join(str(d['shard']) for d in where[:20])} (listed in their "
                 "output/.dropped-*.jsonl; manifest: dropped_files)")
    if data.get("card"):
        text += f"\n  dataset card: {data['card']} (and card.json)"
    if data["missing_shards"]:
        text += (f"\n  partial: {len(data['missing_shards'])} shard(s) were left out: "
                 f"{', '.join(map(str, data['missing_shards'][:20]))}")
        text += "".join(f"\n  left out shard {item['shard']}: {item['reason']}"
                        for item in data["bad_shards"])
    return {"data": data, "text": text}
