"""The GGUF header reader (``control/runs/modelinfo.py``) and what the layout takes from it:
bounded, standard library only, every damaged file one line naming it."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from synthbatch.control.planning.layout import llamacpp_context, llamacpp_gpus
from synthbatch.control.planning.modelfacts import FactsError, gguf_facts
from synthbatch.control.runs.modelinfo import ModelUnreadable, read_facts, read_header
from tests.conftest import REPO
from tests.gguf import LLAMA_8B, gguf_bytes, write_gguf


def test_the_header_is_read_and_arrays_are_stepped_over(tmp_path: Path) -> None:
    header, size = read_header(str(write_gguf(tmp_path / "m.gguf", size=5 * 10**9)))
    assert (header.version, header.tensors, size) == (3, 0, 5 * 10**9)
    assert header.metadata["llama.attention.head_count_kv"] == 8
    assert header.metadata["tokenizer.ggml.tokens"] == 3  # an array: its length only
    assert header.metadata["general.name"] == "Llama 3.1 8B"


def test_the_facts_of_a_gguf_give_its_kv_cache(tmp_path: Path) -> None:
    facts = read_facts(str(write_gguf(tmp_path / "m.gguf", size=5 * 10**9)))
    # Llama-3.1-8B: 32 layers x 8 KV heads x (128 + 128) x 2 bytes = 128 KiB a token
    assert (facts.layers, facts.heads, facts.kv_heads) == (32, 32, 8)
    assert facts.kv_bytes_per_token == 32 * 8 * 256 * 2
    assert facts.context == 131072 and facts.quantization == "gguf q4_k_m"
    assert facts.describe() == "5 GB of gguf q4_k_m weights"


def test_the_kv_cache_can_need_a_second_gpu() -> None:
    """5 GB of weights + 128 KiB x 131072 tokens (17 GB) on 16 GB GPUs: the file alone
    fits one, the file and the model's whole context (``-c 0``) need two."""
    facts = gguf_facts(5 * 10**9, "m", LLAMA_8B)
    assert llamacpp_context(facts, []) == 4096
    assert llamacpp_context(facts, ["-c", "0"]) == 131072
    assert llamacpp_context(facts, ["--ctx-size=999999"]) == 131072  # the model's bound
    assert llamacpp_gpus(facts, 16, 8, 4096) == 1
    assert llamacpp_gpus(facts, 16, 8, 131072) == 2


@pytest.mark.parametrize("data,message", [
    (b"", "no 'GGUF' magic"),
    (b"GGML\x03\x00\x00\x00", "no 'GGUF' magic"),
    (b"GGUF" + struct.pack("<I", 9), "GGUF version 9"),
    (gguf_bytes(LLAMA_8B)[:-5], "ends early"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 10**9), "metadata keys"),
    (b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 2**40), "a string of"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k"
     + struct.pack("<I", 77), "k: unknown value type 77"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k"
     + struct.pack("<IIQ", 9, 4, 2**60), "metadata runs past"),
])
def test_a_damaged_header_is_one_line_naming_the_file(tmp_path: Path, data: bytes,
                                                      message: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(ModelUnreadable) as err:
        read_facts(str(path))
    assert message in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("drop,key", [
    ("general.architecture", "general.architecture"),
    ("llama.block_count", "llama.block_count"),
    ("llama.attention.head_count", "llama.attention.head_count"),
    ("llama.embedding_length", "llama.embedding_length"),
])
def test_a_header_without_a_number_names_the_key(tmp_path: Path, drop: str, key: str) -> None:
    metadata = {k: v for k, v in LLAMA_8B.items() if k != drop}
    path = write_gguf(tmp_path / "m.gguf", metadata, size=10**6)
    with pytest.raises(ModelUnreadable, match=f"m.gguf: {key}: missing"):
        read_facts(str(path))


def test_a_header_with_a_bad_number_names_the_key() -> None:
    with pytest.raises(FactsError, match="llama.block_count: expected a whole number"):
        gguf_facts(10**6, "m", {**LLAMA_8B, "llama.block_count": "many"})


def test_a_gguf_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ModelUnreadable, match="cannot read .*missing.gguf"):
        read_facts(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelUnreadable, match="v.gguf: general.architecture: missing"):
        read_facts(str(write_gguf(tmp_path / "v.gguf", {})))


SMOLLM = REPO / ".work" / "serving" / "llamacpp" / "model.gguf"


@pytest.mark.skipif(not SMOLLM.is_file(), reason="no SmolLM2 GGUF (scripts/serving-env)")
def test_the_real_smollm2_gguf() -> None:
    """SmolLM2-135M-Instruct Q4_1: 30 layers, 9 heads, 3 KV heads of 64 (its config)."""
    facts = read_facts(str(SMOLLM.resolve()))
    assert (facts.layers, facts.heads, facts.kv_heads) == (30, 9, 3)
    assert facts.kv_bytes_per_token == 30 * 3 * 128 * 2
    assert facts.context == 8192 and facts.quantization == "gguf q4_1"
