"""The plan's generator spec made runnable: columns in evaluation order, parsed templates,
samplers built, one alias per LLM column.

The prompt-template form (``GenerateSpec.columns`` empty) is one ``llm-text`` column
named ``completion`` whose records keep that form's shape (``prompt``, ``completion``,
``model``, ``served_model``, ``finish_reason``, ``usage``). The plan was checked when it
was made; anything off here (a plan edited by hand, a bug) fails with one line naming
the column (:class:`RecipeError`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from ..contracts import GenerateSpec, Plan
from ..errors import AgentError
from ..recipe import schema as jsonschema
from ..recipe.columns import ColumnError, Node, analyze
from ..recipe.kinds import EXPRESSION, LLM, VALIDATION
from ..recipe.template import Part, parse
from .logic import Logic, compile_logic
from .samplers import SAMPLERS, Sampler

LEGACY_COLUMN = "completion"


class RecipeError(AgentError):
    """The plan's recipe cannot run; the message names the column."""


@dataclass
class Column:
    """One runnable column."""

    name: str
    kind: str
    params: Dict[str, Any]
    drop: bool = False
    templates: Dict[str, Tuple[Part, ...]] = field(default_factory=dict)
    inputs: List[str] = field(default_factory=list)
    sampler: Optional[Sampler] = None
    alias: str = ""  # LLM columns: the deployment alias
    served: str = ""  # ... and the model name it serves
    logic: Logic = field(default_factory=Logic)  # skip_when, expr, conditions, constraints

    @property
    def llm(self) -> bool:
        """True for the columns that ask a model."""
        return self.kind in LLM


@dataclass
class Recipe:
    """Columns in file order and in evaluation order, and what the seed data must give."""

    columns: List[Column]
    order: List[Column]
    seed_fields: List[str]
    legacy: bool = False
    skipped: List[str] = field(default_factory=list)  # LLM columns with no endpoint (preview)
    unavailable: List[str] = field(default_factory=list)  # ... and their aliases
    context: Optional[Tuple[Part, ...]] = None  # the recipe-level context, parsed
    context_inputs: List[str] = field(default_factory=list)  # names it uses
    continued: Set[str] = field(default_factory=set)  # LLM columns another continues

    @property
    def aliases(self) -> List[str]:
        """Every alias an LLM column asks, sorted."""
        return sorted({c.alias for c in self.order if c.llm})


def _legacy(spec: GenerateSpec) -> List[Node]:
    params = {"model": spec.model, "prompt": spec.prompt_template,
              "max_tokens": spec.max_tokens, "temperature": spec.temperature}
    if spec.system_prompt:
        params["system"] = spec.system_prompt
    return [Node(LEGACY_COLUMN, "llm-text", params)]


def _column(node: Node, drop: bool, inputs: List[str], plan: Plan, where: str) -> Column:
    params = dict(node.params)
    column = Column(node.name, node.kind, params, drop, inputs=inputs)
    for key in ("template", "prompt", "system", "context"):
        if isinstance(params.get(key), str):
            column.templates[key] = parse(params[key])
    column.logic = compile_logic(node.kind, params, SAMPLERS.get(node.kind),
                                 lambda key, message: ColumnError(
                                     f"{where.replace('client.', '', 1)}.{key}", message))
    if node.kind in SAMPLERS:
        column.sampler = column.logic.samplers[-1][1]
    elif node.kind in LLM:
        column.alias = str(params["model"])
        column.served = plan.deployment(column.alias).served_name
        if node.kind == "llm-structured":
            jsonschema.check(params["schema"], f"{where}.schema")
    elif node.kind == VALIDATION and params.get("validator") == "json_schema":
        jsonschema.check(params["schema"], f"{where}.schema")
    elif node.kind not in (EXPRESSION, VALIDATION):
        raise RecipeError(f"{where}.type: unknown column type {node.kind!r}")
    return column


def compile_recipe(plan: Plan, available: Optional[Set[str]] = None) -> Recipe:
    """The plan's recipe, ready to run; RecipeError naming the column if it cannot.

    ``available`` (preview only) are the aliases with an endpoint: LLM columns of other
    aliases, and every column that uses one, are left out and listed in ``skipped``.
    """
    spec = plan.client
    if spec is None:
        raise RecipeError("plan.client: the plan has no built-in generator")
    legacy = not spec.columns
    nodes = _legacy(spec) if legacy else [Node(c.name, c.type, c.params)
                                          for c in spec.columns]
    drops = [False] * len(nodes) if legacy else [c.drop for c in spec.columns]
    try:
        graph = analyze(nodes, None, has_seed=spec.seed_data is not None,
                        context=spec.context)
        columns = [_column(n, drops[i], graph.inputs[i], plan, f"client.columns[{i}]")
                   for i, n in enumerate(nodes)]
    except (ColumnError, jsonschema.SchemaError) as err:
        raise RecipeError(f"plan: client.{err}") from err
    except (KeyError, TypeError, ValueError, AgentError) as err:
        raise RecipeError(f"plan: client.columns: unusable ({type(err).__name__}: "
                          f"{err})") from err
    order = [columns[i] for i in graph.order]
    skipped: List[str] = []
    if available is not None:
        gone: Set[str] = set()
        for column in order:
            if (column.llm and column.alias not in available) or gone & set(column.inputs):
                gone.add(column.name)
                skipped.append(column.name)
        order = [c for c in order if c.name not in gone]
    unavailable = sorted({c.alias for c in columns if c.llm and available is not None
                          and c.alias not in available})
    continued = {str(c.params["continue_from"]) for c in columns
                  if c.llm and c.params.get("continue_from")}
    return Recipe(columns, order, graph.seed_fields, legacy, skipped, unavailable,
                  parse(spec.context) if spec.context is not None else None,
                  graph.context_inputs, continued)

