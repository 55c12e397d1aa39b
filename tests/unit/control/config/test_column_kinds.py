"""Column kinds are defined once (``agent_stdlib/recipe/kinds.py``): the run file's models
name exactly each kind's parameters, require exactly its required ones and default the
others as the table does; the generator falls back to the same defaults (issue 29)."""

from __future__ import annotations

from typing import Any, Dict

import pytest
from pydantic_core import PydanticUndefined

from synthbatch.agent_stdlib.client.llm import request_body
from synthbatch.agent_stdlib.client.samplers import SAMPLERS, cell_bits
from synthbatch.agent_stdlib.recipe import kinds
from synthbatch.agent_stdlib.recipe.budget import answer_schema
from synthbatch.control.config.columns import MODELS


def _fields(kind: str) -> Dict[str, Any]:
    """The model's fields of ``kind`` by their run-file names."""
    return {(f.alias or name): f for name, f in MODELS[kind].model_fields.items()}


def test_every_kind_has_one_model() -> None:
    assert tuple(MODELS) == kinds.KINDS
    assert set(kinds.PARAMS) == set(kinds.REQUIRED) == set(kinds.DEFAULTS) == set(kinds.KINDS)


@pytest.mark.parametrize("kind", kinds.KINDS)
def test_the_model_names_the_kinds_parameters(kind: str) -> None:
    own = tuple(n for n in _fields(kind) if n not in kinds.COMMON)
    assert own == kinds.PARAMS[kind]
    assert set(kinds.COMMON) <= set(_fields(kind)) | {"type"}


@pytest.mark.parametrize("kind", kinds.KINDS)
def test_required_and_defaults_are_the_tables(kind: str) -> None:
    fields = {n: f for n, f in _fields(kind).items() if n not in kinds.COMMON}
    assert tuple(n for n, f in fields.items() if f.is_required()) == kinds.REQUIRED[kind]
    defaults = {n: tuple(f.default) if isinstance(f.default, list) else f.default
                for n, f in fields.items()
                if f.default is not None and f.default is not PydanticUndefined}
    assert defaults == dict(kinds.DEFAULTS[kind])


@pytest.mark.parametrize("kind", kinds.LLM)
def test_the_generator_falls_back_to_the_kinds_defaults(kind: str) -> None:
    scores = [{"name": "ok", "options": {"1": "yes", "0": "no"}}]
    params: Dict[str, Any] = {"model": "m", "prompt": "p", "scores": scores,
                              "schema": {"type": "object"}}
    body = request_body(kind, "c", params, "served", "p", None)
    assert body["temperature"] == kinds.default(kind, "temperature")
    assert body["max_tokens"] == kinds.default(kind, "max_tokens")
    if kind == "llm-judge":
        assert answer_schema(kind, params) == answer_schema(
            kind, {**params, "max_tokens": kinds.default(kind, "max_tokens")})


SAMPLED = {"uniform": {"low": 0, "high": 1}, "gaussian": {"mean": 0, "stddev": 1},
           "integer": {"low": 0, "high": 9}, "poisson": {"mean": 3},
           "binomial": {"n": 5, "p": 0.5}, "bernoulli": {"p": 0.5}, "uuid": {},
           "datetime": {"start": "2024-01-01", "end": "2024-02-01"},
           "timedelta": {"dt_min": 0, "dt_max": 5, "reference": "when"}}
PYTHON = {"float": float, "int": int, "bool": bool, "text": str}


def test_sampled_value_types_are_the_tables() -> None:
    assert set(SAMPLED) == set(kinds.VALUE_TYPES) & set(kinds.SAMPLERS)
    for kind, params in SAMPLED.items():
        draw = SAMPLERS[kind](params)
        value = draw(cell_bits(7, kind, 3), {"when": "2024-01-01T00:00:00"})
        assert type(value) is PYTHON[kinds.VALUE_TYPES[kind]], kind
