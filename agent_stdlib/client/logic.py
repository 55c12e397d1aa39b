"""A column's logic at run time (``recipe/logic.py`` says what it means): skip conditions,
typed expressions, and samplers whose parameters depend on other columns and whose values
must meet constraints.

Everything stays a function of (seed, column, index) and the record's other values: a
constrained sampler's k-th try draws from ``cell_bits(seed, "<column>\\x00try<k>", index)``
(the first try from the column's own bits, the same value as without constraints), so a
record is the same in every shard layout, resume and retry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..recipe import expr
from ..recipe.expr import ExprError
from ..recipe.expr import Node as Tree
from ..recipe.logic import parse_all, sampler_params
from ..recipe.template import Part, render
from .samplers import Sampler, cell_bits

MAX_TRIES = 100  # draws of a constrained sampler before the cell fails


class LogicError(Exception):
    """A cell whose logic fails for this record (a type error on its values, a
    constraint no try met); the record's ``on_error`` decides."""

    def __init__(self, column: str, message: str) -> None:
        super().__init__(message)
        self.column, self.message = column, message


@dataclass
class Logic:
    """The parsed logic of one column."""

    skip: Optional[Tree] = None
    expr: Optional[Tree] = None
    dtype: str = "text"
    samplers: List[Tuple[Optional[Tree], Sampler]] = field(default_factory=list)
    constraints: List[Tuple[str, Tree]] = field(default_factory=list)


def compile_logic(kind: str, params: Dict[str, Any],
                  build: Optional[Callable[[Dict[str, Any]], Sampler]],
                  fail: Callable[[str, str], Exception]) -> Logic:
    """The logic of a column; ``build`` makes a sampler of one parameter set (None: not a
    sampler); ``fail(field, message)`` is the error of an expression that does not parse."""
    trees = {key: tree for key, tree, _ in parse_all(kind, params, fail)}
    logic = Logic(skip=trees.get("skip_when"), expr=trees.get("expr"),
                  dtype=str(params.get("dtype") or "text"))
    if build is not None:
        logic.samplers = [(expr.parse(c) if c is not None else None, build(p))
                          for c, p in sampler_params(params)]
    logic.constraints = [(str(t), trees[f"constraints[{j}]"])
                         for j, t in enumerate(params.get("constraints") or ())]
    return logic


def _test(column: str, what: str, tree: Tree, value_of: Callable[[str], Any]) -> bool:
    try:
        return expr.truth(expr.evaluate(tree, value_of))
    except ExprError as err:
        raise LogicError(column, f"{what}: {err}") from err


def skipped(column: str, logic: Logic, values: Dict[str, Any]) -> bool:
    """True when the column's ``skip_when`` holds for this record."""
    return logic.skip is not None and _test(column, "skip_when", logic.skip, values.get)


def draw(column: str, logic: Logic, seed: int, index: int, values: Dict[str, Any]) -> Any:
    """A sampler's value: the first parameter set whose condition holds, redrawn until
    every constraint is met (at most :data:`MAX_TRIES` draws)."""
    sampler = logic.samplers[-1][1]
    for condition, candidate in logic.samplers:
        if condition is None or _test(column, "conditional_params", condition, values.get):
            sampler = candidate
            break
    for attempt in range(MAX_TRIES):
        name = column if attempt == 0 else f"{column}\x00try{attempt}"
        try:
            value = sampler(cell_bits(seed, name, index), values)
        except KeyError as err:  # a subcategory of a category left null (skip_when)
            raise LogicError(column, f"no values for {err}") from None
        if all(_test(column, f"constraint {text!r}", tree,
                     lambda n, v=value: v if n == column else values.get(n))
               for text, tree in logic.constraints):
            return value
    unmet = [text for text, tree in logic.constraints
             if not _test(column, text, tree,
                          lambda n, v=value: v if n == column else values.get(n))]
    raise LogicError(column, f"no value met the constraint {unmet[0]!r} in {MAX_TRIES} "
                             f"draws")


def compute(column: str, logic: Logic, template: Optional[Sequence[Part]],
            values: Dict[str, Any]) -> Any:
    """An expression column's value: its ``expr`` or ``template``, as its ``dtype``."""
    if logic.expr is not None:
        try:
            value = expr.evaluate(logic.expr, values.get)
        except ExprError as err:
            raise LogicError(column, f"expr: {err}") from err
    else:
        value = render(template or (), values.get)
    try:
        return expr.convert(value, logic.dtype)
    except ValueError as err:
        raise LogicError(column, f"dtype {logic.dtype}: {err}") from err
