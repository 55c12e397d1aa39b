"""Write small GGUF files for tests: a header of chosen metadata (no tensors), optionally
padded (sparsely) to a size that stands for the weights."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Dict, Optional


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def _value(value: Any) -> bytes:
    if isinstance(value, bool):
        return struct.pack("<I?", 7, value)
    if isinstance(value, int):
        return struct.pack("<II", 4, value)
    if isinstance(value, float):
        return struct.pack("<If", 6, value)
    if isinstance(value, str):
        return struct.pack("<I", 8) + _string(value)
    if isinstance(value, list):  # an array of strings (a tokenizer's vocabulary)
        return struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_string(v) for v in value)
    raise TypeError(type(value))


def gguf_bytes(metadata: Dict[str, Any], tensors: int = 0, version: int = 3) -> bytes:
    """The header of a GGUF file holding ``metadata``."""
    out = b"GGUF" + struct.pack("<IQQ", version, tensors, len(metadata))
    for key, value in metadata.items():
        out += _string(key) + _value(value)
    return out


LLAMA_8B = {"general.architecture": "llama", "general.name": "Llama 3.1 8B",
            "general.file_type": 15, "llama.block_count": 32, "llama.context_length": 131072,
            "llama.embedding_length": 4096, "llama.attention.head_count": 32,
            "llama.attention.head_count_kv": 8, "tokenizer.ggml.tokens": ["a", "b", "c"]}


def write_gguf(path: Path, metadata: Optional[Dict[str, Any]] = None,
               size: Optional[int] = None) -> Path:
    """A GGUF file at ``path`` (``LLAMA_8B``'s metadata by default), ``size`` bytes long."""
    data = gguf_bytes(LLAMA_8B if metadata is None else metadata)
    with open(path, "wb") as handle:
        handle.write(data)
        if size is not None:
            handle.truncate(size)
    return path
