"""The llm-code column's extraction and the validation columns' checks."""

from __future__ import annotations

from typing import Any, Dict

import pytest

from synthbatch.agent_stdlib.client.codeblock import extract
from synthbatch.agent_stdlib.client.llm import InvalidOutput, parse_answer
from synthbatch.agent_stdlib.client.validators import (
    check,
    check_python,
    check_regex,
    check_sql,
)

ANSWER = "Here:\n```sql\nSELECT 1;\n```\nand\n```python\nprint('hi')\n```\n"


def answer(text: str) -> Dict[str, Any]:
    return {"model": "m", "choices": [{"message": {"content": text},
                                       "finish_reason": "stop"}], "usage": {}}


def test_code_is_the_declared_languages_block_else_the_first_else_the_text() -> None:
    assert extract(ANSWER, "python") == ("print('hi')", "python", True)
    assert extract(ANSWER, "py") == ("print('hi')", "python", True)
    assert extract(ANSWER, "rust") == ("SELECT 1;", "sql", True)
    assert extract(ANSWER) == ("SELECT 1;", "sql", True)
    assert extract("```\nx = 1\n```") == ("x = 1", None, True)
    assert extract("  x = 1\n") == ("x = 1", None, False)


def test_an_llm_code_answer_records_its_language_and_may_require_a_block() -> None:
    value, meta = parse_answer("llm-code", {"language": "python"}, answer(ANSWER))
    assert (value, meta["language"]) == ("print('hi')", "python")
    assert parse_answer("llm-code", {}, answer("x = 1"))[0] == "x = 1"
    with pytest.raises(InvalidOutput, match="no fenced code block"):
        parse_answer("llm-code", {"require_block": True}, answer("x = 1"))


def test_python_parses_and_optionally_runs_isolated(tmp_path: Any) -> None:
    assert check_python("x = 1\n") == []
    problem = check_python("def f(:\n")
    assert len(problem) == 1 and problem[0].startswith("line 1: ")
    # an empty environment (Python's own locale coercion may add LC_CTYPE), no site
    assert check_python("import os, sys\nassert set(os.environ) <= {'LC_CTYPE'}\n"
                        "assert 'site' not in sys.modules\n", run=True) == []
    failed = check_python("raise SystemExit('boom')", run=True)
    assert failed == ["exit status 1: boom"]
    assert check_python("import time\ntime.sleep(30)", run=True, timeout_s=0.5) == \
        ["did not finish within 0.5 s"]
    marker = tmp_path / "written"
    assert check_python(f"open('{marker.name}', 'w').write('x')", run=True) == []
    assert not marker.exists()  # it ran in a scratch folder of its own


def test_sql_compiles_against_a_schema_without_touching_files(tmp_path: Any) -> None:
    schema = "CREATE TABLE t (a INTEGER, b TEXT);"
    assert check_sql("SELECT a FROM t WHERE b = 'x'; SELECT count(*) FROM t;", schema) == []
    assert check_sql("SELECT c FROM t", schema)[0].startswith("statement 1: no such column")
    assert check_sql("SELEC 1")[0].startswith("statement 1: near \"SELEC\"")
    assert check_sql("  ;  ") == ["no SQL statement"]
    attach = f"ATTACH DATABASE '{tmp_path / 'x.db'}' AS x;"
    assert check_sql("SELECT 1", attach)[0].startswith("the schema does not run")
    assert not (tmp_path / "x.db").exists()


def test_json_schema_and_regex_results() -> None:
    params = {"validator": "json_schema", "target": "doc",
              "schema": {"type": "object", "required": ["a"]}}
    assert check(params, {"doc": '{"a": 1}'}) == {"valid": True, "errors": []}
    assert check(params, {"doc": {"b": 1}}) == {
        "valid": False, "errors": ["$: missing required property 'a'"]}
    assert check(params, {"doc": "{"})["errors"][0].startswith("not JSON")
    assert check(params, {"doc": None}) == {"valid": False, "errors": ["doc is null"]}
    assert check_regex("abc-123", r"\d+") == []
    assert check_regex("abc-123", r"\d+", full=True) == ["does not match '\\\\d+'"]
    sql = {"validator": "sql", "target": "q", "schema_column": "ddl"}
    assert check(sql, {"q": "SELECT a FROM t", "ddl": "CREATE TABLE t (a);"})["valid"]


def test_python_run_has_no_network_and_starts_no_process(tmp_path: Any) -> None:
    """A listener on loopback: the code's connection never reaches it (own network
    namespace, and the audit hook refuses the socket); nor may it start a process that
    would (curl, another python) or reach libc's connect through ctypes."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listener.settimeout(0.2)
        port = listener.getsockname()[1]
        connect = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 2)\n"
        problem = check_python(connect, run=True)
        assert len(problem) == 1 and "may not use the network" in problem[0], problem
        spawn = ("import subprocess, sys\nsubprocess.run([sys.executable, '-c', "
                 f"{connect!r}], check=True)\n")
        problem = check_python(spawn, run=True)
        assert len(problem) == 1 and "(subprocess.Popen)" in problem[0], problem
        problem = check_python("import os\nos.system('true')\n", run=True)
        assert len(problem) == 1 and "(os.system)" in problem[0], problem
        problem = check_python("import ctypes\nctypes.CDLL(None)\n", run=True)
        assert len(problem) == 1 and "(ctypes.dlopen)" in problem[0], problem
        with pytest.raises(socket.timeout):
            listener.accept()  # nothing ever connected
    assert check_python("import json, math\nprint(json.dumps(math.pi))\n", run=True) == []


def test_python_run_is_in_a_network_namespace_of_its_own_where_the_kernel_allows() -> None:
    """Where this user may unshare a network namespace, the code sees only its own
    loopback (/proc/net/dev lists 'lo' alone), not the node's interfaces."""
    import os
    import subprocess
    import sys

    probe = subprocess.run([sys.executable, "-c", (
        "import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "sys.exit(0 if libc.unshare(0x40000000) == 0 or "
        "libc.unshare(0x40000000 | 0x10000000) == 0 else 3)")], check=False)
    if probe.returncode != 0 or not os.path.exists("/proc/net/dev"):
        pytest.skip("this kernel gives no network namespace to this user")
    code = ("names = [line.split(':')[0].strip() for line in "
            "open('/proc/net/dev').read().splitlines()[2:]]\n"
            "assert names == ['lo'], names\n")
    assert check_python(code, run=True) == []
