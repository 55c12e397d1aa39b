"""The columns of a built-in generator recipe (``[[client.columns]]``), one model per kind.

``type`` picks the model; each checks its own fields strictly. Each kind's parameter
names, required parameters and defaults are ``agent_stdlib.recipe.kinds``' tables: the
models take their defaults from there, and tests/unit/control/config/test_column_kinds.py
fails when a model's fields drift from them. How the columns fit
together (names, dependencies, cycles) is checked by ``agent_stdlib.recipe.columns``
from :meth:`ColumnBase.node`, the same rules the generator runs by.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from pydantic import (
    AfterValidator,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)

from synthbatch.agent_stdlib.recipe.columns import Node
from synthbatch.agent_stdlib.recipe.expr import DTYPES
from synthbatch.agent_stdlib.recipe.kinds import (
    KINDS,
    MIXABLE,
    MIXTURE_WEIGHT,
    VALIDATION,
    default,
)
from synthbatch.agent_stdlib.recipe.logic import condition_field
from synthbatch.agent_stdlib.recipe.names import LOCALES
from synthbatch.agent_stdlib.recipe.schema import SchemaError, check
from synthbatch.agent_stdlib.recipe.template import show
from synthbatch.agent_stdlib.text import quoted
from synthbatch.control.config.fields import Name, Prompt, Strict, Text
from synthbatch.control.config.rules import key_text

FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\[\]]*: ")  # a message naming its field
COLUMN_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
Finite = Annotated[float, Field(allow_inf_nan=False)]
Scalar = Union[str, int, Finite, bool]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Decimals = Optional[Annotated[int, Field(ge=0, le=15)]]


def _column_name(value: str) -> str:
    if not COLUMN_NAME.fullmatch(value):
        raise ValueError(f"{quoted(value)} is not a column name (a letter, then letters, digits "
                         f"or '_'; max 64)")
    return value


ColumnName = Annotated[str, AfterValidator(_column_name)]


LOGIC = ("skip_when", "conditional_params", "constraints")  # docs/generator.md


class ColumnBase(Strict):
    """What every column has: a name, a kind, whether the record keeps it, and its logic
    (expressions, checked with the recipe graph: ``agent_stdlib/recipe/logic.py``)."""

    name: ColumnName
    drop: bool = False
    skip_when: Optional[Text] = None  # left null when this holds
    conditional_params: Optional[Dict[Text, Dict[Text, Any]]] = Field(default=None,
                                                                        min_length=1)
    constraints: Optional[List[Text]] = Field(default=None, min_length=1, max_length=32)

    @model_validator(mode="after")
    def _conditional(self) -> ColumnBase:
        for condition in self.conditional_params or {}:
            self._variant(condition)
        return self

    def _variant(self, condition: str) -> ColumnBase:
        """The column with the parameters ``condition`` chooses (ValueError naming them)."""
        where = condition_field(condition)
        override = (self.conditional_params or {})[condition]
        fixed = {"name", "type", "drop"} | set(LOGIC)
        for key in override:
            if key in fixed or key not in type(self).model_fields:
                have = sorted(set(type(self).model_fields) - fixed)
                raise ValueError(f"{where}.{key_text(key)}: not a parameter of a "
                                 f"{self.type} column (have: {', '.join(have)})")  # type: ignore[attr-defined]
        base = self.model_dump(by_alias=True, exclude=set(LOGIC), exclude_unset=True)
        try:
            return type(self).model_validate({**base, **override})
        except ValidationError as err:
            item = err.errors()[0]
            loc = ".".join(str(x) for x in item["loc"])
            message = item["msg"].removeprefix("Value error, ")
            inner = loc or (message.split(": ", 1)[0] if FIELD.match(message) else "")
            if not loc and inner:
                message = message.split(": ", 1)[1]
            raise ValueError(f"{where}{'.' + inner if inner else ''}: {message}") from None

    def params(self) -> Dict[str, Any]:
        """The kind's own fields, as the plan carries them."""
        out = self.model_dump(exclude={"name", "type", "drop", "conditional_params"},
                              exclude_none=True)
        if self.conditional_params:
            out["conditional_params"] = {
                c: {k: v for k, v in self._variant(c).params().items() if k in o}
                for c, o in self.conditional_params.items()}
        return out

    def node(self) -> Node:
        """The column as the recipe graph sees it."""
        return Node(self.name, self.type, self.params())


