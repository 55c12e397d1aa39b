"""Column kinds and the dependency graph of a recipe.

A column depends on every column its templates name (``{question}``,
``{answer.steps}``), a ``subcategory`` on its ``category``, a ``timedelta`` on its
``reference`` and a ``validation`` on its ``target`` (and ``schema_column``); names that no column
defines come from the seed data (``{topic}``), and ``{index}`` is the record index.
:func:`analyze` orders the columns so that each comes after what it uses, and rejects
unknown names, cycles and fields of values that have none, naming the column's position
and field the way the run file spells it (``columns[2].prompt``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import AgentError
from . import logic
from . import schema as jsonschema
from .kinds import EXPRESSION, LLM, SAMPLERS, VALIDATION
from .template import TemplateError, references

TEMPLATES: Dict[str, Tuple[str, ...]] = {EXPRESSION: ("template",),
                                         **{k: ("context", "system", "prompt") for k in LLM}}
CONTEXT = "context"  # the recipe-level context's field (client.context)
INDEX = "index"  # the record index, usable as {index} everywhere
JUDGE_FIELDS = ("score", "reasoning")
IDENTITY_FIELDS = ("first_name", "last_name", "sex", "age", "locale", "city", "state", "email")
VALIDATION_FIELDS = ("valid", "errors")
NAMED = {"subcategory": ("category",), "timedelta": ("reference",),
         VALIDATION: ("target", "schema_column")}  # fields naming another column


class ColumnError(AgentError, ValueError):
    """A recipe whose columns do not fit together; ``where`` is ``columns[i].field``."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where, self.message = where, message


@dataclass(frozen=True)
class Node:
    """What the graph needs of one column."""

    name: str
    kind: str
    params: Mapping[str, Any]


@dataclass
class Graph:
    """A checked recipe: evaluation order, each column's inputs, the seed fields used."""

    order: List[int]  # column positions, each after every column it uses
    inputs: List[List[str]]  # per column: the names it uses (columns, seed fields, index)
    seed_fields: List[str] = field(default_factory=list)  # used names no column defines
    context_inputs: List[str] = field(default_factory=list)  # names the recipe context uses


Use = Tuple[str, str, Tuple[str, ...], str]  # (field, name, path, "position N: " or "")


def _uses(node: Node, where: str) -> List[Use]:
    """(field, name, path, where in the field) of every name ``node`` uses."""
    found: List[Use] = []
    for key in TEMPLATES.get(node.kind, ()):
        text = node.params.get(key)
        if text is None:
            continue
        try:
            found += [(key, name, path, "") for name, path in references(text)]
        except TemplateError as err:
            raise ColumnError(f"{where}.{key}", str(err)) from err
    for key in NAMED.get(node.kind, ()):
        if node.params.get(key) is not None:
            found.append((key, str(node.params[key]), (), ""))
    if node.kind in LLM and node.params.get("continue_from") is not None:
        found.append(("continue_from", str(node.params["continue_from"]), (), ""))
    found += [(key, name, path, f"position {pos}: ") for key, name, path, pos in logic.uses(
        node.name, node.kind, node.params, lambda k, m: ColumnError(f"{where}.{k}", m))]
    return found


def _logic_problem(node: Node) -> Optional[Tuple[str, str]]:
    """(field, message) of column logic a column of this kind cannot have."""
    for key in ("conditional_params", "constraints"):
        if node.params.get(key) and node.kind not in SAMPLERS:
            return key, f"only a sampler column has {key.replace('_', ' ')} (this is {node.kind})"
    if node.kind == "expression" and (node.params.get("expr") is None) == (
            node.params.get("template") is None):
        return "expr", "give either template or expr"
    return None


def _context_uses(context: Optional[str]) -> List[Tuple[str, Tuple[str, ...]]]:
    """(name, path) of every name the recipe-level context uses."""
    if context is None:
        return []
    try:
        return list(references(context))
    except TemplateError as err:
        raise ColumnError(CONTEXT, str(err)) from err


def _continuation_problem(nodes: Sequence[Node], i: int,
                          position: Mapping[str, int]) -> Optional[str]:
    """Why ``nodes[i].continue_from`` cannot be continued (None: it can)."""
    name = str(nodes[i].params["continue_from"])
    if name == nodes[i].name:
        return "a column cannot continue its own conversation"
    if name not in position or nodes[position[name]].kind not in LLM:
        have = [n.name for n in nodes if n.kind in LLM and n.name != nodes[i].name]
        return f"{name!r} is not an LLM column (have: {', '.join(have) or 'none'})"
    source = nodes[position[name]]
    if source.params.get("model") != nodes[i].params.get("model"):
        return (f"{name} runs on model {source.params.get('model')!r}, this column on "
                f"{nodes[i].params.get('model')!r}: a continuation runs where the "
                f"conversation's cache is, on the same model")
    return None


