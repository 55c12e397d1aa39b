"""What the automatic layout knows of a model: its ``config.json`` numbers and weight bytes
(pure: the caller reads the files, ``control/runs/modelinfo.py``).

``facts_from_config`` takes the parsed ``config.json`` of a Hugging Face checkpoint and the
exact bytes of its weights (the safetensors index's ``metadata.total_size`` or the files'
sizes) and derives what the layout rule needs: attention heads and KV heads (what tensor
parallelism must divide), the KV cache bytes per token (GQA, sliding-window layers, MLA),
and the active parameters per token (MoE: only the routed experts count), the measure of a
token's cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

KV_CACHE_BYTES = 2  # the engines' default KV cache dtype: the model's 16-bit dtype


class FactsError(ValueError):
    """A config.json the layout cannot use; the message names the key."""


@dataclass(frozen=True)
class ModelFacts:
    """One model as the layout rule sees it."""

    name: str
    weight_bytes: int
    layers: int
    heads: int
    kv_heads: int  # what the KV cache splits over (MLA: 1, every rank keeps the latent)
    kv_bytes_per_token: int  # the whole model's KV cache per token, one copy
    params: float  # total parameters
    active_params: float  # per token (MoE: shared part + the routed experts)
    dtype: str
    quantization: Optional[str] = None
    experts: int = 0
    context: Optional[int] = None  # the model's trained context (GGUF)

    def describe(self) -> str:
        """``141 GB of bf16 weights`` and the like."""
        kind = self.quantization or {"bfloat16": "bf16", "float16": "fp16",
                                     "float32": "fp32"}.get(self.dtype, self.dtype)
        return f"{self.weight_bytes / 1e9:.0f} GB of {kind} weights"


def _int(config: Mapping[str, Any], key: str, default: Optional[int] = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        if value is None:
            raise FactsError(f"{key}: missing")
        raise FactsError(f"{key}: expected a whole number, got {type(value).__name__}")
    return value


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """A multimodal config's language model part (``text_config``), else the config."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) and "num_hidden_layers" in inner else config


def _quantization(config: Mapping[str, Any]) -> Optional[str]:
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        return None
    method = quant.get("quant_method") or quant.get("quant_type")
    if method == "compressed-tensors":
        return "fp8" if "fp8" in str(quant).lower() else "compressed-tensors"
    return str(method) if isinstance(method, str) else "quantized"


def _kv_bytes(config: Mapping[str, Any], layers: int, heads: int, kv_heads: int,
              head_dim: int) -> int:
    """KV cache bytes per token: MLA keeps one latent per layer; sliding-window layers
    (``layer_types``) hold only their window, counted here as nothing per long token."""
    if isinstance(config.get("kv_lora_rank"), int):
        rope = _int(config, "qk_rope_head_dim", 64)
        return layers * (config["kv_lora_rank"] + rope) * KV_CACHE_BYTES
    kinds = config.get("layer_types")
    full = layers
    if isinstance(kinds, list) and kinds and len(kinds) == layers:
        full = sum(1 for kind in kinds if kind != "sliding_attention")
    return 2 * full * kv_heads * head_dim * KV_CACHE_BYTES


def _experts(config: Mapping[str, Any]) -> tuple:
    """(routed experts, of them active per token); (0, 0) for a dense model."""
    experts = next((config[k] for k in ("num_local_experts", "num_experts", "n_routed_experts")
                    if isinstance(config.get(k), int)), 0)
    if experts <= 1:
        return 0, 0
    active = next((config[k] for k in ("num_experts_per_tok", "num_experts_per_token",
                                       "experts_per_token")
                   if isinstance(config.get(k), int)), 0)
    if not active:
        raise FactsError("num_experts_per_tok: missing for a mixture-of-experts model")
    return experts, active


def parameters(config: Mapping[str, Any], layers: int, heads: int, kv_heads: int,
               hidden: int, head_dim: int) -> tuple:
    """(total, active per token) parameters from the config's shapes: attention, MLP or
    experts (shared ones included), embeddings; norms and biases left out."""
    attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    inter = config.get("intermediate_size")
    if not isinstance(inter, int):
        raise FactsError("intermediate_size: missing")
    experts, active = _experts(config)
    vocab = config.get("vocab_size", 0) if isinstance(config.get("vocab_size"), int) else 0
    embed = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    if not experts:
        total = layers * (attn + 3 * hidden * inter) + embed
        return float(total), float(total)
    size = config.get("moe_intermediate_size") or inter
    if not isinstance(size, int):
        raise FactsError("moe_intermediate_size: expected a whole number")
    dense = config.get("first_k_dense_replace", 0)
    dense = dense if isinstance(dense, int) else 0
    shared = config.get("n_shared_experts", 0)
    shared = shared if isinstance(shared, int) else 0
    expert = 3 * hidden * size
    moe = layers - dense
    common = layers * attn + dense * 3 * hidden * inter + moe * shared * expert + embed
    return (float(common + moe * experts * expert),
            float(common + moe * active * expert))


