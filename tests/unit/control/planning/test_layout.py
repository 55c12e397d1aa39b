"""The automatic layout's rule against published deployments: 10 public models x A100 80 GB,
H100 80 GB, H200 141 GB (8 GPUs a node).

The models are ``fixtures/models/<name>/``: each checkpoint's ``config.json`` numbers and
a ``model.safetensors.index.json`` holding only ``metadata.total_size`` (no weights). The
byte totals are computed from the config's tensor shapes at the checkpoint's dtype
(bf16: 2 bytes; FP8 layers 1 byte and their scales; MXFP4 4.25 bits), except DeepSeek-V3,
whose total is its index's. Each expected layout names where it comes from: a published
recipe or guide of the engines (or the model's deployment guide) where one exists for
that GPU; else "fit" (the memory rule: nothing smaller fits, stated in the row).
"""

from __future__ import annotations

from typing import Optional

import pytest

from synthbatch.control.planning.layout import (
    KV_SEQUENCES,
    MIN_CONTEXT,
    choose_parallel,
    fits,
    tp_choices,
    valid_tp,
)
from synthbatch.control.planning.modelfacts import FactsError, facts_from_config
from synthbatch.control.runs.modelinfo import ModelUnreadable, read_facts, weight_bytes
from tests.conftest import REPO

MODELS = REPO / "fixtures" / "models"
GPUS = {"A100-80": 80.0, "H100-80": 80.0, "H200-141": 141.0}
PER_NODE = 8
KV_TOKENS = KV_SEQUENCES * MIN_CONTEXT

VLLM_DIST = "vLLM docs, Distributed Inference and Serving (TP = GPUs of a node, PP = nodes)"
VLLM_LLAMA31 = ("vLLM blog 'Announcing Llama 3.1 Support in vLLM' (2024-07-23): 405B FP8 on "
                "one node of 8 x H100 or 8 x A100 80 GB (FP8 weights via Marlin), BF16 over "
                "2 nodes with pipeline parallelism")
FIT = "fit: no published recipe for this GPU found; nothing smaller fits (rule)"

# (model folder, GPU, TP, PP, source)
TABLE = [
    ("Llama-3.1-8B-Instruct", "A100-80", 1, 1, "Meta model card / vLLM quickstart: one GPU"),
    ("Llama-3.1-8B-Instruct", "H100-80", 1, 1, "Meta model card / vLLM quickstart: one GPU"),
    ("Llama-3.1-8B-Instruct", "H200-141", 1, 1, "Meta model card / vLLM quickstart: one GPU"),
    ("Llama-3.1-70B-Instruct", "A100-80", 4, 1,
     "vLLM docs, tensor parallelism example: Llama-3.1-70B-Instruct, tensor_parallel_size=4"),
    ("Llama-3.1-70B-Instruct", "H100-80", 4, 1,
     "vLLM docs, tensor parallelism example: Llama-3.1-70B-Instruct, tensor_parallel_size=4"),
    ("Llama-3.1-70B-Instruct", "H200-141", 2, 1,
     "issue 36 (TP 2 on 141 GB); " + FIT + ": TP 1 needs 164 GB of 127 GB usable"),
    ("Llama-3.1-405B-Instruct", "A100-80", 8, 2, VLLM_LLAMA31 + "; " + VLLM_DIST),
    ("Llama-3.1-405B-Instruct", "H100-80", 8, 2, VLLM_LLAMA31 + "; " + VLLM_DIST),
    ("Llama-3.1-405B-Instruct", "H200-141", 8, 1,
     FIT + ": 8 x 141 GB hold 812 GB of weights on one node"),
    ("Llama-3.1-405B-Instruct-FP8", "A100-80", 8, 1, VLLM_LLAMA31),
    ("Llama-3.1-405B-Instruct-FP8", "H100-80", 8, 1, VLLM_LLAMA31),
    ("Llama-3.1-405B-Instruct-FP8", "H200-141", 8, 1,
     VLLM_LLAMA31 + "; TP 4 needs 132 GB of 127 GB usable (attention and the first and "
     "last FFN stay bf16: 487 GB)"),
    ("Qwen2.5-72B-Instruct", "A100-80", 4, 1,
     "Qwen docs, vLLM deployment: 72B with --tensor-parallel-size 4"),
    ("Qwen2.5-72B-Instruct", "H100-80", 4, 1,
     "Qwen docs, vLLM deployment: 72B with --tensor-parallel-size 4"),
    ("Qwen2.5-72B-Instruct", "H200-141", 2, 1, FIT + ": as Llama-3.1-70B"),
    ("Qwen3-32B", "A100-80", 2, 1,
     FIT + ": 66 GB of weights leave 6 GB for a 17 GB KV target on one 80 GB GPU"),
    ("Qwen3-32B", "H100-80", 2, 1,
     FIT + ": 66 GB of weights leave 6 GB for a 17 GB KV target on one 80 GB GPU"),
    ("Qwen3-32B", "H200-141", 1, 1, FIT + ": one 141 GB GPU holds weights and KV"),
    ("Qwen3-235B-A22B", "A100-80", 8, 1,
     "GPUStack performance lab / neural-nova vLLM recipe: BF16 on 8 x H100 80 GB, TP 8"),
    ("Qwen3-235B-A22B", "H100-80", 8, 1,
     "neural-nova vLLM serving recipe: BF16 on 8 x H100 80 GB, tensor-parallel 8"),
    ("Qwen3-235B-A22B", "H200-141", 4, 1,
     FIT + ": 4 x 141 GB hold 470 GB (TP 2 needs 243 GB a GPU)"),
    ("Mixtral-8x7B-Instruct-v0.1", "A100-80", 2, 1,
     "Mistral's deployment guide: Mixtral 8x7B needs 2 x 80 GB GPUs in 16-bit"),
    ("Mixtral-8x7B-Instruct-v0.1", "H100-80", 2, 1,
     "Mistral's deployment guide: Mixtral 8x7B needs 2 x 80 GB GPUs in 16-bit"),
    ("Mixtral-8x7B-Instruct-v0.1", "H200-141", 1, 1, FIT + ": 93 GB on one 141 GB GPU"),
    ("DeepSeek-V3", "A100-80", 8, 2,
     "SGLang DeepSeek V3 guide: 16 x A100 (INT8, same bytes as FP8; FP8 block kernels "
     "need the engine's Ampere fallback); " + VLLM_DIST),
    ("DeepSeek-V3", "H100-80", 8, 2, "SGLang DeepSeek V3 guide: FP8 on 2 x 8 x H100; "
     + VLLM_DIST),
    ("DeepSeek-V3", "H200-141", 8, 1,
     "vLLM recipes, DeepSeek-V3/R1: 8 x H200 with FP8, --tensor-parallel-size 8"),
    ("gpt-oss-120b", "A100-80", 1, 1,
     "GPUStack performance lab, gpt-oss-120b on A100 80 GB: vllm serve without -tp"),
    ("gpt-oss-120b", "H100-80", 1, 1,
     "OpenAI cookbook 'How to run gpt-oss with vLLM': fits on a single H100"),
    ("gpt-oss-120b", "H200-141", 1, 1,
     "NVIDIA Dynamo recipe gpt-oss-120b: 8 x H200 as 8 TP 1 replicas"),
]


