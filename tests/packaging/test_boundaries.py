"""The layout's rules, read from the code's own imports (every import, at any depth).

* ``agent_stdlib`` imports nothing but itself and the standard library, except the Data
  Designer adapter (``agent_stdlib/client/data_designer.py``), which may import
  ``data_designer`` (and reach pandas and pyarrow through its ``lazy_heavy_imports``) inside
  its functions only: it runs under the client environment's Python, never at import time;
* the control plane imports only the shared top-level modules of ``agent_stdlib``, never
  the allocation, proxy, client or engine roles;
* no module imports one above its layer (control: errors/secrets/bundle < config < images <
  planning, slurm < backends < runs < api < cli; planning and slurm never import each other; the
  agent's shared modules never import its roles, the roles never import each other; the
  proxy's modules run config/http/loop < route < exchange < client/upstream < core < main);
* ``control/cli`` imports nothing of ``control`` but ``api``, ``readapi`` (what the
  read-only commands use), ``errors`` and itself;
* ``control/planning`` does no I/O: no file, process, socket, clock or randomness calls;
* there is no import cycle anywhere.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

from tests.conftest import REPO

# The one agent module that runs under the client environment's Python, and what it may
# import there (inside functions only).
CLIENT_ENV_MODULE = "agent_stdlib.client.data_designer"
CLIENT_ENV_PACKAGES = {"data_designer"}
SHARED = {"arrays", "attempts", "candidate", "clientenv", "containers", "contracts", "errors",
          "imagedigest", "layout", "localjob", "publish", "recipe", "resume", "statefile", "states",
          "text"}
ROLES = ("allocation", "proxy", "client", "engines")
CONTROL_LAYERS = {"errors": 0, "secrets": 0, "bundle": 0, "config": 1, "images": 2, "planning": 3,
                  "slurm": 3, "backends": 4, "runs": 5, "benchmark": 6, "api": 7, "readapi": 7,
                  "cli": 8}
PROXY_LAYERS = {"config": 0, "http": 0, "loop": 0, "route": 1, "exchange": 2, "client": 3,
                "upstream": 3, "core": 4, "main": 5}
# Names whose use in control/planning would be I/O (or a clock or randomness).
PREFIX = "synthbatch."  # the installed import name of control/ and agent_stdlib/
IMPURE_MODULES = {"subprocess", "socket", "shutil", "tempfile", "glob", "secrets", "random",
                  "time", "urllib", "http", "io", "sqlite3"}
IMPURE_CALLS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "mkdir",
                "exists", "is_file", "is_dir", "iterdir", "glob", "rglob", "stat", "unlink",
                "resolve", "listdir", "walk", "getcwd", "environ", "getenv", "urandom"}


def modules() -> Dict[str, Path]:
    """Dotted module name -> file, for every module of control and agent_stdlib."""
    found = {}
    for top in ("control", "agent_stdlib"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def raw_imports(path: Path, name: str) -> Iterator[Tuple[str, int, int]]:
    """Every import of ``path``: (module as written, resolved if relative; level; line)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, 0, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            yield base, node.level, node.lineno
            for alias in node.names:  # ``from agent_stdlib.allocation import slurmjob``
                yield f"{base}.{alias.name}", node.level, node.lineno


def imports(path: Path, name: str) -> Iterator[Tuple[str, int]]:
    """Every module ``path`` imports, absolute, with its line (relative imports resolved).

    ``synthbatch.control.x`` is the installed name of the checkout's ``control/x.py``: the
    rules below speak of the folders, so the prefix is dropped.
    """
    for target, _, line in raw_imports(path, name):
        yield target[len(PREFIX):] if target.startswith(PREFIX) else target, line


def graph() -> Dict[str, Set[str]]:
    """Module -> the project modules it imports."""
    mods = modules()
    return {name: {target for target, _ in imports(path, name) if target in mods
                   and target != name} for name, path in mods.items()}


def where(name: str, target: str) -> str:
    path = modules()[name]
    lines = [line for t, line in imports(path, name) if t == target]
    return f"{path.relative_to(REPO)}:{lines[0] if lines else '?'} imports {target}"


def lazy_import_lines(path: Path) -> Set[int]:
    """Lines of the imports made inside a function of ``path`` (not at import time)."""
    lines: Set[int] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines.update(n.lineno for n in ast.walk(node)
                         if isinstance(n, (ast.Import, ast.ImportFrom)))
    return lines


def test_the_agent_imports_only_itself_and_the_standard_library() -> None:
    std = set(sys.stdlib_module_names) | {"__future__", "agent_stdlib"}
    bad = []
    for name, path in modules().items():
        if not name.startswith("agent_stdlib"):
            continue
        lazy = lazy_import_lines(path) if name == CLIENT_ENV_MODULE else set()
        bad += [f"{path.relative_to(REPO)}:{line} imports {target}"
                for target, line in imports(path, name)
                if target.split(".")[0] not in std
                and not (line in lazy and target.split(".")[0] in CLIENT_ENV_PACKAGES)]
    assert bad == []


