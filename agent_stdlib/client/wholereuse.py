"""Records of a reused run taken whole (issue 31's fast path): no samplers, no rendering,
no request digests.

A record of a reused run is copied (its ``_meta`` made again: every LLM cell marked
``reused_from``, in evaluation order, as the per-cell path writes it) only when what the
per-cell path would compute is proven equal without computing it:

- **the recipe** (:func:`same_recipe`, once per reused run): the same recipe seed, the
  same columns in the same file order with the same ``drop`` flags, every column's
  definition digest equal (own definition + upstream, transitively, + model identity and
  recipe context: ``recipe.reuse.plan_digests``), the same seed-data ``order`` and
  ``fields``. Samplers and seed-row picks are a pure function of (seed, column, index),
  so every non-LLM value and every LLM request is then the same.
- **the seed data** (once per record file): the file's sidecar ``.inputs-<stem>.json``
  (written by the generator before its first record, :func:`write_inputs`) names the
  sha256 of the seed file the records were made from (``none``: no seed data); it must
  equal this run's. A file without one (a run made before it), or one whose records were
  made from two different seed files (a resume after the file changed: ``unknown``),
  takes the per-cell path.
- **the record** (each one): a record line (damaged lines are never records), no
  ``_error``, the columns where the recipe puts them, every LLM cell with its request
  digest, and no earlier reused run giving any cell of that index (the per-cell path
  takes the first run's cells).

Whatever is not proven goes the per-cell way (``records.Engine.reused``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ..contracts import ContractError, Plan, SeedDataSpec
from ..imagedigest import file_sha256
from ..layout import RunLayout
from ..recipe.columns import LLM, VALIDATION
from ..recipe.reuse import plan_digests
from ..statefile import StateError, read_json, write_json_atomic
from .output import record_bytes

NO_SEED = "none"  # the run has no seed data
UNKNOWN = "unknown"  # the records' seed data cannot be named: never taken whole


def inputs_path(records_path: Path) -> Path:
    """The sidecar of ``records-<stem>.jsonl``: ``.inputs-<stem>.json`` beside it (a dot
    file: no record file of the result)."""
    stem = records_path.name[len("records-"):-len(".jsonl")]
    return records_path.with_name(f".inputs-{stem}.json")


def seed_tag(spec: Optional[SeedDataSpec]) -> str:
    """``sha256:<hex>`` of the seed file's bytes, or ``none`` without seed data."""
    return NO_SEED if spec is None else "sha256:" + file_sha256(spec.path)


def read_tag(path: Path) -> str:
    """The seed tag of a sidecar; ``unknown`` when it is missing or damaged."""
    try:
        data = read_json(path)
    except StateError:
        return UNKNOWN
    tag = data.get("seed_data") if data is not None else None
    return tag if isinstance(tag, str) else UNKNOWN


def write_inputs(records_path: Path, own: str, had_records: bool,
                 kept_files: Sequence[Path] = ()) -> None:
    """Write the sidecar of this shard's record file before a record is produced: ``own``,
    unless records already there (``had_records``: an earlier execution of the attempt)
    or copied from ``kept_files`` (an earlier attempt's, on resume) were made from other
    seed data or cannot say (then ``unknown``)."""
    tags = {read_tag(inputs_path(path)) for path in kept_files}
    if had_records:
        tags.add(read_tag(inputs_path(records_path)))
    write_json_atomic(inputs_path(records_path), {"seed_data": own if tags <= {own}
                                                  else UNKNOWN})


def _layout(plan: Plan) -> List[Any]:
    spec = plan.client
    assert spec is not None
    seed = spec.seed_data
    return [spec.seed, [(c.name, c.type, c.drop) for c in spec.columns],
            None if seed is None else (seed.order, list(seed.fields))]


def same_recipe(new: Plan, old: Plan) -> bool:
    """True when every record of ``old`` (a reused run's plan) made from the same seed
    data is the record ``new`` would make, LLM cells aside (see the module docstring)."""
    if new.client is None or old.client is None or not new.client.columns:
        return False
    return _layout(new) == _layout(old) and plan_digests(new) == plan_digests(old)


def provable(new: Plan, run_dir: Path) -> bool:
    """:func:`same_recipe` of ``new`` and the plan of the reused run at ``run_dir``; False
    when that plan cannot be read."""
    try:
        data = read_json(RunLayout(run_dir).plan_json)
        return data is not None and same_recipe(new, Plan.from_dict(data))
    except (StateError, ContractError, ValueError, KeyError, TypeError):
        return False


def eligible(plan: Plan) -> bool:
    """Whether ``plan``'s recipe can take records whole: not when a column is validated
    (its checker runs again), continued (its raw text is not kept) or an LLM column is
    dropped (its value is not in the record: its cells are generated)."""
    spec = plan.client
    return spec is not None and bool(spec.columns) and not any(
        c.type == VALIDATION or c.params.get("continue_from") or (c.drop and c.type in LLM)
        for c in spec.columns)


def record_line(record: Dict[str, Any], index: int, run_id: str, llm: Sequence[str],
                tail: List[str]) -> Optional[bytes]:
    """The line the per-cell path writes for ``record`` (of run ``run_id``; its
    ``_meta.columns`` a dict) reused whole: ``llm`` the LLM columns in evaluation order,
    ``tail`` the record's last keys (its output columns in file order, then ``_meta``);
    None when it is not such a record. ``record`` is changed (the caller's own)."""
    keys = list(record)
    if keys[0] != "index" or keys[-len(tail):] != tail:
        return None
    columns = record["_meta"]["columns"]
    meta: Dict[str, Dict[str, Any]] = {}
    for name in llm:
        cell = columns.get(name)
        if type(cell) is not dict or type(cell.get("request_digest")) is not str:
            return None
        kept = dict(cell)
        kept.setdefault("reused_from", run_id)
        meta[name] = kept
    record["_meta"] = {"index": index, "columns": meta}
    return record_bytes(record)
