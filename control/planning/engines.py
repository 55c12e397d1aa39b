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
                executable: Optional[str] = None,
                python: Optional[str] = None) -> Tuple[str, ...]:
    """The server argv of a rendered engine, ``{host}``/``{port}`` left for the agent.

    With ``python`` (a serving environment's interpreter) the engine starts through it:
    vLLM's OpenAI server module, SGLang's launcher, or the agent's xllamacpp launcher
    (``{agent}`` is the staged agent bundle, filled in on the node).
    """
    if engine not in RENDERED:
        raise ValueError(f"engine {engine!r} does not render its own argv")
    where = ("--host", "{host}", "--port", "{port}")
    if python:
        return _python_argv(engine, python, model, served_name, tensor_parallel,
                            pipeline_parallel, where) + tuple(extra_args)
    exe = executable or DEFAULT_EXECUTABLE[engine]
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


def _python_argv(engine: str, python: str, model: str, served_name: str, tp: int, pp: int,
                 where: Tuple[str, ...]) -> Tuple[str, ...]:
    parallel = ("--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp))
    if engine == "vllm":
        return (python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, *where,
                "--served-model-name", served_name, *parallel)
    if engine == "sglang":
        return (python, "-m", "sglang.launch_server", "--model-path", model, *where,
                "--served-model-name", served_name, "--tp-size", str(tp), "--pp-size", str(pp))
    return (python, "-I", "{agent}", "serve-llamacpp", "-m", model, *where, "-a", served_name,
            "--metrics")
