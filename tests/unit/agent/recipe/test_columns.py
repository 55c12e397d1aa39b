"""The recipe's graph: order, cycles, unknown names, fields of values."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pytest

from synthbatch.agent_stdlib.recipe.columns import ColumnError, Node, analyze


def col(name: str, kind: str, **params: Any) -> Node:
    return Node(name, kind, params)


QA = [
    col("grade", "llm-judge", prompt="Q: {question}\nA: {answer.answer}",
        scores=[{"name": "correct", "options": {"1": "yes", "0": "no"}}]),
    col("answer", "llm-structured", prompt="Answer: {question}",
        schema={"type": "object", "properties": {"answer": {"type": "string"}}}),
    col("question", "llm-text", system="You write {level} questions.",
        prompt="About {topic}, number {index}."),
    col("level", "category", values=["a", "b"]),
    col("sub", "subcategory", category="level", values={"a": ["x"], "b": ["y"]}),
    col("summary", "expression", template="{grade.correct.score}: {sub}"),
]


def names(order: List[int], nodes: List[Node]) -> List[str]:
    return [nodes[i].name for i in order]


def test_order_puts_every_column_after_what_it_uses() -> None:
    graph = analyze(QA, seed_fields=["topic"])
    order = names(graph.order, QA)
    for i, used in enumerate(graph.inputs):
        for name in used:
            if name in order:
                assert order.index(name) < order.index(QA[i].name)
    assert graph.inputs[2] == ["level", "topic", "index"]
    assert graph.seed_fields == ["topic"]


def test_unknown_seed_file_takes_undefined_names_as_seed_fields() -> None:
    assert analyze(QA, None, has_seed=True).seed_fields == ["topic"]


def problem(nodes: List[Node], seed: Optional[List[str]] = None) -> str:
    with pytest.raises(ColumnError) as err:
        analyze(nodes, seed_fields=seed)
    return str(err.value)


def test_unknown_names_are_named_with_what_exists() -> None:
    nodes = [col("level", "category", values=["a"]),
             col("q", "llm-text", prompt="{level} about {topc}")]
    assert problem(nodes, ["topic"]) == ("columns[1].prompt: unknown column {topc} "
                                         "(have: index, level, q, topic)")
    assert problem([col("q", "llm-text", prompt="{nope.x}")]) == (
        "columns[0].prompt: unknown column {nope.x} (have: index, q)")


def test_cycles_are_named_from_their_first_column() -> None:
    nodes = [col("a", "llm-text", prompt="{b}"), col("b", "expression", template="{c}"),
             col("c", "llm-text", system="{a}", prompt="x")]
    assert problem(nodes) == "columns[0].prompt: cycle: a -> b -> c -> a"
    assert problem([col("a", "expression", template="{a}")]) == \
        "columns[0].template: cycle: a -> a"


@pytest.mark.parametrize("template,message", [
    ("{level.x}", "level is a category value without fields"),
    ("{answer.answr}", "answer has no field 'answr' (its schema has: answer)"),
    ("{grade.wrong}", "grade has no score 'wrong' (have: correct)"),
    ("{grade.correct.why}", "a score has only score and reasoning, not 'why'"),
    ("{index.x}", "index is the record number; it has no fields"),
])
def test_fields_must_exist(template: str, message: str) -> None:
    nodes = QA[:4] + [col("e", "expression", template=template)]
    assert problem(nodes, ["topic"]) == f"columns[4].template: {message}"


def test_names_must_be_unique_and_not_clash() -> None:
    base: Dict[str, Any] = {"values": ["a"]}
    assert problem([col("a", "category", **base), col("a", "category", **base)]) == \
        "columns[1].name: 'a' is already the name of columns[0]"
    assert problem([col("index", "category", **base)]) == \
        "columns[0].name: 'index' is the record index"
    assert problem([col("topic", "category", **base)], ["topic"]) == \
        "columns[0].name: 'topic' is also a field of the seed data"


def test_a_bad_template_names_its_field() -> None:
    assert problem([col("q", "llm-text", prompt="{x")]).startswith(
        "columns[0].prompt: bad placeholder {x")


def test_column_logic_names_are_dependencies_but_a_constraint_s_own_is_not() -> None:
    nodes = [col("end", "integer", low=0, high=9, constraints=["end > start"],
                 conditional_params={"kind == 'a'": {"high": 5}}),
             col("start", "integer", low=0, high=9),
             col("kind", "category", values=["a", "b"]),
             col("note", "expression", expr="str(end)", skip_when="index % 2 == 0")]
    graph = analyze(nodes)
    assert graph.inputs == [["kind", "start"], [], [], ["end", "index"]]
    assert names(graph.order, nodes)[-2:] == ["end", "note"]


@pytest.mark.parametrize("node,message", [
    (col("x", "expression", expr="y +"), "columns[0].expr: position 4: expected a value"),
    (col("x", "expression", expr="y + 1"), "columns[0].expr: position 1: unknown column y "
                                           "(have: index, x)"),
    (col("x", "expression", template="{index}", expr="1"),
     "columns[0].expr: give either template or expr"),
    (col("x", "llm-text", model="m", prompt="p", constraints=["x != ''"]),
     "columns[0].constraints: only a sampler column has constraints (this is llm-text)"),
    (col("x", "bernoulli", p=0.0, constraints=["x"]),
     "columns[0].constraints[0]: no value of x can meet 'x' (it draws from 1 value(s))"),
    (col("x", "integer", low=0, high=3, skip_when="x > 1"),
     "columns[0].skip_when: cycle: x -> x"),
])
def test_bad_column_logic_names_the_column_and_field(node: Node, message: str) -> None:
    assert problem([node]).startswith(message)
