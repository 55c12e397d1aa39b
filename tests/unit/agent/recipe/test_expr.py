"""The expression language: what it computes, the types it checks at plan time and on
values, the position of every problem, and that it runs nothing but itself."""

from __future__ import annotations

from typing import Any, Dict

import pytest

from synthbatch.agent_stdlib.recipe.expr import ExprError, convert, evaluate, infer, parse

VALUES: Dict[str, Any] = {"n": 4, "cat": "books", "x": 2.5, "s": " Hi ", "l": [1, 2, 3],
                          "o": {"a": {"b": 7}}, "none": None}
TYPES = {"n": "int", "cat": "text", "x": "float", "l": "list"}


def value(text: str) -> Any:
    return evaluate(parse(text), VALUES.get)


@pytest.mark.parametrize("text,expected", [
    ("n * 2", 8), ("n / 2", 2.0), ("n // 3", 1), ("n % 3", 1), ("-n + 1", -3),
    ("(1 + 2) * 3", 9), ("1 + 2 * 3", 7), ("2.5e1", 25.0), ("x + n", 6.5),
    ("cat == 'books'", True), ("n >= 4 and cat != \"x\"", True), ("not n", False),
    ("n > 5 or none", False), ("not none", True), ("true == 1", False), ("1 == 1.0", True),
    ("'big' if n > 3 else 'small'", "big"), ("1 if false else 2 if true else 3", 2),
    ("len(s)", 4), ("lower(strip(s))", "hi"), ("upper(cat)", "BOOKS"), ("round(x)", 2),
    ("round(3.14159, 2)", 3.14), ("min(3, 1.5)", 1.5), ("max(l)", 3), ("abs(-3)", 3),
    ("str(n)", "4"), ("str(l)", "[1,2,3]"), ("int('7')", 7), ("int(2.9)", 2),
    ("float('2.5')", 2.5), ("concat(cat, '-', n, none)", "books-4"),
    ("join(l, ', ')", "1, 2, 3"), ("contains(cat, 'oo')", True), ("2 in l", True),
    ("'z' not in cat", True), ("cat in ['books', 'games']", True), ("o.a.b + 1", 8),
    ("l.1", 2), ("o.missing", None), ("'it\\'s\\n'", "it's\n"), ("cat + 's'", "bookss"),
])
def test_expressions_compute(text: str, expected: Any) -> None:
    assert value(text) == expected and type(value(text)) is type(expected)


@pytest.mark.parametrize("text,message", [
    ("n *", "position 4: expected a value, found the end"),
    ("n $ 2", "position 3: unexpected '$'"),
    ("'abc", "position 1: unexpected \"'\" (a string must be closed)"),
    ("1 < n < 3", "position 7: comparisons do not chain (write 'a < b and b < c'), "
                  "found '<'"),
    ("(n", "position 3: expected ')', found the end"),
    ("n n", "position 3: expected an operator or the end, found 'n'"),
    ("", "position 1: empty expression"),
    ("o.", "position 3: expected a field name after '.'"),
    ("__import__('os')", "position 1: unknown function __import__() (have: abs, concat, "),
    ("len(1, 2)", "position 1: len() takes 1 argument(s), got 2"),
    ("'a\\q'", "position 3: unknown escape \\q"),
    ("99999999999999999999", "position 1: an integer beyond 64 bits"),
    ("1e999", "position 1: 1e999 is not a finite number"),
    ("(" * 70 + "1" + ")" * 70, "position 65: nested deeper than 64"),
    ("-" * 4000 + "1", "position 65: nested deeper than 64"),
    ("not " * 1000 + "n", "position 257: nested deeper than 64"),
    ("n + " * 1100 + "n", "position 4097: longer than 4096 characters"),
    ("n + " * 200 + "n", "position 399: more than 100 operations deep"),
])
def test_bad_expressions_name_the_position(text: str, message: str) -> None:
    with pytest.raises(ExprError) as err:
        parse(text)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("text,message", [
    ("n + cat", "position 3: cannot apply '+' to an int and a text"),
    ("1 / (n - 4)", "position 3: division by zero"),
    ("len(n)", "position 1: len() does not take an int"),
    ("cat < n", "position 5: cannot order a text and an int with '<'"),
    ("none > 1", "position 6: cannot order null and an int with '>'"),
    ("-cat", "position 1: cannot negate a text"),
    ("max(1, 'a')", "position 1: max() needs numbers or texts, all of one kind"),
    ("int('x')", "position 1: int(): 'x' is not a number"),
    ("9223372036854775807 + n", "position 21: an integer beyond 64 bits"),
    ("round(1e30)", "position 1: an integer beyond 64 bits"),
    ("1e308 * 10", "position 7: '*' overflows"),
    ("str(cat * 2)", "position 9: cannot apply '*' to a text and an int"),
    ("1 in n", "position 3: contains() takes a text or a list, not an int"),
])
def test_type_errors_on_values_name_the_position(text: str, message: str) -> None:
    with pytest.raises(ExprError) as err:
        value(text)
    assert str(err.value).startswith(message)


def typed(text: str) -> str:
    return infer(parse(text), lambda name, path: "any" if path else TYPES.get(name, "any"))


@pytest.mark.parametrize("text,result", [
    ("n * 2", "int"), ("n / 2", "float"), ("x if n > 1 else n", "float"),
    ("upper(cat)", "text"), ("round(x)", "int"), ("max(n, x)", "float"),
    ("seed_field * 2", "any"), ("n > 1 and cat", "bool"), ("len(l)", "int"),
])
def test_plan_time_types(text: str, result: str) -> None:
    assert typed(text) == result


@pytest.mark.parametrize("text,message", [
    ("n + cat", "position 3: cannot apply '+' to an int and a text"),
    ("len(n)", "position 5: len() does not take an int"),
    ("cat >= 2", "position 5: cannot order a text and an int with '>='"),
    ("lower(l)", "position 7: lower() does not take a list"),
    ("n in cat", "position 3: 'in' a text needs a text on its left, not an int"),
])
def test_plan_time_type_errors(text: str, message: str) -> None:
    with pytest.raises(ExprError) as err:
        typed(text)
    assert str(err.value) == message


@pytest.mark.parametrize("raw,dtype,expected", [
    ("4", "int", 4), ("4.0", "int", 4), (8.0, "int", 8), (True, "int", 1),
    ("2.5", "float", 2.5), (3, "float", 3.0), ("true", "bool", True), (0, "bool", False),
    (8, "text", "8"), ({"a": [1]}, "text", '{"a":[1]}'), ([1], "json", [1]),
])
def test_declared_types(raw: Any, dtype: str, expected: Any) -> None:
    assert convert(raw, dtype) == expected and type(convert(raw, dtype)) is type(expected)


@pytest.mark.parametrize("raw,dtype", [(4.5, "int"), ("x", "float"), (None, "int"), (1e30, "int"),
                                       ([1], "float"), ("yes", "bool"), (float("inf"), "int")])
def test_values_the_declared_type_cannot_hold(raw: Any, dtype: str) -> None:
    with pytest.raises(ValueError):
        convert(raw, dtype)