def facts_from_config(config: Mapping[str, Any], weight_bytes: int, name: str) -> ModelFacts:
    """The layout facts of a checkpoint (FactsError naming the config key it lacks)."""
    config = _text_config(config)
    if weight_bytes <= 0:
        raise FactsError("weights: no weight bytes (no safetensors index or files)")
    layers = _int(config, "num_hidden_layers")
    heads = _int(config, "num_attention_heads")
    hidden = _int(config, "hidden_size")
    kv_heads = _int(config, "num_key_value_heads", heads)
    if not layers or not heads or not kv_heads or not hidden:
        raise FactsError("num_hidden_layers: layers, heads and hidden size must be > 0")
    head_dim = config.get("head_dim") or hidden // heads
    if not isinstance(head_dim, int):
        raise FactsError("head_dim: expected a whole number")
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    params, active = parameters(config, layers, heads, kv_heads, hidden, head_dim)
    mla = isinstance(config.get("kv_lora_rank"), int)
    return ModelFacts(name=name, weight_bytes=weight_bytes, layers=layers, heads=heads,
                      kv_heads=1 if mla else kv_heads,
                      kv_bytes_per_token=_kv_bytes(config, layers, heads, kv_heads, head_dim),
                      params=params, active_params=active, dtype=dtype,
                      quantization=_quantization(config), experts=_experts(config)[0])


# llama.cpp's ``general.file_type`` (enum llama_ftype) -> a name for the plan's line
GGUF_FILE_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 7: "q8_0", 8: "q5_0",
                   9: "q5_1", 10: "q2_k", 11: "q3_k_s", 12: "q3_k_m", 13: "q3_k_l",
                   14: "q4_k_s", 15: "q4_k_m", 16: "q5_k_s", 17: "q5_k_m", 18: "q6_k",
                   19: "iq2_xxs", 20: "iq2_xs", 24: "iq1_s", 25: "iq4_nl", 26: "iq3_s",
                   28: "iq4_xs", 32: "bf16", 36: "tq1_0", 37: "tq2_0", 38: "mxfp4"}


def _gguf_int(metadata: Mapping[str, Any], key: str, default: Optional[int] = None) -> int:
    value = metadata.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        if value is None:
            raise FactsError(f"{key}: missing from the GGUF header")
        raise FactsError(f"{key}: expected a whole number > 0 in the GGUF header")
    return value


def gguf_facts(size: int, name: str, metadata: Mapping[str, Any]) -> ModelFacts:
    """A GGUF file for llama.cpp: its size (the weights) and its header's metadata
    (``general.architecture``, ``<arch>.block_count``, ``<arch>.attention.head_count``,
    ``<arch>.attention.head_count_kv``, ``<arch>.embedding_length``,
    ``<arch>.attention.key_length``/``value_length``, ``<arch>.context_length``,
    ``general.file_type``); FactsError naming the key it lacks. The KV cache per token is
    llama.cpp's default f16 cache: (key + value length) x KV heads x layers x 2 bytes."""
    if size <= 0:
        raise FactsError("model: empty GGUF file")
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise FactsError("general.architecture: missing from the GGUF header")
    layers = _gguf_int(metadata, f"{arch}.block_count")
    heads = _gguf_int(metadata, f"{arch}.attention.head_count")
    kv_heads = _gguf_int(metadata, f"{arch}.attention.head_count_kv", heads)
    hidden = _gguf_int(metadata, f"{arch}.embedding_length")
    key = _gguf_int(metadata, f"{arch}.attention.key_length", max(1, hidden // heads))
    value = _gguf_int(metadata, f"{arch}.attention.value_length", key)
    context = metadata.get(f"{arch}.context_length")
    kind = metadata.get("general.file_type")
    quant = GGUF_FILE_TYPES.get(kind, f"type {kind}") if isinstance(kind, int) else "gguf"
    return ModelFacts(name=name, weight_bytes=size, layers=layers, heads=heads,
                      kv_heads=kv_heads,
                      kv_bytes_per_token=layers * kv_heads * (key + value) * KV_CACHE_BYTES,
                      params=float(size), active_params=float(size), dtype="gguf",
                      quantization=f"gguf {quant}",
                      context=context if isinstance(context, int) and context > 0 else None)
