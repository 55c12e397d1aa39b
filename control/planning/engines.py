"""Engine argv rendering: each engine builds its own server command line (pure).

The agent fills ``{host}`` and ``{port}`` on the node; everything else is resolved here.
Which engines exist and which of their flags synthbatch owns are authored-input rules
(``control/config/engines.py``).
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

from control.config.engines import RENDERED

DEFAULT_EXECUTABLE: Dict[str, str] = {
    "vllm": "vllm",
    "sglang": "python3",
    "llamacpp": "llama-server",
}


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
