"""The vLLM multi-node command lines synthbatch renders parse with the installed vLLM.

Each rank's argv of the ``ranks-vllm-*`` goldens (``tests/unit/agent/allocation/
test_ranks.py``) goes through vLLM's own ``serve`` parser in the vLLM serving environment
(vLLM 0.32 CPU, ``scripts/serving-env vllm``): every flag must exist and mean what the
ranks need. Marked slow: importing vLLM takes ~30 s on the 2-core test machine.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import GOLDENS
from tests.integration.runs import serving_env

pytestmark = pytest.mark.slow
KEYS = ("host", "port", "tensor_parallel_size", "pipeline_parallel_size",
        "distributed_executor_backend", "nnodes", "node_rank", "master_addr", "master_port",
        "distributed_timeout_seconds", "headless")
PARSE = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser())
for argv in json.loads(sys.stdin.read()):
    args = parser.parse_args(argv)
    print(json.dumps({k: getattr(args, k) for k in KEYS} | {"model": args.model_tag}))
"""


def serve_args(argv: list) -> list:
    """The arguments after ``serve`` (``vllm serve`` or ``python -m <cli> serve``)."""
    return argv[argv.index("serve") + 1:]


def test_every_rank_s_vllm_argv_parses_with_vllm_itself() -> None:
    python = serving_env("vllm") / "venv" / "bin" / "python"
    cases = []
    for golden in sorted(GOLDENS.glob("ranks-vllm-*.json")):
        rendered = json.loads(golden.read_text())
        for rank, argv in enumerate(rendered["ranks"]):
            cases.append((golden.name, rank, argv))
    assert len(cases) >= 6
    done = subprocess.run([str(python), "-c", PARSE.replace("KEYS", repr(KEYS))],
                          input=json.dumps([serve_args(argv) for _, _, argv in cases]),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(parsed) == len(cases), done.stdout
    for (name, rank, argv), args in zip(cases, parsed):
        where = f"{name} rank {rank}: {args}"
        assert args["model"] == "/models/llama-405b", where
        assert args["distributed_executor_backend"] == "mp", where
        assert (args["nnodes"], args["node_rank"]) == (2, rank), where
        assert args["headless"] is (rank > 0), where
        assert args["master_addr"] == "10.0.0.1", where
        assert args["master_port"] == int(argv[argv.index("--master-port") + 1]), where
        assert args["distributed_timeout_seconds"] == 1200, where
        assert args["host"] == ("127.0.0.1", "10.0.0.2")[rank], where
        world = args["tensor_parallel_size"] * args["pipeline_parallel_size"]
        assert world % args["nnodes"] == 0 and world >= 2, where
