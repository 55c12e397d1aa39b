"""``python agent.pyz serve-llamacpp ...``: a llama.cpp server from the ``xllamacpp`` wheel.

``xllamacpp`` has no command line of its own. This launcher accepts the subset of
``llama-server`` flags the planner renders (so one argv shape serves both the binary and a
Python serving environment), starts the server in-process and waits for SIGTERM/SIGINT.
It runs under the serving environment's Python, where ``xllamacpp`` is installed; the
import happens only at start-up so the agent bundle stays standard-library only.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from typing import Any, List, Optional


def build_parser() -> argparse.ArgumentParser:
    """The ``llama-server``-compatible flags this launcher understands."""
    parser = argparse.ArgumentParser(prog="agent serve-llamacpp")
    parser.add_argument("-m", "--model", required=True, help="path of the GGUF file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("-a", "--alias", default=None, help="served model name")
    parser.add_argument("-t", "--threads", type=int, default=-1)
    parser.add_argument("-np", "--parallel", type=int, default=1, help="server slots")
    parser.add_argument("-c", "--ctx-size", type=int, default=2048)
    parser.add_argument("--metrics", action="store_true", help="serve /metrics")
    return parser


def make_params(xllamacpp: Any, args: argparse.Namespace) -> Any:
    """Translate parsed flags into ``xllamacpp.CommonParams``."""
    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = [args.host]
    params.port = args.port
    if args.alias:
        params.model_alias = {args.alias}
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx_size
    params.cpuparams.n_threads = args.threads
    params.endpoint_metrics = bool(args.metrics)
    return params


def main(argv: Optional[List[str]] = None) -> int:
    """Start the server and block until SIGTERM or SIGINT; return the exit status."""
    args = build_parser().parse_args(argv)
    try:
        # The engine belongs to the serving environment, not to the agent: it is looked up
        # by name at start-up, so the bundle itself stays standard-library only.
        xllamacpp = importlib.import_module("xllamacpp")
    except ImportError:
        print("serve-llamacpp: the xllamacpp package is not installed in this Python "
              f"({sys.executable})", file=sys.stderr)
        return 2
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    server = xllamacpp.Server(make_params(xllamacpp, args))
    print(f"serve-llamacpp: listening on {args.host}:{args.port} model={args.model}",
          file=sys.stderr, flush=True)
    received = signal.sigwait({signal.SIGTERM, signal.SIGINT})
    print(f"serve-llamacpp: {signal.Signals(received).name}, stopping", file=sys.stderr,
          flush=True)
    del server
    return 0
