"""The dataset card of a merge: ``card.json`` (machine-readable) and ``README.md`` (a YAML
header the Hugging Face Hub and ``datasets`` read, and a body a person reads).

Everything comes from the run's durable state: the plan (recipe or client, deployments,
images), the merge's manifest (records, dropped, attempts), every shard's attempt folders
(attempts per shard), ``run.json`` and ``totals.json`` (dates, GPU-hours), the statistics
of the records the merge read (``colstats``) and, for Data Designer clients, the profile
each shard kept (``.dd-profile-*.json`` in its output). What cannot be read is left out
and said (``notes``), never guessed. :func:`card_data` gathers, :func:`render` writes the
README text (pure).
"""

from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Optional

import pyarrow as pa

from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import StateError, read_json
from synthbatch.agent_stdlib.text import visible
from synthbatch.control.errors import SynthbatchError
from synthbatch.control.runs.cost import card_cost
from synthbatch.control.runs.cost import lines as cost_lines
from synthbatch.control.runs.status.totals import created_at, ended_at
from synthbatch.control.runs.store import attempt_numbers, load_plan

CARD_VERSION = 1


def size_category(records: int) -> str:
    """The Hub's ``size_categories`` bucket of ``records``."""
    bounds = [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
              (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M"),
              (100_000_000, "10M<n<100M"), (1_000_000_000, "100M<n<1B")]
    return next((name for bound, name in bounds if records < bound), "n>1T")


def feature(kind: pa.DataType) -> Dict[str, Any]:
    """One Arrow type as a ``datasets`` feature in its YAML form (``dtype``, ``struct``,
    ``list``), as ``datasets.Features._to_yaml_list`` writes it."""
    if pa.types.is_struct(kind):
        return {"struct": [{"name": f.name, **feature(f.type)} for f in kind]}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        inner = feature(kind.value_type)
        if set(inner) == {"dtype"}:
            return {"list": inner["dtype"]}
        return {"list": inner["struct"] if set(inner) == {"struct"} else inner}
    names = {"double": "float64", "float": "float32"}  # the others: Arrow's own name
    return {"dtype": names.get(str(kind), str(kind))}


def _yaml(value: Any, indent: int = 0) -> List[str]:
    """A small YAML writer for the header: mappings, lists, JSON-quoted scalars."""
    pad = " " * indent
    lines: List[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{key}:")
                lines += _yaml(item, indent + (0 if isinstance(item, list) else 2))
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
    else:
        for item in value:
            if isinstance(item, dict) and item:
                inner = _yaml(item, indent + 2)
                lines.append(f"{pad}- {inner[0].lstrip()}")
                lines += inner[1:]
            else:
                lines.append(f"{pad}- {_scalar(item)}")
    return lines


def _scalar(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return "{}" if isinstance(value, dict) else "[]"
    return json.dumps(value, ensure_ascii=False)


def _iso(moment: Optional[float]) -> Optional[str]:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment)) if moment else None


def _image(container: Any) -> Optional[Dict[str, str]]:
    return {"alias": container.image, "sha256": container.sha256} if container else None


def _client(plan: Any) -> Dict[str, Any]:
    if plan.client_command is not None:
        return {"kind": "command", "argv": list(plan.client_command.argv),
                "image": _image(plan.client_command.container)}
    if plan.client_data_designer is not None:
        spec = plan.client_data_designer
        return {"kind": "data-designer", "config": spec.config,
                "config_sha256": spec.config_sha256 or None, "models": dict(spec.models),
                "image": _image(spec.container)}
    spec = plan.client
    columns = [{"name": c.name, "type": c.type, "drop": c.drop,
                **{k: c.params[k] for k in ("model", "system", "prompt", "template",
                                            "schema", "scores", "values", "max_tokens",
                                            "temperature") if k in c.params}}
               for c in spec.columns]
    if not spec.columns:
        columns = [{"name": "completion", "type": "llm-text", "model": spec.model,
                    "prompt": spec.prompt_template, "system": spec.system_prompt,
                    "max_tokens": spec.max_tokens, "temperature": spec.temperature}]
    seed = spec.seed_data
    return {"kind": "generate", "seed": spec.seed, "on_error": spec.on_error,
            "seed_data": {"path": seed.path, "order": seed.order, "rows": seed.rows}
            if seed else None, "columns": columns, "image": _image(spec.container)}


def _models(plan: Any) -> List[Dict[str, Any]]:
    return [{"alias": d.alias, "engine": d.engine, "model": d.model,
             "served_name": d.served_name, "replicas": d.replicas,
             "gpus_per_replica": d.gpus_per_replica, "tensor_parallel": d.tensor_parallel,
             "pipeline_parallel": d.pipeline_parallel, "image": _image(d.container)}
            for d in plan.deployments]


def _totals(layout: RunLayout, records: int) -> Dict[str, Any]:
    try:
        kept = read_json(layout.totals_json)
    except (StateError, OSError, ValueError):
        kept = None
    numbers = kept.get("totals") if isinstance(kept, dict) else None
    hours = numbers.get("gpu_hours") if isinstance(numbers, dict) else None
    if not isinstance(hours, (int, float)) or isinstance(hours, bool):
        why = numbers.get("gpu_hours_from") if isinstance(numbers, dict) else None
        return {"gpu_hours": None, "gpu_hours_from": why if isinstance(why, str) else
                "not counted yet (synthbatch status RUN counts them once the run is over)"}
    figures = card_cost(layout)  # issue 32: cost, per model and per column
    return {"gpu_hours": hours, "gpu_hours_from": numbers.get("gpu_hours_from"),
            "gpu_hours_per_1000_records": round(hours * 1000 / records, 4) if records else None,
            **({"figures": figures} if figures is not None else {})}


def card_data(layout: RunLayout, manifest: Dict[str, Any], stats: Dict[str, Any],
              schema: Optional[pa.Schema], data_files: str,
              profiles: Dict[int, Any]) -> Dict[str, Any]:
    """The card as plain data (``card.json``); ``notes`` says what could not be read."""
    notes: List[str] = []
    card: Dict[str, Any] = {"schema_version": CARD_VERSION, "run_id": manifest["run_id"],
                            "plan_sha256": manifest["plan_sha256"],
                            "format": manifest["format"], "data_files": data_files}
    try:
        plan = load_plan(layout)
        card.update(name=plan.name, agent_sha256=plan.agent_sha256 or None,
                    client=_client(plan), models=_models(plan),
                    planned_records=plan.total_records, max_attempts=plan.max_attempts)
    except (SynthbatchError, StateError, OSError) as err:
        notes.append(f"plan.json could not be read: {err}")
    shards = []
    for entry in manifest["shards"]:
        try:
            attempts = len(attempt_numbers(layout, entry["shard"]))
        except OSError:
            attempts = None
        shards.append({"shard": entry["shard"], "winner_attempt": entry["attempt"],
                       "attempts": attempts, "records": entry["records"],
                       "dropped": entry["dropped"]})
    shards_count = len(manifest["shards"]) + len(manifest["missing_shards"])
    records = manifest["records"]
    try:
        ended = ended_at(layout, shards_count)
    except (StateError, OSError) as err:
        ended = None
        notes.append(f"when the last shard ended could not be read: {err}")
    card.update(records=records, dropped=manifest["dropped"],
                dropped_files=manifest.get("dropped_files", []),
                complete=manifest["complete"], missing_shards=manifest["missing_shards"],
                created_at=_iso(created_at(layout)),
                ended_at=_iso(ended),
                shards=shards, cost=_totals(layout, records),
                tokens=stats.get("tokens", {}), statistics=stats.get("columns", {}),
                features=[{"name": f.name, **feature(f.type)} for f in schema]
                if schema is not None else None)
    if profiles:
        card["data_designer_profiles"] = {str(k): v for k, v in sorted(profiles.items())}
    if stats.get("note"):
        notes.append(stats["note"])
    card["notes"] = notes
    return card


def _line(text: Any, limit: int = 200) -> str:
    """Untrusted text on one Markdown line: control characters escaped, ``|`` kept out of
    tables, cut at ``limit``."""
    shown = visible(str(text)).replace("|", "\\|").replace("\n", " ")
    return shown if len(shown) <= limit else shown[:limit] + "..."


def header(card: Dict[str, Any]) -> Dict[str, Any]:
    """The YAML header: the data files as the ``default`` config, features, size."""
    head: Dict[str, Any] = {
        "license": "unknown",  # set it before publishing
        "tags": ["synthetic", "synthbatch"],
        "size_categories": [size_category(card["records"])],
        "configs": [{"config_name": "default",
                     "data_files": [{"split": "train", "path": card["data_files"]}]}],
    }
    if card.get("features") and card["format"] == "parquet":
        head["dataset_info"] = {"features": card["features"],
                                "splits": [{"name": "train",
                                            "num_examples": card["records"]}]}
    return head


def render(card: Dict[str, Any]) -> str:
    """The README.md text of ``card``."""
    out = ["---", *_yaml(header(card)), "---", "",
           f"# {_line(card.get('name', card['run_id']))}", "",
           f"Synthetic data generated by synthbatch, run `{_line(card['run_id'])}`.", "",
           "## Provenance", "",
           f"- plan sha256: `{card['plan_sha256']}`"]
    if card.get("agent_sha256"):
        out.append(f"- agent bundle sha256: `{card['agent_sha256']}`")
    out += [f"- created: {card.get('created_at') or 'unknown'}, last shard recorded: "
            f"{card.get('ended_at') or 'unknown'}",
            f"- records: {card['records']} ({card['dropped']} dropped by the client"
            + (f"; shards left out: {', '.join(map(str, card['missing_shards']))}"
               if card["missing_shards"] else "") + ")"]
    cost = card["cost"]
    if cost.get("gpu_hours") is not None:
        per = cost.get("gpu_hours_per_1000_records")
        out.append(f"- GPU-hours: {cost['gpu_hours']}" + (f" ({per} per 1,000 records)"
                                                          if per is not None else ""))
    else:
        out.append(f"- GPU-hours: unknown ({_line(cost.get('gpu_hours_from'))})")
    out += [f"- {line.strip()}" for line in cost_lines(cost.get("figures") or {})]
    retried = [s for s in card["shards"] if (s["attempts"] or 1) > 1]
    out.append(f"- shards: {len(card['shards'])}, {len(retried)} needed more than one "
               "attempt" + (": " + ", ".join(f"shard {s['shard']} ({s['attempts']})"
                                             for s in retried[:20]) if retried else ""))
    if card.get("models"):
        out += ["", "## Models", "", "| alias | engine | model | served as | replicas x GPUs "
                "| image sha256 |", "|---|---|---|---|---|---|"]
        for m in card["models"]:
            image = f"{_line(m['image']['alias'])} `{m['image']['sha256'][:16]}`" \
                if m["image"] else "(host)"
            out.append(f"| {_line(m['alias'])} | {_line(m['engine'])} | {_line(m['model'])} "
                       f"| {_line(m['served_name'])} | {m['replicas']} x "
                       f"{m['gpus_per_replica']} | {image} |")
    client = card.get("client")
    if client:
        out += ["", "## How it was generated", ""]
        if client["kind"] == "generate":
            seed = client["seed_data"]
            out.append(f"The built-in generator, seed {client['seed']}, on_error "
                       f"`{client['on_error']}`" + (f", seed data `{_line(seed['path'])}` "
                                                    f"({seed['order']})" if seed else "")
                       + ".")
            out += ["", "| column | type | model | prompt | tokens in / out |",
                    "|---|---|---|---|---|"]
            for c in client["columns"]:
                used = card["tokens"].get(c["name"])
                tokens = f"{used['prompt_tokens']} / {used['completion_tokens']}" \
                    if used else ""
                text = c.get("prompt") or c.get("template") or ""
                out.append(f"| {_line(c['name'])}{' (dropped)' if c.get('drop') else ''} | "
                           f"{c['type']} | {_line(c.get('model', ''))} | {_line(text, 120)} "
                           f"| {tokens} |")
        elif client["kind"] == "command":
            out.append(f"A command client: `{_line(' '.join(client['argv']))}`.")
        else:
            out.append(f"NeMo Data Designer, config `{_line(client['config'])}` (sha256 "
                       f"`{client.get('config_sha256') or 'unknown'}`).")
    out += ["", "## Columns", "", "| column | type | nulls | empty | min / mean / max (text: "
            "length) | values |", "|---|---|---|---|---|---|"]
    for name, s in card["statistics"].items():
        length = s.get("length") or s.get("range")
        spread = f"{length['min']} / {length['mean']} / {length['max']}" if length else ""
        values = s.get("values") or {}
        shown = ", ".join(f"{_line(k, 40)}: {v}" for k, v in list(values.items())[:8])
        for score, counts in s.get("scores", {}).items():
            shown += ("; " if shown else "") + f"{_line(score, 40)}: " + ", ".join(
                f"{_line(k, 20)}={v}" for k, v in counts.items())
        out.append(f"| {_line(name)} | {_line(s['type'], 60)} | {s['nulls']} | "
                   f"{s.get('empty', '')} | {spread} | {shown} |")
    if card.get("data_designer_profiles"):
        out += ["", f"Data Designer's own profile of each shard is in card.json "
                f"(`data_designer_profiles`, {len(card['data_designer_profiles'])} shards)."]
    if card["notes"]:
        out += ["", "## Notes", ""] + [f"- {_line(note, 400)}" for note in card["notes"]]
    out += ["", "## Loading", "", "```python", "from datasets import load_dataset",
            "ds = load_dataset(\"path/to/merged\")  # this folder", "```", "",
            "License: not set (`license: unknown` above); set it before publishing.", ""]
    return "\n".join(out)
