"""``toml_text``: plain data -> TOML that parses back to the same data."""

from __future__ import annotations

import math

import pytest

from synthbatch.control.config.document import tomllib
from synthbatch.control.config.tomltext import toml_text, value

TRICKY = ["", 'a "quoted" word', "back\\slash", "tab\there", "new\nline", "ünïcödé",
          "\x7f\x01 control", "# not a comment", "key = value", "[not.a.table]"]


def test_strings_numbers_lists_and_tables_read_back() -> None:
    data = {"name": "x", "count": 3, "ratio": 0.25, "on": True, "off": False,
            "strings": TRICKY, "empty": [], "table": {"inner": 1, "deeper": {"z": "y"}},
            "rows": [{"a": 1, "b": [1, 2]}, {"a": 2, "sub": {"c": "d"}}],
            "odd key": 1, "dotted.key": "v", "dash-key": 2}
    assert tomllib.loads(toml_text(data)) == data


def test_none_is_a_comment_not_a_value() -> None:
    text = toml_text({"a": None, "b": 1, "t": {"c": None, "d": 2}})
    assert "# a is not set" in text and "null" not in text
    assert tomllib.loads(text) == {"b": 1, "t": {"d": 2}}


def test_special_floats() -> None:
    parsed = tomllib.loads(toml_text({"a": math.inf, "b": -math.inf, "c": math.nan}))
    assert parsed["a"] == math.inf and parsed["b"] == -math.inf and math.isnan(parsed["c"])


def test_a_value_without_a_toml_form_is_refused() -> None:
    with pytest.raises(TypeError):
        value(object())
