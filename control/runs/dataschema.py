"""The Arrow schema of a run's records: what the plan knows, and the rules that unify the
schemas of the shards.

The built-in generator knows its record shape (``docs/generator.md``): the type of every
sampler, the JSON schema of each structured column, the judge's scores and ``_meta``. That
is :func:`known_schema`. What the plan cannot know (seed-data fields, an engine's
``usage`` object, any field of a command or Data Designer client) is inferred from the data
and unified over every shard by :func:`unify`: int + float -> float, null + T -> T, a field
missing somewhere -> nullable, structs field by field, lists by their items. Anything else
(a number in one shard and text in another) is a true conflict: :class:`SchemaConflict`
names the field path; the writer adds the shard and the record.

``pa.null()`` stands for "not known": it unifies with anything. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pyarrow as pa

from synthbatch.agent_stdlib.contracts import GenerateSpec, Plan
from synthbatch.agent_stdlib.recipe import logic
from synthbatch.agent_stdlib.recipe.columns import IDENTITY_FIELDS
from synthbatch.agent_stdlib.recipe.kinds import EXPRESSION, VALUE_TYPES

LOGIC_TYPES = {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(),
               "text": pa.string()}  # the expression language's types; others inferred
META_CELL = (("model", pa.string()), ("served_model", pa.string()),
             ("finish_reason", pa.string()), ("attempts", pa.int64()),
             ("latency_ms", pa.float64()), ("request_digest", pa.string()),
             ("reused_from", pa.string()),
             ("language", pa.string()),  # an llm-code cell's fenced block
             # each retry: after which error, and what it changed (docs/generator.md)
             ("retries", pa.list_(pa.struct([("attempt", pa.int64()), ("after", pa.string()),
                                             ("seed", pa.int64()),
                                             ("max_tokens", pa.int64()),
                                             ("temperature", pa.float64())]))))
LEGACY = (("index", pa.int64()), ("prompt", pa.string()), ("completion", pa.string()),
          ("finish_reason", pa.string()), ("model", pa.string()),
          ("served_model", pa.string()))


class SchemaConflict(Exception):
    """Two types of one field that no rule unifies; ``path`` names the field."""

    def __init__(self, path: str, left: pa.DataType, right: pa.DataType) -> None:
        super().__init__(f"field {path}: {describe(left)} here, {describe(right)} elsewhere")
        self.path, self.left, self.right = path, left, right


def describe(kind: pa.DataType) -> str:
    """A type in the words of JSON: ``number``, ``text``, ``object``, ``list``..."""
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return "a number"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "text"
    if pa.types.is_boolean(kind):
        return "a boolean"
    if pa.types.is_struct(kind):
        return "an object"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return "a list"
    return str(kind)


def _values(values: List[Any]) -> pa.DataType:
    """The type of a list of JSON values (category values, an enum); null when mixed."""
    if values and all(isinstance(v, bool) for v in values):
        return pa.bool_()
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return pa.int64()
    if values and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                      for v in values):
        return pa.float64()
    if values and all(isinstance(v, str) for v in values):
        return pa.string()
    return pa.null()


JSON_TYPES = {"string": pa.string(), "integer": pa.int64(), "number": pa.float64(),
              "boolean": pa.bool_(), "null": pa.null()}


def from_json_schema(schema: Any) -> pa.DataType:
    """The Arrow type of a value valid against ``schema`` (the generator's subset); null
    (inferred from the data) where the schema leaves the type open."""
    if not isinstance(schema, dict):
        return pa.null()
    if "const" in schema:
        return _values([schema["const"]])
    if "enum" in schema:
        return _values(list(schema["enum"]))
    kinds = schema.get("type")
    if isinstance(kinds, list):
        kinds = [k for k in kinds if k != "null"]
        kinds = kinds[0] if len(kinds) == 1 else None
    if kinds is None and "properties" in schema:
        kinds = "object"
    if kinds == "object":
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties:
            return pa.null()
        return pa.struct([(name, from_json_schema(sub)) for name, sub in properties.items()])
    if kinds == "array":
        return pa.list_(from_json_schema(schema.get("items")))
    return JSON_TYPES.get(kinds, pa.null()) if isinstance(kinds, str) else pa.null()


def _judge(params: Dict[str, Any]) -> pa.DataType:
    scores = []
    for score in params.get("scores", []):
        keys = [str(k) for k in score.get("options", {})]
        kind = pa.int64() if keys and all(k.lstrip("-").isdigit() for k in keys) \
            else pa.string()
        scores.append((score["name"], pa.struct([("score", kind),
                                                 ("reasoning", pa.string())])))
    return pa.struct(scores)


def column_type(kind: str, params: Dict[str, Any]) -> pa.DataType:
    """The Arrow type of one generator column's value (null: inferred from the data)."""
    if kind in VALUE_TYPES or kind in ("category", "subcategory", EXPRESSION):
        return LOGIC_TYPES.get(logic.column_type(kind, params), pa.null())  # values, dtype
    if kind == "llm-structured":
        return from_json_schema(params.get("schema"))
    if kind == "llm-judge":
        return _judge(params)
    if kind == "identity":
        return pa.struct([(name, pa.int64() if name == "age" else pa.string())
                          for name in IDENTITY_FIELDS])
    if kind == "validation":
        return pa.struct([("valid", pa.bool_()), ("errors", pa.list_(pa.string()))])
    return pa.null()


def known_schema(plan: Plan) -> Optional[pa.Schema]:
    """The record schema the built-in generator's plan fixes (None for command and Data
    Designer clients: their shards' schemas are only inferred)."""
    spec: Optional[GenerateSpec] = plan.client
    if spec is None:
        return None
    if not spec.columns:
        return pa.schema(list(LEGACY))
    fields = [("index", pa.int64())]
    fields += [(c.name, column_type(c.type, c.params)) for c in spec.columns if not c.drop]
    llm = [c.name for c in spec.columns if c.type.startswith("llm-")]
    cells = pa.struct([(name, pa.struct(list(META_CELL))) for name in llm])
    fields.append(("_meta", pa.struct([("index", pa.int64()), ("columns", cells)])))
    if spec.on_error == "keep":
        fields.append(("_error", pa.struct([("column", pa.string()),
                                            ("message", pa.string())])))
    return pa.schema(fields)


def normalize(kind: pa.DataType) -> pa.DataType:
    """An inferred type as records hold it: a timestamp the JSON reader recognised in text
    stays text (the record had a string)."""
    if pa.types.is_temporal(kind):
        return pa.string()
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, normalize(f.type)) for f in kind])
    if pa.types.is_list(kind):
        return pa.list_(normalize(kind.value_type))
    return kind


