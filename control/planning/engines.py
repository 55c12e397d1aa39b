"""Engine argv rendering: each engine builds its own server command line (pure).

The agent fills ``{host}`` and ``{port}`` on the node; everything else is resolved here.
Flags the runtime owns (host, port, model, served name, parallel sizes, API keys) must
not appear in a deployment's ``extra_args``: ``reserved_flag`` names the offending one.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

ENGINES = ("vllm", "sglang", "llamacpp", "openai")
# Engines whose argv synthbatch renders (``openai`` runs the user's own command).
RENDERED = ("vllm", "sglang", "llamacpp")
PARALLEL = ("vllm", "sglang")

DEFAULT_EXECUTABLE: Dict[str, str] = {
    "vllm": "vllm",
    "sglang": "python3",
    "llamacpp": "llama-server",
}

_COMMON = ("--host", "--port", "--api-key", "--api-key-file")
RESERVED: Dict[str, Tuple[str, ...]] = {
    "vllm": _COMMON + ("--model", "--served-model-name", "--tensor-parallel-size", "-tp",
                       "--pipeline-parallel-size", "-pp", "--data-parallel-size", "-dp",
                       "--uds"),
    "sglang": _COMMON + ("--model-path", "--model", "--served-model-name", "--tp-size",
                         "--tp", "--tensor-parallel-size", "--pp-size",
                         "--pipeline-parallel-size", "--dp-size", "--dp",
                         "--data-parallel-size"),
    "llamacpp": _COMMON + ("-m", "--model", "-a", "--alias", "-hf", "-hfr", "--hf-repo",
                           "-mu", "--model-url"),
    "openai": ("--api-key", "--api-key-file"),
}


def reserved_flag(engine: str, arg: str) -> Optional[str]:
    """The runtime-owned flag ``arg`` sets (``--port``, ``--port=1``, ``-tp``), or None."""
    for flag in RESERVED[engine]:
        if arg == flag or arg.startswith(flag + "="):
            return flag
    return None


def check_extra_args(engine: str, args: Sequence[str]) -> None:
    """ValueError naming the first runtime-owned flag in ``args`` (index and flag only)."""
    for index, arg in enumerate(args):
        flag = reserved_flag(engine, arg)
        if flag:
            raise ValueError(f"[{index}]: {flag} is set by synthbatch for engine {engine!r}; "
                             f"remove it from extra_args")


def engine_argv(engine: str, *, model: str, served_name: str, tensor_parallel: int = 1,
                pipeline_parallel: int = 1, extra_args: Sequence[str] = (),
                executable: Optional[str] = None) -> Tuple[str, ...]:
    """The server argv of a rendered engine, ``{host}``/``{port}`` left for the agent."""
    if engine not in RENDERED:
        raise ValueError(f"engine {engine!r} does not render its own argv")
    exe = executable or DEFAULT_EXECUTABLE[engine]
    where = ("--host", "{host}", "--port", "{port}")
    if engine == "vllm":
        argv = [exe, "serve", model, *where, "--served-model-name", served_name,
                "--tensor-parallel-size", str(tensor_parallel),
                "--pipeline-parallel-size", str(pipeline_parallel)]
    elif engine == "sglang":
        argv = [exe, "-m", "sglang.launch_server", "--model-path", model, *where,
                "--served-model-name", served_name, "--tp-size", str(tensor_parallel),
                "--pp-size", str(pipeline_parallel)]
    else:
        argv = [exe, "-m", model, *where, "-a", served_name, "--metrics"]
    return tuple(argv + list(extra_args))