class Category(ColumnBase):
    """One of ``values``, with optional relative ``weights``."""

    type: Literal["category"]
    values: List[Scalar] = Field(min_length=1, max_length=100_000)
    weights: Optional[List[PositiveFloat]] = None

    @model_validator(mode="after")
    def _weights(self) -> Category:
        if self.weights is not None and len(self.weights) != len(self.values):
            raise ValueError(f"weights: {len(self.weights)} weights for "
                             f"{len(self.values)} values")
        return self


class Subcategory(ColumnBase):
    """One of ``values[<the category column's value>]``."""

    type: Literal["subcategory"]
    category: ColumnName
    values: Dict[str, List[Scalar]] = Field(min_length=1)

    @model_validator(mode="after")
    def _non_empty(self) -> Subcategory:
        for key, choices in self.values.items():
            if not choices:
                raise ValueError(f"values.{key_text(key)}: no values")
        return self


class Uniform(ColumnBase):
    """A float drawn uniformly from ``[low, high)``, rounded to ``decimals`` if given."""

    type: Literal["uniform"]
    low: Finite
    high: Finite
    decimals: Decimals = None

    @model_validator(mode="after")
    def _range(self) -> Uniform:
        if not self.low < self.high:
            raise ValueError(f"high: {self.high:g} is not above low {self.low:g}")
        return self


class Gaussian(ColumnBase):
    """A float from the normal distribution, rounded to ``decimals`` if given."""

    type: Literal["gaussian"]
    mean: Finite
    stddev: PositiveFloat
    decimals: Decimals = None


class Integer(ColumnBase):
    """An integer drawn uniformly from ``low .. high`` (both included)."""

    type: Literal["integer"]
    low: int
    high: int

    @model_validator(mode="after")
    def _range(self) -> Integer:
        if self.low > self.high:
            raise ValueError(f"high: {self.high} is below low {self.low}")
        return self


class Bernoulli(ColumnBase):
    """``true`` with probability ``p``."""

    type: Literal["bernoulli"]
    p: float = Field(ge=0.0, le=1.0)


class Poisson(ColumnBase):
    """A count from the Poisson distribution with the given ``mean`` (at most 10,000)."""

    type: Literal["poisson"]
    mean: float = Field(gt=0.0, le=10_000.0, allow_inf_nan=False)


class Binomial(ColumnBase):
    """The number of successes in ``n`` trials (at most 10,000) of probability ``p``."""

    type: Literal["binomial"]
    n: int = Field(ge=0, le=10_000)
    p: float = Field(ge=0.0, le=1.0)


class Uuid(ColumnBase):
    """A version-4 UUID (from the record's seed, so reproducible)."""

    type: Literal["uuid"]


When = Union[dt.datetime, dt.date, Text]


def _moment(value: When, name: str) -> dt.datetime:
    if isinstance(value, dt.datetime):
        return value
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day)
    try:
        return dt.datetime.fromisoformat(value)
    except ValueError as err:
        raise ValueError(f"{name}: {quoted(value)} is not an ISO 8601 date or date-time") from err


