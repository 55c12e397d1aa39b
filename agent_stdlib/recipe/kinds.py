"""Column kinds, defined once: their names and groups, each kind's parameters, which of
them a run file must give, and the defaults of the others.

The run file's pydantic models (``control/config/columns.py``) take their defaults from
:data:`DEFAULTS` and must name exactly :data:`PARAMS` and :data:`REQUIRED` (a unit test
fails when a kind's parameters drift); the generator (``agent_stdlib/client``) reads a
parameter a hand-edited plan left out through :func:`default`.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

SAMPLERS = ("category", "subcategory", "uniform", "gaussian", "integer", "bernoulli", "uuid",
            "datetime", "poisson", "binomial", "timedelta", "mixture", "identity")
EXPRESSION = "expression"
LLM = ("llm-text", "llm-structured", "llm-judge", "llm-code")
VALIDATION = "validation"
KINDS = SAMPLERS + (EXPRESSION,) + LLM + (VALIDATION,)
MIXABLE = ("category", "uniform", "gaussian", "integer", "bernoulli", "uuid", "datetime",
           "poisson", "binomial")  # the samplers a mixture's components may be
# What every column has besides its kind's parameters (``skip_when`` and the rest: the
# column logic of docs/generator.md).
COMMON = ("name", "type", "drop", "skip_when", "conditional_params", "constraints")
_LLM = ("model", "prompt", "system", "context", "continue_from", "max_tokens", "temperature",
        "top_p")

# Each kind's own parameters, as the run file and the plan spell them.
PARAMS: Mapping[str, Tuple[str, ...]] = {
    "category": ("values", "weights"),
    "subcategory": ("category", "values"),
    "uniform": ("low", "high", "decimals"),
    "gaussian": ("mean", "stddev", "decimals"),
    "integer": ("low", "high"),
    "bernoulli": ("p",),
    "uuid": (),
    "datetime": ("start", "end", "unit", "format"),
    "poisson": ("mean",),
    "binomial": ("n", "p"),
    "timedelta": ("dt_min", "dt_max", "reference", "unit"),
    "mixture": ("components",),
    "identity": ("locale", "sex", "age_range", "first_names", "last_names", "places"),
    EXPRESSION: ("template", "expr", "dtype"),
    "llm-text": _LLM,
    "llm-structured": _LLM + ("schema",),
    "llm-judge": _LLM + ("scores",),
    "llm-code": _LLM + ("language", "require_block"),
    VALIDATION: ("validator", "target", "on_invalid", "run", "timeout_s", "sql_schema",
                 "schema_column", "schema", "pattern", "full"),
}

# The parameters a run file must give.
REQUIRED: Mapping[str, Tuple[str, ...]] = {
    "category": ("values",), "subcategory": ("category", "values"),
    "uniform": ("low", "high"), "gaussian": ("mean", "stddev"), "integer": ("low", "high"),
    "bernoulli": ("p",), "uuid": (), "datetime": ("start", "end"), "poisson": ("mean",),
    "binomial": ("n", "p"), "timedelta": ("dt_min", "dt_max", "reference"),
    "mixture": ("components",), "identity": (), EXPRESSION: (),
    "llm-text": ("model", "prompt"), "llm-structured": ("model", "prompt", "schema"),
    "llm-judge": ("model", "prompt", "scores"), "llm-code": ("model", "prompt"),
    VALIDATION: ("validator", "target"),
}

_LLM_DEFAULTS: Dict[str, Any] = {"max_tokens": 256, "temperature": 0.7}
# The defaults of the parameters that have one other than None.
DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    **{kind: {} for kind in KINDS},
    "datetime": {"unit": "second"},
    "timedelta": {"unit": "day"},
    "identity": {"locale": "en_US", "age_range": (18, 85)},
    "llm-text": _LLM_DEFAULTS,
    "llm-structured": _LLM_DEFAULTS,
    "llm-judge": {**_LLM_DEFAULTS, "temperature": 0.0},
    "llm-code": {**_LLM_DEFAULTS, "require_block": False},
    VALIDATION: {"on_invalid": "keep", "run": False, "timeout_s": 5.0, "full": False},
}
# The value type of the kinds whose every value has one (the expression language's words:
# ``int``, ``float``, ``bool``, ``text``); the others' follow from their parameters.
VALUE_TYPES: Mapping[str, str] = {
    "uniform": "float", "gaussian": "float", "integer": "int", "poisson": "int",
    "binomial": "int", "bernoulli": "bool", "uuid": "text", "datetime": "text",
    "timedelta": "text", "llm-text": "text", "llm-code": "text"}
MIXTURE_WEIGHT = 1.0  # a mixture component's weight when it gives none


def default(kind: str, param: str) -> Any:
    """The default of ``kind``'s ``param`` (None: it has none)."""
    return DEFAULTS[kind].get(param)
