"""Reused cells in ``status`` (issue 31): how many LLM cells a run took from earlier runs.

The generator counts, per shard, the LLM cells it took from reused runs and those it
asked a model for, and the records every LLM cell of which was reused
(``progress.json``: ``cells_reused``, ``cells_generated``, ``records_reused``).
:func:`counts` adds them up over each shard's winner (else its latest attempt), only
for a run whose plan reuses runs: any other run reads nothing more. :func:`generated`
makes the run's average records/s count generated records only (tokens/s already does:
reused cells' tokens are never counted). Cells of records an attempt copied from an
earlier attempt of its shard (resume) are counted by neither.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from synthbatch.agent_stdlib.layout import PROGRESS_JSON, RunLayout
from synthbatch.agent_stdlib.statefile import StateError, read_json
from synthbatch.control.runs.cost import count
from synthbatch.control.runs.status.records import latest_attempt_dir

FIELDS = ("cells_reused", "cells_generated", "records_reused")
MARK = b'"reuse": {\n'  # plan.json (canonical, indented) of a run that reuses runs


def reuses(layout: RunLayout) -> bool:
    """Whether the run's plan names reused runs (``client.reuse`` not empty), read as
    bytes: a large plan is not decoded for it."""
    try:
        with open(layout.plan_json, "rb") as handle:
            return MARK in handle.read()
    except OSError:
        return False


def _progress_of(layout: RunLayout, shard: int) -> Optional[Dict[str, Any]]:
    """The progress record of the shard's winner attempt, else of its latest attempt;
    None when there is none or it is damaged (status names damage elsewhere)."""
    try:
        won = read_json(layout.winner_json(shard))
        if won is not None and isinstance(won.get("attempt"), int):
            return read_json(layout.attempt(shard, won["attempt"]).progress_json)
        _, latest = latest_attempt_dir(layout, shard)  # the attempt folder's whole path
        return read_json(f"{latest}/{PROGRESS_JSON}") if latest else None
    except (StateError, OSError, ValueError):
        return None


def counts(layout: RunLayout, shards: int) -> Optional[Dict[str, int]]:
    """``{"cells_reused", "cells", "records_reused"}`` over the run's ``shards`` shards;
    None for a run that reuses no run."""
    if not reuses(layout):
        return None
    sums = dict.fromkeys(FIELDS, 0)
    for shard in range(shards):
        record = _progress_of(layout, shard)
        for key in FIELDS:
            sums[key] += count((record or {}).get(key))
    return {"cells_reused": sums["cells_reused"],
            "cells": sums["cells_reused"] + sums["cells_generated"],
            "records_reused": sums["records_reused"]}


def generated(totals: Dict[str, Any], records_done: int, reused: Dict[str, int]) -> None:
    """Make ``totals``' average records/s count generated records only (in place)."""
    active = totals.get("active_s")
    if totals.get("records_per_s") is not None and active:
        totals["records_per_s"] = round(
            max(0, records_done - reused["records_reused"]) / active, 3)


def line(reused: Optional[Dict[str, int]]) -> Optional[str]:
    """``reused 150,000 of 200,000 cells`` (None for a run that reuses no run)."""
    if reused is None:
        return None
    return f"reused {reused['cells_reused']:,} of {reused['cells']:,} cells"