class Datetime(ColumnBase):
    """A moment drawn uniformly from ``[start, end)``, in whole ``unit``s after start."""

    type: Literal["datetime"]
    start: When
    end: When
    unit: Literal["day", "hour", "minute", "second"] = default("datetime", "unit")
    format: Optional[Text] = None  # strftime; default ISO 8601 (a date for unit "day")

    @model_validator(mode="after")
    def _range(self) -> Datetime:
        start, end = _moment(self.start, "start"), _moment(self.end, "end")
        if (start.tzinfo is None) != (end.tzinfo is None):
            raise ValueError("end: give start and end both with or both without a time "
                             "zone offset")
        if not start < end:
            raise ValueError(f"end: {end.isoformat()} is not after start {start.isoformat()}")
        if self.format is not None:
            try:
                start.strftime(self.format)
            except ValueError as err:
                raise ValueError(f"format: {err}") from err
        return self

    def params(self) -> Dict[str, Any]:
        """Start and end as ISO 8601 text."""
        out = super().params()
        out["start"] = _moment(self.start, "start").isoformat()
        out["end"] = _moment(self.end, "end").isoformat()
        return out


DD_UNITS = {"D": "day", "h": "hour", "m": "minute", "s": "second"}  # DD's unit letters


class TimeDelta(ColumnBase):
    """The ``reference`` column's moment plus a whole number of ``unit`` in
    ``[dt_min, dt_max)`` (Data Designer's ``timedelta``)."""

    type: Literal["timedelta"]
    dt_min: int = Field(ge=-1_000_000, le=1_000_000)
    dt_max: int = Field(ge=-1_000_000, le=1_000_000)
    reference: ColumnName
    unit: Literal["day", "hour", "minute", "second", "D", "h", "m", "s"] = default("timedelta",
                                                                                 "unit")

    @model_validator(mode="after")
    def _range(self) -> TimeDelta:
        if not self.dt_min < self.dt_max:
            raise ValueError(f"dt_max: {self.dt_max} is not above dt_min {self.dt_min}")
        return self

    def params(self) -> Dict[str, Any]:
        """The unit by its full name."""
        out = super().params()
        out["unit"] = DD_UNITS.get(self.unit, self.unit)
        return out


Place = Annotated[List[Text], Field(min_length=2, max_length=2)]


class Identity(ColumnBase):
    """A person-like value (names, sex, age, place, email) from bundled or given lists."""

    type: Literal["identity"]
    locale: Literal[tuple(LOCALES)] = default("identity", "locale")  # type: ignore[valid-type]
    sex: Optional[Literal["female", "male"]] = None
    age_range: List[Annotated[int, Field(ge=0, le=120)]] = Field(
        default=list(default("identity", "age_range")), min_length=2, max_length=2)
    first_names: Optional[List[Text]] = Field(default=None, min_length=1, max_length=100_000)
    last_names: Optional[List[Text]] = Field(default=None, min_length=1, max_length=100_000)
    places: Optional[List[Place]] = Field(default=None, min_length=1, max_length=100_000)

    @model_validator(mode="after")
    def _ages(self) -> Identity:
        if self.age_range[0] > self.age_range[1]:
            raise ValueError(f"age_range: {self.age_range[0]} is above {self.age_range[1]}")
        return self


class Mixture(ColumnBase):
    """One of ``components`` (each a sampler's ``type`` and parameters, and a relative
    ``weight``), picked by weight per record."""

    type: Literal["mixture"]
    components: List[Dict[str, Any]] = Field(min_length=1, max_length=64)

    @model_validator(mode="after")
    def _components(self) -> Mixture:
        for i, component in enumerate(self.components):
            _component(component, f"components[{i}]")
        return self

    def params(self) -> Dict[str, Any]:
        """Each component as its sampler's checked parameters, with type and weight."""
        return {"components": [
            {"type": c["type"], "weight": float(c.get("weight", MIXTURE_WEIGHT)),
             **_component(c, "components").params()} for c in self.components]}