def test_the_data_designer_adapter_imports_its_packages_lazily() -> None:
    path = modules()[CLIENT_ENV_MODULE]
    lazy = lazy_import_lines(path)
    eager = [f"{path.relative_to(REPO)}:{line} imports {target} at import time"
             for target, line in imports(path, CLIENT_ENV_MODULE)
             if target.split(".")[0] in CLIENT_ENV_PACKAGES and line not in lazy]
    assert eager == []
    assert any(target.startswith("data_designer") for target, line in imports(
        path, CLIENT_ENV_MODULE) if line in lazy)


def test_the_control_plane_imports_only_the_shared_agent_modules() -> None:
    bad = [where(name, target) for name, targets in graph().items()
           if name.startswith("control") for target in targets
           if target.startswith("agent_stdlib.") and target.split(".")[1] not in SHARED]
    assert bad == []


def layer(name: str) -> Tuple[str, int]:
    """(the layering a module belongs to, its level there)."""
    parts = name.split(".")
    if parts[0] == "control":
        return "control", CONTROL_LAYERS.get(parts[1], 0) if len(parts) > 1 else 0
    if len(parts) > 2 and parts[1] == "proxy":
        return "proxy", PROXY_LAYERS[parts[2]]
    if len(parts) > 1 and parts[1] in ROLES:
        return f"agent role {parts[1]}", 1
    return "agent", 0  # the shared modules and the entry point


def second(name: str) -> str:
    """``control.planning.planner`` -> ``planning`` ("" for a top-level package)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def crosses(name: str, target: str) -> bool:
    """True when ``name`` importing ``target`` breaks a layering rule."""
    (mine, level), (theirs, their_level) = layer(name), layer(target)
    if name == "agent_stdlib.__main__":  # the entry point dispatches to every role
        return False
    if mine == theirs and their_level > level:
        return True
    if name.startswith("control") and {second(name), second(target)} == {"planning", "slurm"}:
        return True
    if mine.startswith("agent role") and theirs.startswith("agent role"):
        return mine != theirs
    return mine == "agent" and theirs.startswith("agent role")


def test_no_import_runs_back_up_a_layer() -> None:
    bad = [where(name, target) for name, targets in graph().items() for target in targets
           if not target.endswith("__init__") and second(target) and crosses(name, target)]
    assert bad == []


CLI_MAY_IMPORT = {"api", "readapi", "errors", "cli"}


def test_the_cli_reaches_control_only_through_the_api() -> None:
    bad = [where(name, target) for name, targets in graph().items()
           if name.startswith("control.cli") for target in targets
           if target.startswith("control.") and second(target) not in CLI_MAY_IMPORT]
    assert bad == []


def test_every_name_the_api_lends_the_cli_resolves() -> None:
    from synthbatch.control import api, readapi

    for module, table in ((readapi, readapi.LAZY), (api, api.CLI_LAZY)):
        for name in table:
            assert getattr(module, name) is not None, name
    try:
        readapi.no_such_name  # noqa: B018
    except AttributeError as err:
        assert "no_such_name" in str(err)
    else:
        raise AssertionError("readapi answered a name it does not lend")


def test_planning_does_no_io() -> None:
    bad = []
    for name, path in modules().items():
        if not name.startswith("control.planning"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) \
                    else [node.module or ""]
                bad += [f"{path.relative_to(REPO)}:{node.lineno} imports {n}"
                        for n in names if n.split(".")[0] in IMPURE_MODULES]
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else \
                    func.id if isinstance(func, ast.Name) else ""
                if called in IMPURE_CALLS:
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno} calls {called}()")
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
                bad.append(f"{path.relative_to(REPO)}:{node.lineno} reads os.{node.attr}")
    assert bad == []


def test_there_is_no_import_cycle() -> None:
    edges = graph()
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    cycles: List[List[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    assert cycles == []


def test_the_import_name_is_synthbatch() -> None:
    """The wheel installs control/ and agent_stdlib/ under ``synthbatch``: nothing may import
    them by their folder names (a top-level ``control`` is PyPI's python-control), and the agent
    imports itself only relatively, so the same files run as the zipapp's ``agent_stdlib``."""
    bad = []
    for top in ("control", "agent_stdlib", "tests", "fixtures", "benchmarks", "scripts"):
        for path in sorted((REPO / top).rglob("*.py")):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            for target, level, line in raw_imports(path, name):
                first = target.split(".")[0]
                if level == 0 and first in ("control", "agent_stdlib"):
                    bad.append(f"{path.relative_to(REPO)}:{line} imports {target}")
                if top == "agent_stdlib" and level == 0 and first == "synthbatch":
                    bad.append(f"{path.relative_to(REPO)}:{line} imports {target} (relative only)")
    assert bad == []


def test_one_lock_helper() -> None:
    """Every ``flock`` goes through ``agent_stdlib/statefile.locked`` (six helpers before)."""
    calls = [f"{path.relative_to(REPO)}:{node.lineno}"
             for path in modules().values()
             for node in ast.walk(ast.parse(path.read_text(), str(path)))
             if isinstance(node, ast.Attribute) and node.attr == "flock"]
    assert calls and {c.split(":")[0] for c in calls} == {"agent_stdlib/statefile.py"}