def facts(name: str):
    return read_facts(str(MODELS / name))


def test_the_table_covers_ten_models_on_three_gpus() -> None:
    assert len({row[0] for row in TABLE}) >= 10
    assert {(row[0], row[1]) for row in TABLE} == {(m, g) for m in {r[0] for r in TABLE}
                                                  for g in GPUS}


@pytest.mark.parametrize("name,gpu,tp,pp,source", TABLE,
                         ids=[f"{r[0]}@{r[1]}" for r in TABLE])
def test_the_chosen_layout_is_the_published_one_and_fits(name: str, gpu: str, tp: int,
                                                         pp: int, source: str) -> None:
    model, memory = facts(name), GPUS[gpu]
    chosen = choose_parallel(model, memory, PER_NODE, KV_TOKENS)
    assert (chosen.tp, chosen.pp) == (tp, pp), source
    assert chosen.nodes_per_replica == (1 if tp * pp <= PER_NODE else tp * pp // PER_NODE)
    assert fits(model, tp, pp, KV_TOKENS, memory)
    assert valid_tp(model, tp)
    # nothing smaller fits: every smaller TP on one node, and (across nodes) fewer stages
    smaller = [(t, 1) for t in tp_choices(model, PER_NODE) if t * 1 < tp * pp]
    smaller += [(PER_NODE, s) for s in range(2, pp)]
    assert not [s for s in smaller if fits(model, *s, KV_TOKENS, memory)], source


def test_tp_divides_the_heads_and_the_kv_heads_as_vllm_requires() -> None:
    qwen = facts("Qwen3-235B-A22B")  # 64 heads, 4 KV heads: TP 8 replicates each KV head
    assert tp_choices(qwen, 8) == [1, 2, 4, 8]
    odd = facts_from_config({"num_hidden_layers": 2, "num_attention_heads": 12,
                             "num_key_value_heads": 3, "hidden_size": 768,
                             "intermediate_size": 3072}, 10**9, "odd")
    assert tp_choices(odd, 8) == [1]  # 12 heads and 3 KV heads: 2 and 4 divide neither way


def test_tp_beyond_the_kv_heads_counts_the_replicated_cache() -> None:
    qwen = facts("Qwen3-235B-A22B")
    from synthbatch.control.planning.layout import per_gpu_bytes
    with_copy = per_gpu_bytes(qwen, 8, 1, KV_TOKENS)
    half = (qwen.weight_bytes + KV_TOKENS * qwen.kv_bytes_per_token) / 8 + 2e9
    assert with_copy > half  # TP 8 over 4 KV heads keeps two copies of the cache


def test_a_written_tp_is_kept_and_pp_chosen_for_it() -> None:
    big = facts("Llama-3.1-405B-Instruct")
    chosen = choose_parallel(big, 80.0, 8, KV_TOKENS, tp=4)
    assert (chosen.tp, chosen.pp) == (4, 4)


def test_moe_active_parameters_come_from_the_routed_experts() -> None:
    assert facts("DeepSeek-V3").active_params / 1e9 == pytest.approx(37, abs=2)
    assert facts("Qwen3-235B-A22B").active_params / 1e9 == pytest.approx(22, abs=1)
    assert facts("Mixtral-8x7B-Instruct-v0.1").active_params / 1e9 == pytest.approx(12.9,
                                                                                   abs=0.3)
    assert facts("gpt-oss-120b").active_params / 1e9 == pytest.approx(5.1, abs=1)


def test_sliding_window_and_mla_caches_are_smaller_per_token() -> None:
    oss = facts("gpt-oss-120b")  # 18 of 36 layers are full attention
    assert oss.kv_bytes_per_token == 2 * 18 * 8 * 64 * 2
    ds = facts("DeepSeek-V3")  # one 512 + 64 latent per layer, on every rank
    assert (ds.kv_bytes_per_token, ds.kv_heads) == (61 * 576 * 2, 1)


# ------------------------------------------------------------------------------------------
# reading a model folder (the edge)


def test_weights_from_the_files_sizes_without_an_index(tmp_path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text((MODELS / "Llama-3.1-8B-Instruct" / "config.json")
                                        .read_text())
    for index, size in enumerate((3 * 10**9, 5 * 10**9)):
        with open(folder / f"model-{index}.safetensors", "wb") as handle:
            handle.truncate(size)  # sparse: no bytes are written or read
    assert weight_bytes(folder) == 8 * 10**9
    assert read_facts(str(folder)).weight_bytes == 8 * 10**9


@pytest.mark.parametrize("setup,message", [
    (None, "is not a folder this node can read"),
    ("{", "not valid JSON"),
    ("[]", "expected a JSON object"),
    ('{"num_attention_heads": 8, "hidden_size": 64}', "num_hidden_layers: missing"),
])
def test_an_unreadable_model_is_one_line(tmp_path, setup: Optional[str],
                                         message: str) -> None:
    folder = tmp_path / "m"
    if setup is not None:
        folder.mkdir()
        (folder / "config.json").write_text(setup)
        (folder / "model.safetensors").write_bytes(b"x")
    with pytest.raises(ModelUnreadable) as err:
        read_facts(str(folder))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_hub_id_is_not_read() -> None:
    with pytest.raises(ModelUnreadable, match="not a path on this node"):
        read_facts("meta-llama/Llama-3.1-8B-Instruct")


def test_a_gguf_is_its_size(tmp_path) -> None:
    from tests.gguf import write_gguf

    gguf = write_gguf(tmp_path / "m.gguf", size=7 * 10**9)
    assert read_facts(str(gguf)).weight_bytes == 7 * 10**9


def test_a_moe_without_experts_per_token_names_the_key() -> None:
    with pytest.raises(FactsError, match="num_experts_per_tok"):
        facts_from_config({"num_hidden_layers": 2, "num_attention_heads": 8,
                           "hidden_size": 64, "intermediate_size": 128,
                           "num_local_experts": 8}, 10**9, "x")


def test_the_recipe_tokens_per_alias() -> None:
    """max_tokens out; the prompt's text at 4 characters a token, a placeholder naming an
    LLM column counting that column's max_tokens (the judge reads the writer's draft)."""
    from synthbatch.control.config.client import GenerateClient
    from synthbatch.control.planning.layout import alias_tokens

    client = GenerateClient.model_validate({"columns": [
        {"name": "topic", "type": "category", "values": ["a", "b"]},
        {"name": "draft", "type": "llm-text", "model": "writer", "max_tokens": 100,
         "prompt": "12345678{topic}"},
        {"name": "verdict", "type": "llm-text", "model": "judge", "max_tokens": 10,
         "prompt": "1234{draft}"}]})
    got = alias_tokens(client)
    assert got["writer"] == (2 + 4, 100, 106)  # 8 characters + a category column (4)
    assert got["judge"] == (1 + 100, 10, 111)
    template = GenerateClient.model_validate({"model": "m", "prompt_template": "x" * 40,
                                              "max_tokens": 7})
    assert alias_tokens(template) == {"m": (10.0, 7.0, 17)}