def _component(component: Dict[str, Any], where: str) -> ColumnBase:
    """A mixture's component as its sampler's model; ValueError naming ``where.field``."""
    kind = component.get("type")
    if kind not in MIXABLE:
        raise ValueError(f"{where}.type: {quoted(show(kind))} cannot be mixed (have: "
                         f"{', '.join(MIXABLE)})")
    weight = component.get("weight", MIXTURE_WEIGHT)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight \
            < float("inf"):
        raise ValueError(f"{where}.weight: expected a positive number")
    fields = {k: v for k, v in component.items() if k != "weight"}
    try:
        return MODELS[kind].model_validate({"name": "component", **fields})
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise ValueError(f"{where}.{loc}: {message}" if loc else f"{where}.{message}") \
            from None


class Expression(ColumnBase):
    """A value from a template or an expression over other columns, as ``dtype``; no
    model (``template`` and ``expr``: one of them, checked with the recipe graph)."""

    type: Literal["expression"]
    template: Optional[Prompt] = None
    expr: Optional[Text] = None
    dtype: Optional[Literal[DTYPES]] = None  # type: ignore[valid-type]  # default text


class LLMColumn(ColumnBase):
    """What every LLM column has: a deployment alias, a prompt, sampling settings."""

    model: Name
    prompt: Prompt
    system: Optional[Prompt] = None
    context: Optional[Prompt] = None  # shared text first in the request (docs/generator.md)
    continue_from: Optional[ColumnName] = None  # an earlier LLM column's conversation
    max_tokens: int = Field(default=default("llm-text", "max_tokens"), ge=1, le=131072)
    temperature: float = Field(default=default("llm-text", "temperature"), ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)


class LLMText(LLMColumn):
    """The model's answer, as text."""

    type: Literal["llm-text"]


class LLMStructured(LLMColumn):
    """A JSON value valid against ``schema`` (sent as ``response_format``, always checked)."""

    type: Literal["llm-structured"]
    schema_: Dict[str, Any] = Field(alias="schema")

    @model_validator(mode="after")
    def _schema(self) -> LLMStructured:
        try:
            check(self.schema_)
        except SchemaError as err:
            raise ValueError(str(err)) from err
        return self

    def params(self) -> Dict[str, Any]:
        """The schema under its authored name."""
        out = super().params()
        out["schema"] = out.pop("schema_")
        return out


class LLMCode(LLMColumn):
    """The code of the answer's fenced block (of ``language`` if given); ``_meta`` records
    the block's language; with ``require_block`` an answer without a block is an error."""

    type: Literal["llm-code"]
    language: Optional[Name] = None
    require_block: bool = default("llm-code", "require_block")


class Score(Strict):
    """One rubric of a judge: its options are the scores it may give."""

    name: ColumnName
    description: Optional[Prompt] = None
    options: Dict[Text, Prompt] = Field(min_length=1, max_length=100)


class LLMJudge(LLMColumn):
    """Scores from a rubric: ``{"<score>": {"score": <option>, "reasoning": "..."}}``."""

    type: Literal["llm-judge"]
    temperature: float = Field(default=default("llm-judge", "temperature"), ge=0.0, le=2.0)
    scores: List[Score] = Field(min_length=1, max_length=32)

    @model_validator(mode="after")
    def _unique(self) -> LLMJudge:
        seen = set()
        for i, name in enumerate(s.name for s in self.scores):
            if name in seen:
                raise ValueError(f"scores[{i}].name: {quoted(name)} is given twice")
            seen.add(name)
        return self


VALIDATOR_FIELDS = {"python": ("run", "timeout_s"), "sql": ("sql_schema", "schema_column"),
                    "json_schema": ("schema_",), "regex": ("pattern", "full")}