def field_problem(node: Optional[Node], path: Tuple[str, ...]) -> Optional[str]:
    """Why ``{name.path}`` cannot name part of ``node``'s value (None: it can, or unknown).

    ``node`` None is a seed field (any JSON: not checked).
    """
    if not path or node is None:
        return None
    if node.kind == "llm-structured":
        declared = jsonschema.fields(dict(node.params.get("schema") or {}))
        if declared is not None and path[0] not in declared:
            return (f"{node.name} has no field {path[0]!r} (its schema has: "
                    f"{', '.join(declared) or 'none'})")
        return None
    if node.kind == "llm-judge":
        scores = [s.get("name") for s in node.params.get("scores", ())]
        if path[0] not in scores:
            return f"{node.name} has no score {path[0]!r} (have: {', '.join(map(str, scores))})"
        if len(path) > 1 and path[1] not in JUDGE_FIELDS:
            return f"a score has only {' and '.join(JUDGE_FIELDS)}, not {path[1]!r}"
        return None
    own = {"identity": IDENTITY_FIELDS, VALIDATION: VALIDATION_FIELDS}.get(node.kind)
    if own is not None:
        if path[0] not in own or len(path) > 1 and path[0] != "errors":
            return (f"{node.name} has no field {'.'.join(path)!r} (have: "
                    f"{', '.join(own)})")
        return None
    return f"{node.name} is a {node.kind} value without fields"


def analyze(nodes: Sequence[Node], seed_fields: Optional[Collection[str]] = None,
            has_seed: bool = False, context: Optional[str] = None) -> Graph:
    """Check and order a recipe; ColumnError names the first problem.

    ``seed_fields`` are the seed file's fields when known; None with ``has_seed`` means
    the file could not be read here, so any name no column defines is taken to be one
    (the generator's preflight checks the file). ``context`` is the recipe-level context
    (it comes first in every LLM request, so it may not use an LLM column; every LLM
    column waits for what it uses).
    """
    position: Dict[str, int] = {}
    for i, node in enumerate(nodes):
        if node.name == INDEX or node.name in position:
            raise ColumnError(f"columns[{i}].name", f"{node.name!r} is "
                              + ("the record index" if node.name == INDEX else
                                 f"already the name of columns[{position[node.name]}]"))
        if seed_fields is not None and node.name in seed_fields:
            raise ColumnError(f"columns[{i}].name", f"{node.name!r} is also a field of the "
                              "seed data")
        position[node.name] = i
    inputs: List[List[str]] = []
    seeds: List[str] = []
    context_inputs: List[str] = []
    for name, _ in _context_uses(context):
        if name in position and nodes[position[name]].kind in LLM:
            raise ColumnError(CONTEXT, f"{{{name}}} is an LLM column: the context comes "
                              "before every LLM request of the record")
        if name not in context_inputs:
            context_inputs.append(name)
    for i, node in enumerate(nodes):
        where = f"columns[{i}]"
        used: List[str] = []
        if node.kind in LLM and node.params.get("continue_from") is not None:
            problem = _continuation_problem(nodes, i, position)
            if problem:
                raise ColumnError(f"{where}.continue_from", problem)
        bad = _logic_problem(node)
        if bad:
            raise ColumnError(f"{where}.{bad[0]}", bad[1])
        uses = _uses(node, where)
        if node.kind in LLM:
            uses += [("", name, path, "") for name, path in _context_uses(context)]
        for key, name, path, at in uses:
            if name == INDEX:
                problem = "index is the record number; it has no fields" if path else None
            elif name in position:
                problem = field_problem(nodes[position[name]], path)
            elif (seed_fields is not None and name in seed_fields) or (
                    seed_fields is None and has_seed):
                problem = None
                if name not in seeds:
                    seeds.append(name)
            else:
                have = sorted(set(position) | set(seed_fields or ()) | {INDEX})
                shown = ".".join((name,) + path)
                shown = shown if at else "{" + shown + "}"
                problem = f"unknown column {shown} (have: {', '.join(have)})"
            if problem:
                raise ColumnError(f"{where}.{key}" if key else CONTEXT, at + problem)
            if name not in used:
                used.append(name)
        inputs.append(used)
    order = _topological(nodes, inputs, position)
    logic.check_types([n.name for n in nodes], [n.kind for n in nodes],
                      [n.params for n in nodes],
                      lambda i, k, m: ColumnError(f"columns[{i}].{k}", m))
    return Graph(order, inputs, seeds, context_inputs)


def _topological(nodes: Sequence[Node], inputs: List[List[str]],
                 position: Mapping[str, int]) -> List[int]:
    """Depth-first order; a cycle is reported from its first column in file order."""
    state = [0] * len(nodes)  # 0 new, 1 on the path, 2 done
    order: List[int] = []

    def visit(i: int, path: List[int]) -> None:
        if state[i] == 2:
            return
        if state[i] == 1:
            cycle = path[path.index(i):] + [i]
            first = path[path.index(i)]
            key = _field_using(nodes[first], nodes[cycle[1]].name)
            raise ColumnError(f"columns[{first}].{key}", "cycle: " + " -> ".join(
                nodes[j].name for j in cycle))
        state[i] = 1
        for name in inputs[i]:
            if name in position:
                visit(position[name], path + [i])
        state[i] = 2
        order.append(i)

    for i in range(len(nodes)):
        visit(i, [])
    return order


def _field_using(node: Node, name: str) -> str:
    for key, used, _, _ in _uses(node, "columns"):
        if used == name:
            return key
    return "name"
