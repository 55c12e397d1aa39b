"""Engine argv rendering: each engine builds its own server command line (pure).

The agent fills ``{host}`` and ``{port}`` on the node; everything else is resolved here.
Which engines exist and which of their flags synthbatch owns are authored-input rules
(``control/config/engines.py``).

A replica of several nodes runs the same argv on each of its nodes, one rank per node
(``docs/runtime.md``, "Replicas across nodes"): the argv names the rank ``{node_rank}``,
the leader's address ``{leader_host}`` and its rendezvous port ``{dist_port}``, which the
agent and the ``serve`` role fill in per rank; ranks > 0 append :func:`follower_args`.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

from synthbatch.control.config.engines import RENDERED

DEFAULT_EXECUTABLE: Dict[str, str] = {
    "vllm": "vllm",
    "sglang": "python3",
    "llamacpp": "llama-server",
}
# vLLM's CLI module: `python -m vllm.entrypoints.openai.api_server` parses --headless but
# always starts an API server (vLLM 0.32: entry.main never looks at it), so the ranks of
# a replica across nodes start through `vllm serve`'s own entry point.
VLLM_CLI = "vllm.entrypoints.cli.main"


def rank_args(engine: str, nodes: int, timeout_s: float) -> Tuple[str, ...]:
    """The flags that make one rank of a replica across ``nodes`` nodes (every rank's)."""
    seconds = str(max(1, math.ceil(timeout_s)))
    if engine == "vllm":
        # On one node vLLM picks its executor right by itself (uni for one GPU, mp for
        # more: vllm/config/parallel.py); across nodes only mp runs headless followers,
        # and its default there is mp on CUDA only (elsewhere it raises "World size ... is
        # larger than the number of available GPUs"). Every replica across nodes has TP x
        # PP >= 2 (TP 1 x PP 2 too: its pipeline group is two workers), so: mp.
        return ("--distributed-executor-backend", "mp", "--nnodes", str(nodes),
                "--node-rank", "{node_rank}",
                "--master-addr", "{leader_host}", "--master-port", "{dist_port}",
                "--distributed-timeout-seconds", seconds)
    if engine == "sglang":
        return ("--nnodes", str(nodes), "--node-rank", "{node_rank}",
                "--dist-init-addr", "{leader_host}:{dist_port}", "--dist-timeout", seconds)
    raise ValueError(f"engine {engine!r} does not run a replica across nodes")


def follower_args(engine: str, nodes: int) -> Tuple[str, ...]:
    """What ranks > 0 append: vLLM's followers run without an API server (``--headless``);
    SGLang's know their role from ``--node-rank``."""
    return ("--headless",) if engine == "vllm" and nodes > 1 else ()


def engine_argv(engine: str, *, model: str, served_name: str, tensor_parallel: int = 1,
                pipeline_parallel: int = 1, extra_args: Sequence[str] = (),
                executable: Optional[str] = None, python: Optional[str] = None,
                nodes: int = 1, dist_timeout_s: float = 600.0) -> Tuple[str, ...]:
    """The server argv of a rendered engine, ``{host}``/``{port}`` left for the agent.

    With ``python`` (a serving environment's interpreter) the engine starts through it:
    vLLM's OpenAI server module (its CLI module for a replica across nodes), SGLang's
    launcher, or the agent's xllamacpp launcher (``{agent}`` is the staged agent bundle,
    filled in on the node). ``nodes`` > 1 adds :func:`rank_args` with the distributed-init
    timeout ``dist_timeout_s``.
    """
    if engine not in RENDERED:
        raise ValueError(f"engine {engine!r} does not render its own argv")
    where = ("--host", "{host}", "--port", "{port}")
    ranks = rank_args(engine, nodes, dist_timeout_s) if nodes > 1 else ()
    if python:
        argv = list(_python_argv(engine, python, model, served_name, tensor_parallel,
                                 pipeline_parallel, where, nodes))
    else:
        argv = _exe_argv(engine, executable or DEFAULT_EXECUTABLE[engine], model, served_name,
                         tensor_parallel, pipeline_parallel, where)
    return tuple(argv) + ranks + tuple(extra_args)


def _exe_argv(engine: str, exe: str, model: str, served_name: str, tp: int, pp: int,
              where: Tuple[str, ...]) -> List[str]:
    if engine == "vllm":
        return [exe, "serve", model, *where, "--served-model-name", served_name,
                "--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp)]
    if engine == "sglang":
        return [exe, "-m", "sglang.launch_server", "--model-path", model, *where,
                "--served-model-name", served_name, "--tp-size", str(tp), "--pp-size", str(pp)]
    return [exe, "-m", model, *where, "-a", served_name, "--metrics"]


def _python_argv(engine: str, python: str, model: str, served_name: str, tp: int, pp: int,
                 where: Tuple[str, ...], nodes: int) -> Tuple[str, ...]:
    parallel = ("--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp))
    if engine == "vllm" and nodes > 1:
        return (python, "-m", VLLM_CLI, "serve", model, *where, "--served-model-name",
                served_name, *parallel)
    if engine == "vllm":
        return (python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, *where,
                "--served-model-name", served_name, *parallel)
    if engine == "sglang":
        return (python, "-m", "sglang.launch_server", "--model-path", model, *where,
                "--served-model-name", served_name, "--tp-size", str(tp), "--pp-size", str(pp))
    return (python, "-I", "{agent}", "serve-llamacpp", "-m", model, *where, "-a", served_name,
            "--metrics")
