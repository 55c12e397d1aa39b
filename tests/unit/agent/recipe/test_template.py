"""Templates: parsing, references, rendering."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from synthbatch.agent_stdlib.recipe.template import (
    TemplateError,
    names,
    parse,
    references,
    render,
)


def render_text(text: str, value_of: Callable[[str], Any]) -> str:
    """``render(parse(text), value_of)``: what the generator does with a column's text."""
    return render(parse(text), value_of)


def test_references_in_order_with_field_paths() -> None:
    text = "Q: {question}\nA: {answer.answer} ({answer.steps.0}) #{index}"
    assert references(text) == [("question", ()), ("answer", ("answer",)),
                                ("answer", ("steps", "0")), ("index", ())]
    assert names(text) == ["question", "answer", "index"]


def test_double_braces_are_literal() -> None:
    assert parse('{{"a": {x}}}') == ('{"a": ', ("x", ()), "}")
    assert render_text('{{"a": {x}}}', {"x": 1}.get) == '{"a": 1}'


@pytest.mark.parametrize("text", ["{", "}", "{ x}", "{x!r}", "{x:>3}", "{1x}", '{"a": 1}',
                                  "{x.}", "{}"])
def test_bad_placeholders_are_named(text: str) -> None:
    with pytest.raises(TemplateError):
        parse(text)


def test_values_render_by_json_spelling() -> None:
    values = {"s": "text", "n": 3, "f": 2.5, "b": True, "none": None,
              "obj": {"a": [1, "x"], "b": {"c": "deep"}}, "lst": ["p", "q"]}
    rendered = render_text("{s}|{n}|{f}|{b}|{none}|{obj}|{obj.b.c}|{lst.1}|{obj.missing}|"
                           "{lst.9}|{s.x}", values.get)
    assert rendered == 'text|3|2.5|true||{"a":[1,"x"],"b":{"c":"deep"}}|deep|q|||'


def test_unicode_is_kept() -> None:
    assert render_text("über {x}", {"x": "ünï"}.get) == "über ünï"


def test_data_designer_double_braces_are_placeholders() -> None:
    # Before issue 35, "{{ channel }}" rendered silently as "{ channel }".
    assert references("Via {{ channel }} and {{tone}}; {{ answer.steps.0 }}") == [
        ("channel", ()), ("tone", ()), ("answer", ("steps", "0"))]
    assert render_text("Via {{ channel }}.", {"channel": "email"}.get) == "Via email."
    assert render_text("{{{x}}}", {"x": 1}.get) == "{1}"
    assert render_text('{{"k": "{{ x }}"}}', {"x": 2}.get) == '{"k": "2"}'
