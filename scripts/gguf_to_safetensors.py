"""Convert a GGUF checkpoint into a safetensors model directory that vLLM can load.

Usage: python gguf_to_safetensors.py MODEL.gguf OUT_DIR   (runs in the vLLM serving venv,
which has torch, transformers, gguf and accelerate). vLLM 0.32 has no GGUF loader; this
dequantises once, writes bf16 weights, config (with ``architectures``), generation config
and tokenizer into OUT_DIR.tmp and renames it to OUT_DIR when complete.
"""

from __future__ import annotations

import pathlib
import sys


def convert(gguf: pathlib.Path, out: pathlib.Path) -> int:
    """Dequantise ``gguf`` into ``out``; return the number of tensors written."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    config.dtype = "bfloat16"
    state = {name: tensor.detach().to(torch.bfloat16).contiguous().clone()
             for name, tensor in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # vLLM ties it to embed_tokens itself
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(str(tmp))
    model.generation_config.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    tmp.rename(out)
    return len(state)


if __name__ == "__main__":
    count = convert(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]))
    print(f"converted {count} tensors into {sys.argv[2]}")
