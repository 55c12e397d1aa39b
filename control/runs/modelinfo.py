"""Read a model's layout facts on the login node: ``config.json`` and the weight bytes of a
Hugging Face snapshot folder (the safetensors index's ``metadata.total_size``, else the
``*.safetensors`` files' sizes: no weight is ever read), or a GGUF file's size and header
(``control/runs/gguf.py``).

``read_facts`` turns every problem into one ``ModelUnreadable`` line; the caller names the
deployment and asks for the layout by hand.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from synthbatch.control.planning.modelfacts import (
    FactsError,
    ModelFacts,
    facts_from_config,
    gguf_facts,
)
from synthbatch.control.runs.gguf import GgufError, read_header

MAX_JSON_BYTES = 16 * 1024 * 1024  # a config.json or an index is far smaller


class ModelUnreadable(ValueError):
    """The model's facts cannot be read here; the message says which file and why."""


def _json(path: Path) -> object:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_JSON_BYTES + 1)
    except OSError as err:
        raise ModelUnreadable(f"cannot read {path}: {err.strerror or err}") from err
    if len(data) > MAX_JSON_BYTES:
        raise ModelUnreadable(f"{path}: larger than {MAX_JSON_BYTES} bytes")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as err:
        raise ModelUnreadable(f"{path}: not valid JSON ({err})") from err


def weight_bytes(folder: Path) -> int:
    """Exact weight bytes: the index's ``metadata.total_size``, else the sum of the
    ``*.safetensors`` files' sizes (stat only)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        data = _json(index)
        total = data.get("metadata", {}).get("total_size") if isinstance(data, dict) else None
        if isinstance(total, (int, float)) and not isinstance(total, bool) and total > 0:
            return int(total)
        raise ModelUnreadable(f"{index}: no metadata.total_size")
    try:
        sizes = [entry.stat().st_size for entry in os.scandir(folder)
                 if entry.name.endswith(".safetensors") and entry.is_file()]
    except OSError as err:
        raise ModelUnreadable(f"cannot list {folder}: {err.strerror or err}") from err
    if not sizes:
        raise ModelUnreadable(f"{folder}: no model.safetensors.index.json and no "
                              "*.safetensors files")
    return sum(sizes)


def read_facts(path: str) -> ModelFacts:
    """The facts of the model at ``path`` (a snapshot folder, or a ``.gguf`` file)."""
    model = Path(path)
    if not model.is_absolute():
        raise ModelUnreadable(f"{path!r} is not a path on this node (a hub id is not read)")
    if model.suffix == ".gguf":
        try:
            header, size = read_header(str(model))
            return gguf_facts(size, model.name, header.metadata)
        except OSError as err:
            raise ModelUnreadable(f"cannot read {model}: {err.strerror or err}") from err
        except (GgufError, FactsError) as err:
            raise ModelUnreadable(f"{model}: {err}") from err
    if not model.is_dir():
        raise ModelUnreadable(f"{model} is not a folder this node can read")
    config = _json(model / "config.json")
    if not isinstance(config, dict):
        raise ModelUnreadable(f"{model / 'config.json'}: expected a JSON object")
    try:
        return facts_from_config(config, weight_bytes(model), model.name)
    except FactsError as err:
        raise ModelUnreadable(f"{model / 'config.json'}: {err}") from err