class Validation(ColumnBase):
    """``{"valid": bool, "errors": [...]}``: ``target``'s value checked by ``validator``."""

    type: Literal["validation"]
    validator: Literal["python", "sql", "json_schema", "regex"]
    target: ColumnName
    on_invalid: Literal["keep", "error"] = default(VALIDATION, "on_invalid")
    run: bool = default(VALIDATION, "run")
    timeout_s: float = Field(default=default(VALIDATION, "timeout_s"), gt=0, le=600,
                             allow_inf_nan=False)
    sql_schema: Optional[Prompt] = None
    schema_column: Optional[ColumnName] = None
    schema_: Optional[Dict[str, Any]] = Field(default=None, alias="schema")
    pattern: Optional[Text] = None
    full: bool = default(VALIDATION, "full")

    @model_validator(mode="after")
    def _fields(self) -> Validation:
        for kind, names in VALIDATOR_FIELDS.items():
            for name in names:
                if kind != self.validator and name in self.model_fields_set:
                    shown = name.rstrip("_")
                    raise ValueError(f"{shown}: belongs to validator {quoted(kind)}, not "
                                     f"{quoted(self.validator)}")
        if self.validator == "json_schema":
            if self.schema_ is None:
                raise ValueError("schema: a json_schema validator needs one")
            try:
                check(self.schema_)
            except SchemaError as err:
                raise ValueError(str(err)) from err
        if self.validator == "regex":
            if self.pattern is None:
                raise ValueError("pattern: a regex validator needs one")
            try:
                re.compile(self.pattern)
            except re.error as err:
                raise ValueError(f"pattern: not a regular expression ({err})") from err
        if self.sql_schema is not None and self.schema_column is not None:
            raise ValueError("schema_column: give sql_schema or schema_column, not both")
        return self

    def params(self) -> Dict[str, Any]:
        """Only the validator's own fields (and the schema under its authored name)."""
        out = super().params()
        for kind, names in VALIDATOR_FIELDS.items():
            if kind != self.validator:
                for name in names:
                    out.pop(name, None)
        if "schema_" in out:
            out["schema"] = out.pop("schema_")
        return out


class Unknown(Strict):
    """A column whose ``type`` is missing or not a kind: reported, never accepted."""

    type: Any = None
    name: Any = None

    @model_validator(mode="before")
    @classmethod
    def _reject(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        what = "missing" if kind is None else f"unknown column type {quoted(show(kind))}"
        raise ValueError(f"type: {what} (have: {', '.join(KINDS)})")


MODELS = {"category": Category, "subcategory": Subcategory, "uniform": Uniform,
          "gaussian": Gaussian, "integer": Integer, "bernoulli": Bernoulli, "uuid": Uuid,
          "datetime": Datetime, "poisson": Poisson, "binomial": Binomial,
          "timedelta": TimeDelta, "mixture": Mixture, "identity": Identity,
          "expression": Expression, "llm-text": LLMText,
          "llm-structured": LLMStructured, "llm-judge": LLMJudge, "llm-code": LLMCode,
          "validation": Validation}
assert tuple(MODELS) == KINDS


def _kind(value: object) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return f"<{kind}>" if isinstance(kind, str) and kind in MODELS else "<unknown>"


Column = Annotated[Union[tuple(Annotated[m, Tag(f"<{k}>")] for k, m in MODELS.items())
                         + (Annotated[Unknown, Tag("<unknown>")],)],  # type: ignore[misc]
                   Discriminator(_kind)]


def category_problem(columns: List[Any]) -> Optional[str]:
    """A subcategory whose category column is not a category, or lacks one of its values."""
    by_name = {c.name: (i, c) for i, c in enumerate(columns)}
    for i, column in enumerate(columns):
        if not isinstance(column, Subcategory):
            continue
        if column.category not in by_name:
            have = [c.name for c in columns if isinstance(c, Category)]
            return (f"columns[{i}].category: unknown column {column.category} (category "
                    f"columns: {', '.join(have) or 'none'})")
        _, parent = by_name[column.category]
        if not isinstance(parent, Category):
            return f"columns[{i}].category: {column.category} is not a category column"
        for value in parent.values:
            if show(value) not in column.values:
                return (f"columns[{i}].values: no values for {column.category} = "
                        f"{quoted(show(value))}")
    return None
