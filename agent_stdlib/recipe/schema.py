"""A JSON-schema subset: checked at plan time, used to validate structured answers.

Supported keywords (JSON Schema 2020-12 meaning): ``type`` (a name or a list of names:
object, array, string, number, integer, boolean, null), ``properties``, ``required``,
``additionalProperties`` (boolean or schema), ``items`` (one schema), ``minItems``,
``maxItems``, ``uniqueItems``, ``enum``, ``const``, ``minimum``, ``maximum``,
``exclusiveMinimum``, ``exclusiveMaximum``, ``minLength``, ``maxLength``, ``pattern``
(Python ``re``, searched), ``anyOf``, and the annotations ``title``, ``description``,
``default``, ``examples``, ``format`` (not asserted). Anything else (``$ref``, ``oneOf``,
``allOf``, ``not``, ``if``, ``patternProperties``, ...) is rejected by :func:`check`, so a
schema never means more than this validator enforces.

:func:`check` also rejects a schema no document can satisfy (an empty ``enum``,
``minimum`` above ``maximum``, a required property that ``additionalProperties: false``
forbids, ...): a structured column with such a schema could only ever fail.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Dict, List, Optional, Sequence

from ..errors import AgentError

TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "format", "$schema"})
KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "minItems",
    "maxItems", "uniqueItems", "enum", "const", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "minLength", "maxLength", "pattern", "anyOf"}) | ANNOTATIONS
COUNTS = ("minItems", "maxItems", "minLength", "maxLength")
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


class SchemaError(AgentError, ValueError):
    """A schema outside the subset, or one nothing can satisfy; names the keyword path."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def type_of(value: Any) -> str:
    """The JSON type name of a parsed JSON value (an integral float is a number)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def _types(schema: Dict[str, Any]) -> List[str]:
    kind = schema.get("type", list(TYPES))
    return [kind] if isinstance(kind, str) else list(kind)


# ----------------------------------------------------------------------------- check


def _plain(value: Any, where: str) -> None:
    """Only JSON values (a TOML date or an infinite number is not one)."""
    if isinstance(value, dict):
        for key, item in value.items():
            _plain(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _plain(item, f"{where}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise SchemaError(f"{where}: {value} is not a JSON number")
    elif not isinstance(value, (str, int, float, bool, type(None))):
        raise SchemaError(f"{where}: a {type(value).__name__} is not a JSON value")


def check(schema: Any, where: str = "schema") -> None:
    """Raise SchemaError when ``schema`` leaves the subset or cannot be satisfied."""
    _plain(schema, where)
    _check(schema, where)


def _check(schema: Any, where: str) -> None:
    if not isinstance(schema, dict):
        raise SchemaError(f"{where}: expected an object (a JSON schema)")
    unknown = sorted(set(schema) - KEYWORDS)
    if unknown:
        raise SchemaError(f"{where}.{unknown[0]}: unsupported keyword (supported: "
                          f"{', '.join(sorted(KEYWORDS - ANNOTATIONS))})")
    _check_shape(schema, where)
    problem = unsatisfiable(schema)
    if problem:
        raise SchemaError(f"{where}: no document can satisfy it ({problem})")


def _check_shape(schema: Dict[str, Any], where: str) -> None:
    if "type" in schema:  # a null type is no type name either
        kind = schema["type"]
        kinds = [kind] if isinstance(kind, str) else kind
        if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
            raise SchemaError(f"{where}.type: expected a type name or a list of them")
        bad = [k for k in kinds if k not in TYPES]
        if bad:
            raise SchemaError(f"{where}.type: unknown type {bad[0]!r} (have: "
                              f"{', '.join(TYPES)})")
    for key in COUNTS:
        if key in schema and not _is_count(schema[key]):
            raise SchemaError(f"{where}.{key}: expected a non-negative integer")
    for key in BOUNDS:
        if key in schema and not _is_number(schema[key]):
            raise SchemaError(f"{where}.{key}: expected a number")
    if "uniqueItems" in schema and not isinstance(schema["uniqueItems"], bool):
        raise SchemaError(f"{where}.uniqueItems: expected true or false")
    if "enum" in schema and not isinstance(schema["enum"], list):
        raise SchemaError(f"{where}.enum: expected a list")
    if "pattern" in schema:
        try:
            re.compile(schema["pattern"])
        except (re.error, TypeError) as err:
            raise SchemaError(f"{where}.pattern: not a regular expression ({err})") from err
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise SchemaError(f"{where}.required: expected a list of property names")
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        raise SchemaError(f"{where}.properties: expected an object")
    for name, sub in properties.items():
        _check(sub, f"{where}.properties.{name}")
    extra = schema.get("additionalProperties", True)
    if not isinstance(extra, bool):
        _check(extra, f"{where}.additionalProperties")
    if "items" in schema:
        _check(schema["items"], f"{where}.items")
    if "anyOf" in schema:
        branches = schema["anyOf"]
        if not isinstance(branches, list) or not branches:
            raise SchemaError(f"{where}.anyOf: expected a non-empty list of schemas")
        for i, sub in enumerate(branches):
            _check_shape_only(sub, f"{where}.anyOf[{i}]")


def _check_shape_only(schema: Any, where: str) -> None:
    """Like :func:`check` for a branch of ``anyOf``: one unsatisfiable branch is fine."""
    if not isinstance(schema, dict):
        raise SchemaError(f"{where}: expected an object (a JSON schema)")
    unknown = sorted(set(schema) - KEYWORDS)
    if unknown:
        raise SchemaError(f"{where}.{unknown[0]}: unsupported keyword")
    _check_shape(schema, where)


def unsatisfiable(schema: Dict[str, Any]) -> Optional[str]:
    """Why no JSON document satisfies ``schema`` (already shape-checked), or None."""
    for key in ("enum", "const"):
        if key in schema:
            values = schema["enum"] if key == "enum" else [schema["const"]]
            rest = {k: v for k, v in schema.items() if k not in ("enum", "const")}
            if not any(validate(v, rest) is None for v in values):
                return f"no value of {key} matches the rest of the schema"
            return None
    if "anyOf" in schema:
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        if all(unsatisfiable({**rest, **branch}) for branch in schema["anyOf"]):
            return "no branch of anyOf can be satisfied"
        return None
    kinds = [k for k in _types(schema) if _kind_possible(k, schema) is None]
    if not kinds:
        reasons = [_kind_possible(k, schema) for k in _types(schema)]
        return next((r for r in reasons if r), "type is an empty list")
    return None


def _kind_possible(kind: str, schema: Dict[str, Any]) -> Optional[str]:
    if kind in ("number", "integer"):
        return _numbers_possible(kind, schema)
    if kind == "string":
        if schema.get("minLength", 0) > schema.get("maxLength", math.inf):
            return "minLength is above maxLength"
    if kind == "array":
        low, high = schema.get("minItems", 0), schema.get("maxItems", math.inf)
        if low > high:
            return "minItems is above maxItems"
        items = schema.get("items")
        if low > 0 and isinstance(items, dict) and unsatisfiable(items):
            return f"items: {unsatisfiable(items)}"
    if kind == "object":
        return _object_possible(schema)
    return None


def _numbers_possible(kind: str, schema: Dict[str, Any]) -> Optional[str]:
    low = max(schema.get("minimum", -math.inf), schema.get("exclusiveMinimum", -math.inf))
    high = min(schema.get("maximum", math.inf), schema.get("exclusiveMaximum", math.inf))
    open_low = "exclusiveMinimum" in schema and schema["exclusiveMinimum"] >= \
        schema.get("minimum", -math.inf)
    open_high = "exclusiveMaximum" in schema and schema["exclusiveMaximum"] <= \
        schema.get("maximum", math.inf)
    if low > high or (low == high and (open_low or open_high)):
        return "the lower bound is above the upper bound"
    if kind == "integer" and math.isfinite(low) and math.isfinite(high):
        first = math.floor(low) + 1 if open_low or low != math.floor(low) else int(low)
        if first > high or (first == high and open_high):
            return "no integer lies between the bounds"
    return None


def _object_possible(schema: Dict[str, Any]) -> Optional[str]:
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for name in schema.get("required", []):
        sub = properties.get(name, extra if isinstance(extra, dict) else None)
        if sub is None and extra is False:
            return f"required property {name!r} is not allowed (additionalProperties: false)"
        if isinstance(sub, dict) and unsatisfiable(sub):
            return f"required property {name!r}: {unsatisfiable(sub)}"
    return None


# ----------------------------------------------------------------------------- validate


def validate(value: Any, schema: Dict[str, Any], where: str = "$") -> Optional[str]:
    """The first way ``value`` breaks ``schema`` (``$.steps[1]: expected string``), or None."""
    if "const" in schema and not _equal(value, schema["const"]):
        return f"{where}: expected {json.dumps(schema['const'])}"
    if "enum" in schema and not any(_equal(value, v) for v in schema["enum"]):
        return f"{where}: expected one of {json.dumps(schema['enum'])[:200]}"
    if "anyOf" in schema:
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        problems = [validate(value, {**rest, **b}, where) for b in schema["anyOf"]]
        if all(problems):
            return problems[0]
        return None
    kind = type_of(value)
    allowed = _types(schema)
    if kind not in allowed and not (kind == "integer" and "number" in allowed) and not (
            kind == "number" and "integer" in allowed and float(value).is_integer()):
        return f"{where}: expected {' or '.join(allowed)}, got {kind}"
    if kind in ("integer", "number"):
        return _check_number(value, schema, where)
    if kind == "string":
        return _check_string(value, schema, where)
    if kind == "array":
        return _check_array(value, schema, where)
    if kind == "object":
        return _check_object(value, schema, where)
    return None


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but true is not 1; lists and objects compared deeply."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if _is_number(a) or _is_number(b):
        return _is_number(a) and _is_number(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _check_number(value: Any, schema: Dict[str, Any], where: str) -> Optional[str]:
    if "minimum" in schema and value < schema["minimum"]:
        return f"{where}: below the minimum {schema['minimum']}"
    if "maximum" in schema and value > schema["maximum"]:
        return f"{where}: above the maximum {schema['maximum']}"
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        return f"{where}: not above {schema['exclusiveMinimum']}"
    if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
        return f"{where}: not below {schema['exclusiveMaximum']}"
    return None


def _check_string(value: str, schema: Dict[str, Any], where: str) -> Optional[str]:
    if len(value) < schema.get("minLength", 0):
        return f"{where}: shorter than {schema['minLength']} characters"
    if len(value) > schema.get("maxLength", math.inf):
        return f"{where}: longer than {schema['maxLength']} characters"
    if "pattern" in schema and not re.search(schema["pattern"], value):
        return f"{where}: does not match the pattern {schema['pattern']!r}"
    return None


def _check_array(value: List[Any], schema: Dict[str, Any], where: str) -> Optional[str]:
    if len(value) < schema.get("minItems", 0):
        return f"{where}: fewer than {schema['minItems']} items"
    if len(value) > schema.get("maxItems", math.inf):
        return f"{where}: more than {schema['maxItems']} items"
    if schema.get("uniqueItems") and _has_duplicates(value):
        return f"{where}: items are not unique"
    items = schema.get("items")
    if isinstance(items, dict):
        for i, item in enumerate(value):
            problem = validate(item, items, f"{where}[{i}]")
            if problem:
                return problem
    return None


def _has_duplicates(values: Sequence[Any]) -> bool:
    seen = set()
    for value in values:
        key = json.dumps(value, sort_keys=True)
        if key in seen:
            return True
        seen.add(key)
    return False


def _check_object(value: Dict[str, Any], schema: Dict[str, Any],
                  where: str) -> Optional[str]:
    properties = schema.get("properties", {})
    for name in schema.get("required", []):
        if name not in value:
            return f"{where}: missing required property {name!r}"
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        sub = properties.get(name)
        if sub is None:
            if extra is False:
                return f"{where}: property {name!r} is not allowed"
            sub = extra if isinstance(extra, dict) else None
        if sub is not None:
            problem = validate(item, sub, f"{where}.{name}")
            if problem:
                return problem
    return None


def fields(schema: Dict[str, Any]) -> Optional[List[str]]:
    """The property names an object schema declares, for checking ``{column.field}`` at
    plan time; None when the schema names none or leaves extra properties explicitly open."""
    if _types(schema) != ["object"] or "properties" not in schema:
        return None
    if schema.get("additionalProperties", False) is not False:
        return None
    return list(schema["properties"])