def unify(left: pa.DataType, right: pa.DataType, path: str = "") -> pa.DataType:
    """One type both values fit (see the module docstring); SchemaConflict when none."""
    if left == right:
        return left
    if pa.types.is_null(left):
        return right
    if pa.types.is_null(right):
        return left
    numeric = (pa.types.is_integer, pa.types.is_floating)
    if any(t(left) for t in numeric) and any(t(right) for t in numeric):
        return pa.float64()
    if pa.types.is_struct(left) and pa.types.is_struct(right):
        return pa.struct(_union(list(left), list(right), path))
    if pa.types.is_list(left) and pa.types.is_list(right):
        return pa.list_(unify(left.value_type, right.value_type, f"{path}[]"))
    raise SchemaConflict(path.lstrip(".") or "(record)", left, right)


def _union(left: List[pa.Field], right: List[pa.Field], path: str) -> List[pa.Field]:
    theirs = {f.name: f.type for f in right}
    out = [pa.field(f.name, unify(f.type, theirs[f.name], f"{path}.{f.name}")
                    if f.name in theirs else f.type) for f in left]
    mine = {f.name for f in left}
    return out + [pa.field(f.name, f.type) for f in right if f.name not in mine]


def unify_schemas(left: Optional[pa.Schema], right: pa.Schema) -> pa.Schema:
    """Two record schemas unified field by field (``left``'s order, then ``right``'s new
    fields); SchemaConflict naming the field."""
    if left is None:
        return pa.schema([pa.field(f.name, normalize(f.type)) for f in right])
    merged = unify(pa.struct(list(left)), normalize(pa.struct(list(right))))
    return pa.schema(list(merged))


def ordered(schema: pa.Schema, first: Optional[pa.Schema]) -> pa.Schema:
    """``schema`` with the fields of ``first`` (the data's own order) leading."""
    if first is None:
        return schema
    lead = [schema.field(f.name) for f in first if schema.get_field_index(f.name) >= 0]
    names = {f.name for f in lead}
    return pa.schema(lead + [f for f in schema if f.name not in names])
