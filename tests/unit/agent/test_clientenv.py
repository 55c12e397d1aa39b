"""The client contract (``agent_stdlib/clientenv.py``): one home for its variables."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Set

import pytest

from synthbatch.agent_stdlib import clientenv
from synthbatch.agent_stdlib.clientenv import ClientEnv, ClientEnvError
from tests.conftest import REPO


def test_what_the_agent_writes_the_clients_read_back() -> None:
    written = ClientEnv(endpoints={"gen": "http://127.0.0.1:4000"},
                        deployments={"gen": {"base_url": "http://127.0.0.1:4000/v1",
                                             "model": "m"}},
                        shard_index=3, shard_count=8, record_offset=300, num_records=100,
                        output_dir="/r/out", progress_file="/r/p.json", resume_dir="/r/old")
    env = written.to_environ()
    assert ClientEnv.from_environ(env) == written
    assert env[clientenv.OPENAI_BASE_URL] == "http://127.0.0.1:4000/v1"
    assert env[clientenv.MODEL] == "m"


def test_unset_variables_read_as_their_one_default() -> None:
    read = ClientEnv.from_environ({clientenv.ENDPOINTS: "{}"})
    assert read.record_offset == 0  # the preview's contract: no offset given
    assert (read.num_records, read.output_dir, read.resume_dir, read.api_key) == (None,) * 4
    with pytest.raises(ClientEnvError, match="^SYNTHBATCH_NUM_RECORDS: not set"):
        read.shard_output()


def test_a_preview_contract_has_no_shard_variables() -> None:
    env = ClientEnv(endpoints={"gen": "http://127.0.0.1:1"}, api_key="k").to_environ()
    assert set(env) == {clientenv.ENDPOINTS, clientenv.RECORD_OFFSET, clientenv.API_KEY}


@pytest.mark.parametrize(("name", "raw", "message"), [
    (clientenv.RECORD_OFFSET, "ten", "SYNTHBATCH_RECORD_OFFSET: expected a whole number"),
    (clientenv.NUM_RECORDS, "-1", "SYNTHBATCH_NUM_RECORDS: must be >= 0"),
    (clientenv.ENDPOINTS, "{", "SYNTHBATCH_ENDPOINTS: not JSON"),
    (clientenv.DEPLOYMENTS, "[]", "SYNTHBATCH_DEPLOYMENTS: expected a JSON object"),
])
def test_a_malformed_variable_is_named(name: str, raw: str, message: str) -> None:
    with pytest.raises(ClientEnvError, match=f"^{re.escape(message)}"):
        ClientEnv.from_environ({name: raw})


def test_no_other_module_spells_the_contract_variables() -> None:
    names = [v for k, v in vars(clientenv).items()
             if k.isupper() and isinstance(v, str) and v.startswith("SYNTHBATCH_")]
    assert len(names) == 12
    pattern = re.compile("[\"'](" + "|".join(names) + ")[\"']")
    home = Path(clientenv.__file__).resolve()
    spelled = [f"{path.relative_to(REPO)}:{n + 1}"
               for root in ("agent_stdlib", "control")
               for path in sorted((REPO / root).rglob("*.py")) if path.resolve() != home
               for n, line in enumerate(path.read_text(encoding="utf-8").splitlines())
               if pattern.search(line)]
    assert spelled == []


# A variable's name as code spells it: not after ``$`` (prose: "default: $SYNTHBATCH_X").
ENV_NAME = re.compile(r"(?<![$\w])SYNTHBATCH_[A-Z0-9_]+\b")


def spelled_names(tree: ast.AST) -> List[str]:
    """The ``SYNTHBATCH_*`` names in a module's strings (f-strings too), docstrings aside."""
    docs = {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return [name for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docs for name in ENV_NAME.findall(node.value)]


def test_every_synthbatch_variable_is_spelled_in_one_module() -> None:
    """Issue 29: the writer and every reader of a variable (the agent, the control plane,
    the benchmarks) use its one constant; a second spelling is how two of them drift."""
    homes: Dict[str, Set[str]] = {}
    for root in ("agent_stdlib", "control", "benchmarks"):
        for path in sorted((REPO / root).rglob("*.py")):
            for name in spelled_names(ast.parse(path.read_text(encoding="utf-8"))):
                homes.setdefault(name, set()).add(path.relative_to(REPO).as_posix())
    assert {name: sorted(where) for name, where in homes.items() if len(where) > 1} == {}


def test_the_variable_scan_sees_code_not_prose() -> None:
    tree = ast.parse('"""Reads SYNTHBATCH_A."""\nx = "SYNTHBATCH_B"\n'
                     'y = f"export SYNTHBATCH_C={n}"\nh = "default: $SYNTHBATCH_D"\n')
    assert spelled_names(tree) == ["SYNTHBATCH_B", "SYNTHBATCH_C"]
