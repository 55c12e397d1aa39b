"""The JSON-schema subset: its own table of valid and invalid documents, and the plan-time
checks (keywords outside the subset, schemas nothing can satisfy)."""

from __future__ import annotations

from typing import Any, Dict

import pytest

from synthbatch.agent_stdlib.recipe.schema import SchemaError, check, fields, validate

ANSWER = {"type": "object",
          "properties": {"answer": {"type": "string", "minLength": 1},
                         "steps": {"type": "array", "items": {"type": "string"},
                                   "maxItems": 3},
                         "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                         "grade": {"enum": ["A", "B", 1]},
                         "count": {"type": "integer", "exclusiveMinimum": 0},
                         "tag": {"type": ["string", "null"], "pattern": "^[a-z]+$"},
                         "kind": {"const": "qa"},
                         "either": {"anyOf": [{"type": "boolean"}, {"type": "integer"}]}},
          "required": ["answer"], "additionalProperties": False}

# (document, the error validate reports or None)
TABLE = [
    ({"answer": "42"}, None),
    ({"answer": "42", "steps": ["a", "b"], "confidence": 0.5, "grade": 1, "count": 3,
      "tag": None, "kind": "qa", "either": True}, None),
    ({"answer": "x", "confidence": 1}, None),  # an integer is a number
    ({"answer": "x", "count": 2.0}, None),  # an integral float is an integer
    ({"answer": "x", "tag": "abc"}, None),
    ({}, "$: missing required property 'answer'"),
    ({"answer": 42}, "$.answer: expected string, got integer"),
    ({"answer": ""}, "$.answer: shorter than 1 characters"),
    ({"answer": "x", "extra": 1}, "$: property 'extra' is not allowed"),
    ({"answer": "x", "steps": ["a", 2]}, "$.steps[1]: expected string, got integer"),
    ({"answer": "x", "steps": ["a"] * 4}, "$.steps: more than 3 items"),
    ({"answer": "x", "confidence": 1.5}, "$.confidence: above the maximum 1"),
    ({"answer": "x", "confidence": True}, "$.confidence: expected number, got boolean"),
    ({"answer": "x", "grade": "C"}, '$.grade: expected one of ["A", "B", 1]'),
    ({"answer": "x", "grade": True}, '$.grade: expected one of ["A", "B", 1]'),
    ({"answer": "x", "count": 0}, "$.count: not above 0"),
    ({"answer": "x", "count": 1.5}, "$.count: expected integer, got number"),
    ({"answer": "x", "tag": "ABC"}, "$.tag: does not match the pattern '^[a-z]+$'"),
    ({"answer": "x", "kind": "other"}, '$.kind: expected "qa"'),
    ({"answer": "x", "either": "no"}, "$.either: expected boolean, got string"),
    ([], "$: expected object, got array"),
    ("text", "$: expected object, got string"),
]


@pytest.mark.parametrize("document,error", TABLE)
def test_validate_table(document: Any, error: Any) -> None:
    assert validate(document, ANSWER) == error


def test_the_table_schema_itself_is_accepted() -> None:
    check(ANSWER)
    check({})  # anything
    check({"type": "array", "uniqueItems": True, "minItems": 0, "items": {}})


def test_unique_items_compare_by_value() -> None:
    schema = {"type": "array", "uniqueItems": True}
    assert validate([1, 2, {"a": 1}], schema) is None
    assert validate([{"a": 1}, {"a": 1}], schema) == "$: items are not unique"


@pytest.mark.parametrize("schema,message", [
    ([], "schema: expected an object"),
    ({"$ref": "#/x"}, "schema.$ref: unsupported keyword"),
    ({"oneOf": [{}]}, "schema.oneOf: unsupported keyword"),
    ({"type": "strin"}, "schema.type: unknown type 'strin'"),
    ({"type": None}, "schema.type: expected a type name"),  # found by the config fuzzer
    ({"properties": {"a": {"type": "object", "patternProperties": {}}}},
     "schema.properties.a.patternProperties: unsupported keyword"),
    ({"minLength": -1}, "schema.minLength: expected a non-negative integer"),
    ({"minimum": "3"}, "schema.minimum: expected a number"),
    ({"pattern": "("}, "schema.pattern: not a regular expression"),
    ({"required": "a"}, "schema.required: expected a list of property names"),
    ({"enum": []}, "schema: no document can satisfy it (no value of enum matches"),
    ({"type": "string", "enum": [1, 2]}, "no value of enum matches"),
    ({"type": "integer", "minimum": 3, "maximum": 2}, "the lower bound is above the upper"),
    ({"type": "integer", "minimum": 1.2, "maximum": 1.8}, "no integer lies between"),
    ({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2}, "no integer lies"),
    ({"type": "number", "exclusiveMinimum": 1, "maximum": 1}, "lower bound is above"),
    ({"type": "string", "minLength": 3, "maxLength": 2}, "minLength is above maxLength"),
    ({"type": "array", "items": {"enum": []}}, "schema.items: no document can satisfy it"),
    ({"type": "object", "required": ["a"], "additionalProperties": False},
     "required property 'a' is not allowed"),
    ({"type": "object", "required": ["a"], "properties": {"a": {"type": []}}},
     "schema.properties.a: no document can satisfy it (type is an empty list)"),
    ({"anyOf": [{"enum": []}, {"type": "integer", "minimum": 2, "maximum": 1}]},
     "no branch of anyOf"),
    ({"type": "object", "properties": {"a": {"enum": []}}},
     "schema.properties.a: no document can satisfy it"),
    ({"enum": [__import__("datetime").date(2024, 1, 1)]},
     "schema.enum[0]: a date is not a JSON value"),
    ({"maximum": float("inf")}, "schema.maximum: inf is not a JSON number"),
])
def test_check_rejects_what_the_subset_cannot_mean_or_nothing_satisfies(schema: Any,
                                                                        message: str) -> None:
    with pytest.raises(SchemaError) as err:
        check(schema)
    assert message in str(err.value)


def test_satisfiable_edge_cases_pass() -> None:
    for schema in ({"type": "integer", "minimum": 1.5, "maximum": 2},
                   {"type": ["integer", "string"], "minimum": 3, "maximum": 2},
                   {"anyOf": [{"enum": []}, {"type": "null"}]},
                   {"type": "object", "required": ["a"]}):
        check(schema)


def test_fields_of_a_closed_object_schema() -> None:
    declared: Dict[str, Any] = {"type": "object", "properties": {"a": {}, "b": {}}}
    assert fields(declared) == ["a", "b"]
    assert fields({**declared, "additionalProperties": True}) is None
    assert fields({"type": "object"}) is None
    assert fields({"type": "string"}) is None
