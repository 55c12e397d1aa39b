"""Which engines exist and the flags of theirs that synthbatch owns (authored-input rules).

Flags the runtime owns (host, port, model, served name, parallel sizes, the executor and
the ranks of a replica across nodes, API keys) must not appear in a deployment's
``extra_args``: ``reserved_flag`` names the offending one. The
planner renders each engine's command line (``control/planning/engines.py``).
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

ENGINES = ("vllm", "sglang", "llamacpp", "openai")
# Engines whose argv synthbatch renders (``openai`` runs the user's own command).
RENDERED = ("vllm", "sglang", "llamacpp")
PARALLEL = ("vllm", "sglang")

_COMMON = ("--host", "--port", "--api-key", "--api-key-file")
RESERVED: Dict[str, Tuple[str, ...]] = {
    "vllm": _COMMON + ("--model", "--served-model-name", "--tensor-parallel-size", "-tp",
                       "--pipeline-parallel-size", "-pp", "--data-parallel-size", "-dp",
                       "--uds", "--distributed-executor-backend", "--nnodes", "-n",
                       "--node-rank", "-r", "--master-addr", "--master-port", "--headless",
                       "--distributed-timeout-seconds"),
    "sglang": _COMMON + ("--model-path", "--model", "--served-model-name", "--tp-size",
                         "--tp", "--tensor-parallel-size", "--pp-size",
                         "--pipeline-parallel-size", "--dp-size", "--dp",
                         "--data-parallel-size", "--nnodes", "--node-rank", "--dist-init-addr",
                         "--nccl-init-addr", "--dist-timeout"),
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
