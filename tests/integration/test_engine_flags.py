"""The multi-node command lines synthbatch renders parse with the engines themselves.

Each rank's argv of the ``ranks-vllm-*`` goldens (``tests/unit/agent/allocation/
test_ranks.py``) goes through vLLM's own ``serve`` parser in the vLLM serving environment
(vLLM 0.32 CPU, ``scripts/serving-env vllm``), each of the ``ranks-sglang-*`` goldens
through SGLang 0.5.23's ``prepare_server_args`` (what ``python -m sglang.launch_server``
calls; ``scripts/serving-env sglang``: the parser without SGLang's runtime): every flag
must exist and mean what the ranks need. Marked slow: importing vLLM takes ~30 s on the
2-core test machine, SGLang's server args ~10 s.
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


SGLANG_KEYS = ("host", "port", "tp_size", "pp_size", "nnodes", "node_rank", "dist_init_addr",
               "dist_timeout", "model_path", "served_model_name")
SGLANG_PARSE = """
import json, sys
from sglang.srt.server_args import prepare_server_args
from sglang.srt.utils.network import NetworkAddress
for argv in json.loads(sys.stdin.read()):
    args = prepare_server_args(argv)
    leader = NetworkAddress.parse(args.dist_init_addr)
    print(json.dumps({k: getattr(args, k) for k in KEYS}
                     | {"leader": [leader.host, leader.port]}))
"""


def rank_cases(engine: str) -> list:
    """(golden, rank, argv) of every rank of the ``ranks-<engine>-*`` goldens."""
    cases = []
    for golden in sorted(GOLDENS.glob(f"ranks-{engine}-*.json")):
        rendered = json.loads(golden.read_text())
        for rank, argv in enumerate(rendered["ranks"]):
            cases.append((golden.name, rank, argv))
    return cases


def parsed_by(python: str, script: str, argvs: list) -> list:
    """``script`` run by ``python`` on ``argvs`` (JSON on stdin): one JSON line per argv."""
    done = subprocess.run([python, "-c", script], input=json.dumps(argvs),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(parsed) == len(argvs), done.stdout
    return parsed


def serve_args(argv: list) -> list:
    """The arguments after ``serve`` (``vllm serve`` or ``python -m <cli> serve``)."""
    return argv[argv.index("serve") + 1:]


def test_every_rank_s_vllm_argv_parses_with_vllm_itself() -> None:
    python = serving_env("vllm") / "venv" / "bin" / "python"
    cases = rank_cases("vllm")
    assert len(cases) >= 6
    parsed = parsed_by(str(python), PARSE.replace("KEYS", repr(KEYS)),
                       [serve_args(argv) for _, _, argv in cases])
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


def test_every_rank_s_sglang_argv_parses_with_sglang_itself() -> None:
    python = serving_env("sglang") / "venv" / "bin" / "python"
    cases = rank_cases("sglang")
    assert len(cases) >= 6
    launcher = ["-m", "sglang.launch_server"]
    for name, _, argv in cases:
        assert argv[1:3] == launcher, name
    parsed = parsed_by(str(python), SGLANG_PARSE.replace("KEYS", repr(SGLANG_KEYS)),
                       [argv[3:] for _, _, argv in cases])
    for (name, rank, argv), args in zip(cases, parsed):
        where = f"{name} rank {rank}: {args}"
        assert args["model_path"] == "/models/llama-405b", where
        assert args["served_model_name"] == "llama", where
        assert (args["nnodes"], args["node_rank"]) == (2, rank), where
        dist_port = int(argv[argv.index("--dist-init-addr") + 1].rsplit(":", 1)[1])
        assert args["leader"] == ["10.0.0.1", dist_port], where
        assert args["dist_timeout"] == 1200, where
        assert args["host"] == ("127.0.0.1", "10.0.0.2")[rank], where
        assert args["port"] == int(argv[argv.index("--port") + 1]), where
        world = args["tp_size"] * args["pp_size"]
        assert world % args["nnodes"] == 0 and world >= 2, where
