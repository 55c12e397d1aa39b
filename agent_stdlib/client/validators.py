"""Validation columns (``type = "validation"``): a check of another column's value whose
result is a value, ``{"valid": bool, "errors": ["..."]}``, that templates
(``{check.valid}``) and ``on_invalid`` use.

* ``python``: the text parses (:func:`ast.parse`); with ``run = true`` it also runs to the
  end, exit status 0, within ``timeout_s`` in a child process (see :func:`run_python`);
* ``sql``: every statement compiles in SQLite (``EXPLAIN`` against an in-memory database,
  after the ``sql_schema`` text or the ``schema_column``'s value is run there);
* ``json_schema``: the value (or the JSON its text holds) is valid against ``schema``
  (:mod:`agent_stdlib.recipe.schema`, the same subset structured columns use);
* ``regex``: the text matches ``pattern`` (searched; the whole text with ``full = true``).
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Mapping

from ..recipe.kinds import VALIDATION, default
from ..recipe.schema import validate
from ..recipe.template import show
from .pyguard import GUARD

MAX_ERRORS, ERROR_CHARS = 5, 300


def result(errors: List[str]) -> Dict[str, Any]:
    """The column's value: valid when there is no error (a few, each cut short)."""
    return {"valid": not errors, "errors": [e[:ERROR_CHARS] for e in errors[:MAX_ERRORS]]}


def check_python(code: str, run: bool = False, timeout_s: float = 5.0) -> List[str]:
    """Parse errors of ``code``; with ``run``, also why running it did not succeed."""
    try:
        ast.parse(code)
    except (SyntaxError, ValueError) as err:
        line = getattr(err, "lineno", None)
        return [f"line {line}: {err.msg}" if line and isinstance(err, SyntaxError)
                else f"does not parse: {err}"]
    return run_python(code, timeout_s) if run else []


def run_python(code: str, timeout_s: float) -> List[str]:
    """Run ``code`` as ``main.py`` under :data:`pyguard.GUARD` (``python -I -S``: no network,
    no new process, no ctypes) in a fresh scratch folder (its working folder, deleted
    after) with an empty environment, no stdin, in a session of its own that is killed
    whole after ``timeout_s``. This isolates it from the generator's files, variables,
    site-packages and the network; it does NOT limit memory or hide the file system: run
    only code you would run yourself, on a node where that is acceptable."""
    with tempfile.TemporaryDirectory(prefix="synthbatch-validate-") as scratch:
        path = os.path.join(scratch, "main.py")
        with open(path, "w", encoding="utf-8") as out:
            out.write(code)
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", GUARD], cwd=scratch,
                                env={}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return [f"did not finish within {timeout_s:g} s"]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if proc.returncode != 0:
        lines = err.decode("utf-8", "replace").strip().splitlines()
        return [f"exit status {proc.returncode}" + (f": {lines[-1]}" if lines else "")]
    return []


def _statements(sql: str) -> List[str]:
    """``sql`` split into complete statements (SQLite's own idea of complete)."""
    out, current = [], ""
    for piece in sql.split(";"):
        current += piece + ";"
        if sqlite3.complete_statement(current):
            if current.strip(" \t\r\n;"):
                out.append(current.strip())
            current = ""
    if current.strip(" \t\r\n;"):
        out.append(current.strip().rstrip(";"))
    return out


def _no_attach(action: int, *_: Any) -> int:
    """SQLite authorizer: nothing may attach (and so create) a database file."""
    return sqlite3.SQLITE_DENY if action == sqlite3.SQLITE_ATTACH else sqlite3.SQLITE_OK


def check_sql(sql: str, schema: str = "") -> List[str]:
    """Why a statement of ``sql`` does not compile against ``schema`` in SQLite."""
    db = sqlite3.connect(":memory:")
    try:
        db.set_authorizer(_no_attach)
        if schema:
            try:
                db.executescript(schema)
            except sqlite3.Error as err:
                return [f"the schema does not run: {err}"]
        statements = _statements(sql)
        if not statements:
            return ["no SQL statement"]
        for i, statement in enumerate(statements):
            try:
                db.execute("EXPLAIN " + statement)
            except (sqlite3.Error, sqlite3.Warning) as err:
                return [f"statement {i + 1}: {err}"]
        return []
    finally:
        db.close()


def check_json(value: Any, schema: Dict[str, Any]) -> List[str]:
    """Why ``value`` (or the JSON a text value holds) is not valid against ``schema``."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as err:
            return [f"not JSON: {err}"]
    problem = validate(value, schema)
    return [problem] if problem else []


def check_regex(text: str, pattern: str, full: bool = False) -> List[str]:
    """Why ``text`` does not match ``pattern``."""
    found = re.fullmatch(pattern, text, re.S) if full else re.search(pattern, text)
    return [] if found else [f"does not match {pattern!r}"]


def check(params: Mapping[str, Any], values: Mapping[str, Any]) -> Dict[str, Any]:
    """The validation column's value for a record's ``values`` so far."""
    value = values.get(str(params["target"]))
    kind = params["validator"]
    if value is None:
        return result([f"{params['target']} is null"])
    if kind == "json_schema":
        return result(check_json(value, dict(params["schema"])))
    text = show(value)
    if kind == "python":
        timeout = float(params.get("timeout_s", default(VALIDATION, "timeout_s")))
        return result(check_python(text, bool(params.get("run")), timeout))
    if kind == "sql":
        schema = params.get("sql_schema") or ""
        if params.get("schema_column"):
            schema = show(values.get(str(params["schema_column"])))
        return result(check_sql(text, schema))
    return result(check_regex(text, str(params["pattern"]), bool(params.get("full"))))
