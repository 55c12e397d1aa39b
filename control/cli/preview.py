"""``synthbatch preview``: iterate on prompts before spending GPU hours."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import click

from synthbatch.agent_stdlib.text import visible
from synthbatch.control.cli.common import common


def preview_text(data: Dict[str, Any], streamed: bool = False) -> str:
    """The generator's notes, then one row per record unless they were ``streamed``
    already, and the time to the first record (``--json`` shows everything)."""
    from synthbatch.control.cli.preview_table import table

    notes = [visible(line) for line in data["log"]
             if "left out" in line or "no endpoint" in line]
    rows = table(data["records"]) if data["records"] and not streamed else []
    blocks: List[str] = [*notes, *rows]
    if data["records"] and data.get("first_record_s") is not None:
        blocks.append(f"{len(data['records'])} records; the first after "
                      f"{data['first_record_s']:.2f} s")
    return "\n".join(blocks) or "no records"


@click.command("preview")
@click.argument("run_file", type=click.Path(path_type=Path))
@click.option("-n", "--records", "count", type=click.IntRange(1, 1000), default=5,
              show_default=True, help="How many records (the run's first ones).")
@click.option("--endpoint", "endpoints", multiple=True, metavar="ALIAS=URL",
              help="An OpenAI-compatible base URL for a deployment alias (repeatable). "
                   "Without one, an alias's LLM columns are left out.")
@click.option("--model", "models", multiple=True, metavar="ALIAS=NAME",
              help="The model name an alias's endpoint serves, when it is not the run's "
                   "(repeatable).")
@click.option("--api-key-env", metavar="NAME",
              help="Send the value of environment variable NAME as the bearer token.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1, 86400), default=600.0,
              show_default=True, help="Give up after this many seconds.")
@common
def preview_cmd(run_file: Path, count: int, endpoints: Tuple[str, ...],
                models: Tuple[str, ...], api_key_env: Optional[str], timeout_s: float,
                profile: Optional[str], as_json: bool) -> Any:
    """Generate the first records of RUN_FILE here, with the real generator, and print them.

    Samplers, seed data and expressions always run; each LLM column runs when its
    deployment alias has an --endpoint (a server you already have: vLLM, SGLang,
    llama.cpp, any OpenAI-compatible URL). Nothing is submitted or written. Each
    record's row is printed as it is made; without any profile the run is planned
    with a stand-in (preview submits nothing).
    """
    from synthbatch.control import api
    from synthbatch.control.cli.preview_table import Rows

    rows = None if as_json else Rows(click.echo)  # each record's row as it arrives
    data = api.preview(run_file, profile, count, endpoints, api_key_env, timeout_s, models,
                       rows)
    return {"data": data, "text": preview_text(data, streamed=rows is not None)}
