"""Read a model's layout facts on the login node: ``config.json`` and the weight bytes of a
Hugging Face snapshot folder (the safetensors index's ``metadata.total_size``, else the
``*.safetensors`` files' sizes: no weight is ever read), or a GGUF file's size and header.

A GGUF header is read with the standard library only, bounded, never a tensor: magic,
version, tensor count and the metadata key/values the automatic layout needs
(``general.architecture``, ``<arch>.block_count``, ``<arch>.attention.head_count``,
``<arch>.attention.head_count_kv``, ``<arch>.embedding_length``,
``<arch>.context_length``, ``general.file_type``, ...). The format
(github.com/ggml-org/ggml, docs/gguf.md): ``GGUF``, a uint32 version (1-3), the tensor and
key/value counts (uint64; uint32 in version 1), then each key/value: a string key (uint64
length + UTF-8; uint32 in version 1), a uint32 value type and the value; all
little-endian. Arrays (the tokenizer's 50k-150k strings) are stepped over, not kept.

``read_facts`` turns every problem into one ``ModelUnreadable`` line; the caller names the
deployment and asks for the layout by hand.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Dict, Tuple, Union

from synthbatch.control.planning.modelfacts import (
    FactsError,
    ModelFacts,
    facts_from_config,
    gguf_facts,
)

MAX_JSON_BYTES = 16 * 1024 * 1024  # a config.json or an index is far smaller
MAGIC = b"GGUF"
MAX_HEADER_BYTES = 256 * 1024 * 1024  # the metadata of the largest vocabularies is < 30 MB
MAX_KEYS = 100_000
MAX_STRING = 16 * 1024 * 1024
MAX_KEY = 65_535  # the spec's bound on a key's length

Value = Union[int, float, bool, str, None]

# value type -> struct format of one scalar
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GgufError(ValueError):
    """A file that is not a readable GGUF header; the message says what is wrong."""


@dataclass(frozen=True)
class GgufHeader:
    """What the header says: version, tensor count and the scalar metadata (arrays are
    recorded as their length only)."""

    version: int
    tensors: int
    metadata: Dict[str, Value]


class _Reader:
    """Little-endian reads from a file with a budget of bytes (``MAX_HEADER_BYTES``)."""

    def __init__(self, handle: BinaryIO, version: int = 3) -> None:
        self.handle = handle
        self.used = 0
        self.version = version

    def take(self, count: int) -> bytes:
        self.used += count
        if self.used > MAX_HEADER_BYTES:
            raise GgufError(f"metadata runs past {MAX_HEADER_BYTES} bytes")
        data = self.handle.read(count)
        if len(data) < count:
            raise GgufError("the header ends early (a truncated file)")
        return data

    def skip(self, count: int) -> None:
        self.used += count
        if self.used > MAX_HEADER_BYTES:
            raise GgufError(f"metadata runs past {MAX_HEADER_BYTES} bytes")
        self.handle.seek(count, 1)

    def scalar(self, fmt: str) -> Union[int, float, bool]:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def count(self) -> int:
        return int(self.scalar("<I" if self.version == 1 else "<Q"))

    def string(self, limit: int = MAX_STRING) -> str:
        length = self.count()
        if length > limit:
            raise GgufError(f"a string of {length} bytes (more than {limit})")
        return self.take(length).decode("utf-8", errors="replace")

    def value(self, kind: int, key: str) -> Value:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            inner = int(self.scalar("<I"))
            length = self.count()
            if inner in _SCALARS:
                self.skip(length * struct.calcsize(_SCALARS[inner]))
            elif inner == _STRING:
                for _ in range(length):
                    self.skip(self.count())
            else:
                raise GgufError(f"{key}: an array of value type {inner} (not supported)")
            return length
        raise GgufError(f"{key}: unknown value type {kind}")


def parse(handle: BinaryIO) -> GgufHeader:
    """The header of an open GGUF file (GgufError on anything else)."""
    head = handle.read(8)
    if len(head) < 8 or head[:4] != MAGIC:
        raise GgufError("not a GGUF file (no 'GGUF' magic at the start)")
    version = struct.unpack("<I", head[4:])[0]
    if version not in (1, 2, 3):
        raise GgufError(f"GGUF version {version} (this reader knows 1-3)")
    reader = _Reader(handle, version)
    tensors, keys = reader.count(), reader.count()
    if keys > MAX_KEYS:
        raise GgufError(f"{keys} metadata keys (more than {MAX_KEYS}: a damaged header)")
    metadata: Dict[str, Value] = {}
    for _ in range(keys):
        key = reader.string(MAX_KEY)
        metadata[key] = reader.value(int(reader.scalar("<I")), key)
    return GgufHeader(version, tensors, metadata)


def read_header(path: str) -> Tuple[GgufHeader, int]:
    """The header of the GGUF file at ``path`` and the file's size (GgufError, or OSError
    when it cannot be opened)."""
    with open(path, "rb") as handle:
        size = handle.seek(0, 2)
        handle.seek(0)
        try:
            return parse(handle), size
        except struct.error as err:  # pragma: no cover - take() checks lengths first
            raise GgufError(f"malformed header ({err})") from err


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
