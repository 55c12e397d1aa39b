"""The recipe's column logic in the expression language (:mod:`expr`): an expression
column's ``expr`` and ``dtype``, any column's ``skip_when``, a sampler's
``conditional_params`` (condition -> parameters) and ``constraints``.

One home for what they mean at plan time: which names each uses (a constraint may name
its own column: the value just drawn), the types they combine (checked from what each
column is), and a constraint no value of a finite sampler can meet. The generator runs
the same parsed trees (``client/logic.py``).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from . import expr
from .expr import ExprError
from .expr import Node as Tree
from .kinds import VALUE_TYPES

FINITE_LIMIT = 100_000  # values a plan-time constraint check enumerates at most
Use = Tuple[str, str, Tuple[str, ...], int]  # (field, name, path, 1-based position)


def condition_field(condition: str) -> str:
    """How a condition of ``conditional_params`` is named in an error."""
    return "conditional_params." + json.dumps(condition, ensure_ascii=False)


def expressions(kind: str, params: Mapping[str, Any]) -> List[Tuple[str, str, bool]]:
    """(field, text, may name its own column) of every expression of a column."""
    found: List[Tuple[str, str, bool]] = []
    if kind == "expression" and isinstance(params.get("expr"), str):
        found.append(("expr", params["expr"], False))
    if isinstance(params.get("skip_when"), str):
        found.append(("skip_when", params["skip_when"], False))
    for condition in params.get("conditional_params") or {}:
        found.append((condition_field(str(condition)), str(condition), False))
    for j, text in enumerate(params.get("constraints") or ()):
        found.append((f"constraints[{j}]", str(text), True))
    return found


def parse_all(kind: str, params: Mapping[str, Any],
              fail: Callable[[str, str], Exception]) -> List[Tuple[str, Tree, bool]]:
    """(field, tree, may name itself) of a column's expressions; ``fail(field, message)``
    builds the error of one that does not parse."""
    out = []
    for key, text, own in expressions(kind, params):
        try:
            out.append((key, expr.parse(text), own))
        except ExprError as err:
            raise fail(key, str(err)) from err
    return out


def uses(name: str, kind: str, params: Mapping[str, Any],
         fail: Callable[[str, str], Exception]) -> List[Use]:
    """Every name a column's expressions use (its own name in a constraint excepted)."""
    return [(key, ref, path, pos) for key, tree, own in parse_all(kind, params, fail)
            for ref, path, pos in expr.references(tree) if not (own and ref == name)]


def column_type(kind: str, params: Mapping[str, Any]) -> str:
    """The expression type of a column's values (``any`` when not one type)."""
    if kind in VALUE_TYPES:
        return VALUE_TYPES[kind]
    overrides = list((params.get("conditional_params") or {}).values())
    if kind == "category":
        values = list(params.get("values") or ())
        for override in overrides:
            values += list(override.get("values") or ())
        return expr.value_type(values)
    if kind == "subcategory":
        tables = [params.get("values") or {}] + [o.get("values") or {} for o in overrides]
        return expr.value_type([v for table in tables for vs in table.values() for v in vs])
    if kind == "expression":
        dtype = params.get("dtype") or "text"
        return expr.ANY if dtype == "json" else dtype
    return expr.ANY


def check_types(names: Sequence[str], kinds: Sequence[str],
                params: Sequence[Mapping[str, Any]], fail: Callable[[int, str, str], Exception],
                ) -> None:
    """Check every expression's types against the columns it names; ``fail(i, field,
    message)`` builds the error (the column's position, the field, what is wrong)."""
    types = {name: column_type(kind, p) for name, kind, p in zip(names, kinds, params)}
    types["index"] = expr.INT

    def type_of(name: str, path: Tuple[str, ...]) -> str:
        return expr.ANY if path else types.get(name, expr.ANY)

    for i, (kind, p) in enumerate(zip(kinds, params)):
        for key, tree, _ in parse_all(kind, p, lambda k, m, i=i: fail(i, k, m)):
            try:
                result = expr.infer(tree, type_of)
            except ExprError as err:
                raise fail(i, key, str(err)) from err
            if key == "expr":
                problem = expr.fits(result, str(p.get("dtype") or "text"))
                if problem:
                    raise fail(i, "expr", f"position 1: {problem} (dtype {p.get('dtype')})")
        problem = unsatisfiable(names[i], kind, p)
        if problem:
            raise fail(i, problem[0], problem[1])


def _domain(kind: str, params: Mapping[str, Any]) -> Optional[List[Any]]:
    """Every value a finite sampler can draw (None: not finite or too many)."""
    if kind == "category":
        return list(params.get("values") or ())
    if kind == "bernoulli":
        p = float(params.get("p", 0.5))
        return [v for v, possible in ((True, p > 0), (False, p < 1)) if possible]
    if kind == "integer":
        low, high = int(params["low"]), int(params["high"])
        return list(range(low, high + 1)) if high - low < FINITE_LIMIT else None
    if kind == "binomial":
        return list(range(int(params["n"]) + 1))
    return None


def unsatisfiable(name: str, kind: str, params: Mapping[str, Any]
                  ) -> Optional[Tuple[str, str]]:
    """(field, message) of a constraint that names only its own column and that no value
    of the column's finite domain meets: provably unsatisfiable. None otherwise."""
    if params.get("conditional_params"):
        return None  # which parameters hold is a record's business
    domain = _domain(kind, params)
    if domain is None:
        return None
    for j, text in enumerate(params.get("constraints") or ()):
        tree = expr.parse(str(text))
        if any(ref != name for ref, _, _ in expr.references(tree)):
            continue
        met = False
        for value in domain:
            try:
                met = expr.truth(expr.evaluate(tree, {name: value}.get))
            except ExprError:
                met = False
            if met:
                break
        if not met:
            return (f"constraints[{j}]", f"no value of {name} can meet {text!r} "
                    f"(it draws from {len(domain)} value(s))")
    return None


def sampler_params(params: Mapping[str, Any]) -> List[Tuple[Optional[str], Dict[str, Any]]]:
    """(condition, parameters) per parameter set of a sampler, conditions first in file
    order, then (None, the base parameters)."""
    base = {k: v for k, v in params.items()
            if k not in ("conditional_params", "constraints", "skip_when")}
    sets: List[Tuple[Optional[str], Dict[str, Any]]] = [
        (str(c), {**base, **dict(o)}) for c, o in (params.get("conditional_params")
                                                  or {}).items()]
    return sets + [(None, base)]
