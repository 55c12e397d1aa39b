"""The recipe's expression language: a tokenizer, a recursive-descent parser and a pure
evaluator (never ``eval``/``exec``).

Grammar, loosest first (``docs/generator.md`` shows examples)::

    expr     := or ['if' or 'else' expr]        # a if cond else b
    or       := and {'or' and}
    and      := not {'and' not}
    not      := 'not' not | compare
    compare  := sum [('=='|'!='|'<'|'<='|'>'|'>='|'in'|'not' 'in') sum]
    sum      := product {('+'|'-') product}
    product  := unary {('*'|'/'|'//'|'%') unary}
    unary    := '-' unary | primary
    primary  := number | string | true | false | null | '[' [expr {',' expr}] ']'
              | name {'.' field} | function '(' [expr {',' expr}] ')' | '(' expr ')'

A name is a column, a seed field or ``index``; ``name.field`` walks into an object (or a
list by position) as templates do. ``and``/``or``/``not`` give booleans; ``null`` is false.
Values are JSON values; arithmetic is on numbers (``+`` also joins two texts or two lists),
ordering compares two numbers or two texts, ``==`` anything. Types are checked twice: at
plan time from what each column is (:func:`infer`), and on every value (:func:`evaluate`);
either names the 1-based character position.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import AgentError
from .template import lookup, show

KEYWORDS = ("and", "or", "not", "if", "else", "in", "true", "false", "null")
DTYPES = ("int", "float", "bool", "text", "json")
ANY, INT, FLOAT, BOOL, TEXT, LIST, NULL = "any", "int", "float", "bool", "text", "list", "null"
MAX_LENGTH = 4096  # characters of one expression
MAX_DEPTH = 64  # nesting of one expression (parentheses, not, minus)
MAX_TREE = 100  # depth of its syntax tree (operators in a row count too)
TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<number>\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>//|==|!=|<=|>=|[-+*/%<>().,\[\]])
""", re.VERBOSE)
FIELD = re.compile(r"[A-Za-z0-9_]+")
ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", "'": "'", '"': '"'}


class ExprError(AgentError, ValueError):
    """An expression that does not parse, names what is not there, or mixes types.

    ``position`` is the 1-based character the problem is at."""

    def __init__(self, position: int, message: str) -> None:
        super().__init__(f"position {position}: {message}")
        self.position, self.message = position, message


@dataclass(frozen=True)
class Node:
    """One node of the syntax tree: ``op`` is ``lit``, ``ref``, ``list``, ``call``,
    ``if``, ``and``, ``or``, ``not``, ``neg`` or a binary operator."""

    op: str
    pos: int  # 1-based
    args: Tuple[Any, ...] = ()
    depth: int = 1  # of the tree below and including this node


@dataclass(frozen=True)
class Token:
    """One token: its kind, its text and its 1-based position."""

    kind: str
    text: str
    pos: int


def tokenize(text: str) -> List[Token]:
    """The tokens of ``text``; ExprError at the first character that starts none."""
    if len(text) > MAX_LENGTH:
        raise ExprError(MAX_LENGTH + 1, f"longer than {MAX_LENGTH} characters")
    tokens, i = [], 0
    while i < len(text):
        match = TOKEN.match(text, i)
        if not match:
            char = text[i]
            hint = " (a string must be closed)" if char in "'\"" else ""
            raise ExprError(i + 1, f"unexpected {char!r}{hint}")
        kind = match.lastgroup or ""
        if kind != "space":
            word = match.group()
            tokens.append(Token("kw" if kind == "name" and word in KEYWORDS else kind,
                                word, i + 1))
        i = match.end()
    tokens.append(Token("end", "", len(text) + 1))
    return tokens


def _string(token: Token) -> str:
    out, body, i = [], token.text[1:-1], 0
    while i < len(body):
        if body[i] == "\\":
            if body[i + 1] not in ESCAPES:
                raise ExprError(token.pos + i + 1, f"unknown escape \\{body[i + 1]}")
            out.append(ESCAPES[body[i + 1]])
            i += 2
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens, self.at, self.depth = tokenize(text), 0, 0

    def peek(self, *texts: str) -> bool:
        token = self.tokens[self.at]
        return token.kind in ("op", "kw") and token.text in texts

    def take(self) -> Token:
        token = self.tokens[self.at]
        self.at += 1
        return token

    def expect(self, text: str) -> Token:
        if not self.peek(text):
            self.fail(f"expected {text!r}")
        return self.take()

    def fail(self, message: str) -> None:
        token = self.tokens[self.at]
        found = "the end" if token.kind == "end" else repr(token.text)
        raise ExprError(token.pos, f"{message}, found {found}")

    def node(self, op: str, pos: int, args: Tuple[Any, ...] = ()) -> Node:
        """A tree node; ExprError when the tree grows deeper than :data:`MAX_TREE`."""
        depth = 1 + max((a.depth for a in args if isinstance(a, Node)), default=0)
        if depth > MAX_TREE:
            raise ExprError(pos, f"more than {MAX_TREE} operations deep")
        return Node(op, pos, args, depth)

    def deeper(self) -> None:
        """One more level of nesting (ExprError past :data:`MAX_DEPTH`)."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExprError(self.tokens[self.at].pos, f"nested deeper than {MAX_DEPTH}")

    def expr(self) -> Node:
        self.deeper()
        value = self.binary(0)
        if self.peek("if"):
            pos = self.take().pos
            cond = self.binary(0)
            self.expect("else")
            value = self.node("if", pos, (cond, value, self.expr()))
        self.depth -= 1
        return value

    LEVELS: Tuple[Tuple[str, ...], ...] = (("or",), ("and",), ("not",),
                                           ("==", "!=", "<", "<=", ">", ">=", "in"),
                                           ("+", "-"), ("*", "/", "//", "%"))

    def binary(self, level: int) -> Node:
        if level == len(self.LEVELS):
            return self.unary()
        ops = self.LEVELS[level]
        if ops == ("not",):
            if self.peek("not"):
                pos = self.take().pos
                self.deeper()
                inner = self.binary(level)
                self.depth -= 1
                return self.node("not", pos, (inner,))
            return self.binary(level + 1)
        left = self.binary(level + 1)
        if level == 3:  # one comparison, not a chain
            negated = self.peek("not") and self.tokens[self.at + 1].text == "in"
            if self.peek(*ops) or negated:
                pos = self.take().pos
                op = "not in" if negated else self.tokens[self.at - 1].text
                if negated:
                    self.take()
                left = self.node(op, pos, (left, self.binary(level + 1)))
                if self.peek(*ops):
                    self.fail("comparisons do not chain (write 'a < b and b < c')")
            return left
        while self.peek(*ops):
            token = self.take()
            left = self.node(token.text, token.pos, (left, self.binary(level + 1)))
        return left

    def unary(self) -> Node:
        if self.peek("-"):
            pos = self.take().pos
            self.deeper()
            inner = self.unary()
            self.depth -= 1
            return self.node("neg", pos, (inner,))
        return self.primary()

    def items(self, close: str) -> Tuple[Node, ...]:
        out: List[Node] = []
        while not self.peek(close):
            out.append(self.expr())
            if not self.peek(close):
                self.expect(",")
        self.take()
        return tuple(out)

    def primary(self) -> Node:
        token = self.tokens[self.at]
        if token.kind == "number":
            self.take()
            text = token.text
            number = float(text) if any(c in text for c in ".eE") else int(text)
            if isinstance(number, float) and not math.isfinite(number):
                raise ExprError(token.pos, f"{text[:20]} is not a finite number")
            return self.node("lit", token.pos, (bounded(number, token.pos),))
        if token.kind == "string":
            self.take()
            return self.node("lit", token.pos, (_string(token),))
        if token.kind == "kw" and token.text in ("true", "false", "null"):
            self.take()
            return self.node("lit", token.pos, ({"true": True, "false": False}.get(token.text),))
        if self.peek("("):
            self.take()
            inner = self.expr()
            self.expect(")")
            return inner
        if self.peek("["):
            self.take()
            return self.node("list", token.pos, self.items("]"))
        if token.kind == "name":
            self.take()
            if self.peek("("):
                if token.text not in SIGNATURES:
                    raise ExprError(token.pos, f"unknown function {token.text}() (have: "
                                    f"{', '.join(sorted(SIGNATURES))})")
                self.take()
                args = self.items(")")
                _arity(token.text, len(args), token.pos)
                return self.node("call", token.pos, (token.text,) + args)
            path: List[str] = []
            while self.peek("."):
                self.take()
                part = self.take()
                if part.kind not in ("name", "number", "kw") or not FIELD.fullmatch(part.text):
                    raise ExprError(part.pos, "expected a field name after '.'")
                path.append(part.text)
            return self.node("ref", token.pos, (token.text, tuple(path)))
        self.fail("expected a value")
        raise AssertionError  # fail() raised


def parse(text: str) -> Node:
    """The syntax tree of ``text``; ExprError with the position if it does not parse."""
    parser = _Parser(text)
    if parser.tokens[0].kind == "end":
        raise ExprError(1, "empty expression")
    tree = parser.expr()
    if parser.tokens[parser.at].kind != "end":
        parser.fail("expected an operator or the end")
    return tree


def references(tree: Node) -> List[Tuple[str, Tuple[str, ...], int]]:
    """(name, field path, position) of every name ``tree`` uses, in order."""
    if tree.op == "ref":
        return [(tree.args[0], tree.args[1], tree.pos)]
    if tree.op == "lit":
        return []
    return [r for arg in tree.args if isinstance(arg, Node) for r in references(arg)]


# ---- values ------------------------------------------------------------------------------

def kind(value: Any) -> str:
    """The expression type of a JSON value."""
    if value is None:
        return NULL
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int):
        return INT
    if isinstance(value, float):
        return FLOAT
    if isinstance(value, str):
        return TEXT
    if isinstance(value, list):
        return LIST
    return "object"


NUMBERS = (INT, FLOAT)
# name -> (least, most arguments (-1: any), argument types (None: any), result type)
SIGNATURES: Dict[str, Tuple[int, int, Optional[Tuple[str, ...]], str]] = {
    "len": (1, 1, (TEXT, LIST), INT), "lower": (1, 1, (TEXT,), TEXT),
    "upper": (1, 1, (TEXT,), TEXT), "strip": (1, 1, (TEXT,), TEXT),
    "round": (1, 2, NUMBERS, ANY), "min": (1, -1, (INT, FLOAT, TEXT), ANY),
    "max": (1, -1, (INT, FLOAT, TEXT), ANY), "abs": (1, 1, NUMBERS, ANY),
    "str": (1, 1, None, TEXT), "int": (1, 1, (INT, FLOAT, BOOL, TEXT), INT),
    "float": (1, 1, (INT, FLOAT, BOOL, TEXT), FLOAT), "concat": (1, -1, None, TEXT),
    "join": (2, 2, None, TEXT), "contains": (2, 2, None, BOOL),
}


def _arity(name: str, count: int, pos: int) -> None:
    least, most = SIGNATURES[name][:2]
    if count < least or (most >= 0 and count > most):
        want = str(least) if least == most else (f"{least} or more" if most < 0
                                                  else f"{least} to {most}")
        raise ExprError(pos, f"{name}() takes {want} argument(s), got {count}")


def _number(value: Any, name: str, pos: int) -> float:
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            raise ExprError(pos, f"{name}(): {value[:40]!r} is not a number") from None
    return float(value)


def _int(value: Any, pos: int) -> int:
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            number = _number(value, "int", pos)
    else:
        number = float(value)
    if not math.isfinite(number):
        raise ExprError(pos, "int(): not a finite number")
    return int(number)


def _call(name: str, args: List[Any], pos: int) -> Any:
    allowed = SIGNATURES[name][2]
    checked = args[:1] if name in ("join", "contains") else args
    if name in ("min", "max") and len(args) == 1 and isinstance(args[0], list):
        checked = args[0]
    for value in checked:
        if allowed is not None and kind(value) not in allowed:
            raise ExprError(pos, f"{name}() does not take {_shown_kind(value)}")
    if name == "len":
        return len(args[0])
    if name in ("lower", "upper", "strip"):
        return getattr(args[0], name)()
    if name == "round":
        digits = _int(args[1], pos) if len(args) > 1 else 0
        return bounded(round(args[0]) if len(args) == 1 else round(args[0], digits), pos)
    if name in ("min", "max"):
        items = args[0] if len(args) == 1 and isinstance(args[0], list) else args
        kinds = {"number" if kind(v) in NUMBERS else kind(v) for v in items}
        if len(kinds) != 1:
            raise ExprError(pos, f"{name}() needs numbers or texts, all of one kind")
        return (min if name == "min" else max)(items)
    if name == "abs":
        return bounded(abs(args[0]), pos)
    if name == "str":
        return show(args[0])
    if name == "int":
        return bounded(_int(args[0], pos), pos)
    if name == "float":
        number = _number(args[0], "float", pos)
        if not math.isfinite(number):
            raise ExprError(pos, "float(): not a finite number")
        return number
    if name == "concat":
        return "".join(show(v) for v in args)
    if name == "join":
        if not isinstance(args[0], list):
            raise ExprError(pos, f"join() takes a list first, not {_shown_kind(args[0])}")
        return show(args[1]).join(show(v) for v in args[0])
    if isinstance(args[0], str):  # contains
        if not isinstance(args[1], str):
            raise ExprError(pos, f"contains() of a text takes a text, not "
                            f"{_shown_kind(args[1])}")
        return args[1] in args[0]
    if isinstance(args[0], list):
        return args[1] in args[0]
    raise ExprError(pos, f"contains() takes a text or a list, not {_shown_kind(args[0])}")


def _shown_kind(value: Any) -> str:
    return {NULL: "null", LIST: "a list", "object": "an object", INT: "an int",
            FLOAT: "a float", BOOL: "a bool", TEXT: "a text"}[kind(value)]


def _arith(op: str, left: Any, right: Any, pos: int) -> Any:
    lk, rk = kind(left), kind(right)
    if op == "+" and lk == rk and lk in (TEXT, LIST):
        return left + right
    if lk not in NUMBERS or rk not in NUMBERS:
        raise ExprError(pos, f"cannot apply {op!r} to {_shown_kind(left)} and "
                        f"{_shown_kind(right)}")
    if op in ("/", "//", "%") and right == 0:
        raise ExprError(pos, "division by zero")
    result = {"+": lambda: left + right, "-": lambda: left - right,
              "*": lambda: left * right, "/": lambda: left / right,
              "//": lambda: left // right, "%": lambda: left % right}[op]()
    if isinstance(result, float) and not math.isfinite(result):
        raise ExprError(pos, f"{op!r} overflows")
    return bounded(result, pos)


def bounded(value: Any, pos: int) -> Any:
    """``value`` unless it is an integer beyond 64 bits (what a record's JSON and Parquet
    hold): ExprError."""
    if isinstance(value, int) and not isinstance(value, bool) and not (
            -(1 << 63) <= value < (1 << 63)):
        raise ExprError(pos, "an integer beyond 64 bits")
    return value


def _compare(op: str, left: Any, right: Any, pos: int) -> bool:
    if op == "==":  # true and 1 are different values, 1 and 1.0 the same
        same = kind(left) == kind(right) or (kind(left) in NUMBERS and kind(right) in NUMBERS)
        return bool(same and left == right)
    if op == "!=":
        return not _compare("==", left, right, pos)
    if op in ("in", "not in"):
        return _call("contains", [right, left], pos) != (op == "not in")
    lk, rk = kind(left), kind(right)
    if not (lk in NUMBERS and rk in NUMBERS or lk == rk == TEXT):
        raise ExprError(pos, f"cannot order {_shown_kind(left)} and {_shown_kind(right)} "
                        f"with {op!r}")
    return {"<": left < right, "<=": left <= right, ">": left > right,
            ">=": left >= right}[op]


def truth(value: Any) -> bool:
    """Whether a value counts as true (null, false, 0, "" and [] do not)."""
    return bool(value)


def evaluate(tree: Node, value_of: Callable[[str], Any]) -> Any:
    """The value of ``tree`` with ``value_of(name)`` for names; ExprError on a type error
    or a value Python cannot compute (an integer too long to print, an overflow)."""
    try:
        return _evaluate(tree, value_of)
    except ExprError:
        raise
    except (ArithmeticError, ValueError, TypeError, RecursionError) as err:
        raise ExprError(tree.pos, f"cannot compute it: {type(err).__name__}: "
                        f"{str(err)[:120]}") from None


def _evaluate(tree: Node, value_of: Callable[[str], Any]) -> Any:
    op, args = tree.op, tree.args
    if op == "lit":
        return args[0]
    if op == "ref":
        return lookup(value_of(args[0]), args[1])
    if op == "list":
        return [_evaluate(a, value_of) for a in args]
    if op == "call":
        return _call(args[0], [_evaluate(a, value_of) for a in args[1:]], tree.pos)
    if op == "if":
        return _evaluate(args[1] if truth(_evaluate(args[0], value_of)) else args[2], value_of)
    if op == "and":
        return truth(_evaluate(args[0], value_of)) and truth(_evaluate(args[1], value_of))
    if op == "or":
        return truth(_evaluate(args[0], value_of)) or truth(_evaluate(args[1], value_of))
    if op == "not":
        return not truth(_evaluate(args[0], value_of))
    if op == "neg":
        value = _evaluate(args[0], value_of)
        if kind(value) not in NUMBERS:
            raise ExprError(tree.pos, f"cannot negate {_shown_kind(value)}")
        return bounded(-value, tree.pos)
    left, right = _evaluate(args[0], value_of), _evaluate(args[1], value_of)
    if op in ("+", "-", "*", "/", "//", "%"):
        return _arith(op, left, right, tree.pos)
    return _compare(op, left, right, tree.pos)


def convert(value: Any, dtype: str) -> Any:
    """``value`` as the declared type (``text``: as a template inserts it); ValueError if
    it is not one (a float with a fraction is not an int: use ``round()`` or ``int()``)."""
    if dtype == "json":
        return value
    if dtype == "text":
        return show(value)
    if dtype == "bool":
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        if kind(value) in (BOOL, INT, FLOAT):
            return bool(value)
        raise ValueError(f"{_shown_kind(value)} {show(value)[:40]!r} is not a bool")
    number: Any = value
    if isinstance(value, str):
        try:
            number = int(value.strip()) if dtype == "int" else float(value.strip())
        except ValueError:
            try:
                number = float(value.strip())
            except ValueError:
                number = None
    if kind(number) not in (INT, FLOAT, BOOL) or not math.isfinite(number):
        raise ValueError(f"{_shown_kind(value)} {show(value)[:40]!r} is not "
                         f"{'an int' if dtype == INT else 'a float'}")
    if dtype == "float":
        return float(number)
    if number != int(number):
        raise ValueError(f"{show(value)[:40]} is not an int (use round() or int())")
    if not -(1 << 63) <= int(number) < (1 << 63):
        raise ValueError(f"{show(value)[:40]} is beyond 64 bits")
    return int(number)


# ---- plan-time types ---------------------------------------------------------------------

def _join(a: str, b: str) -> str:
    if a == b:
        return a
    if {a, b} == {INT, FLOAT}:
        return FLOAT
    return ANY


def infer(tree: Node, type_of: Callable[[str, Tuple[str, ...]], str]) -> str:
    """The type ``tree`` gives (``any`` when only the values can tell), from
    ``type_of(name, path)``; ExprError where the types can never fit."""
    op, args = tree.op, tree.args
    if op == "lit":
        return kind(args[0])
    if op == "ref":
        return type_of(args[0], args[1])
    if op == "list":
        for arg in args:
            infer(arg, type_of)
        return LIST
    if op == "call":
        name = args[0]
        types = [infer(a, type_of) for a in args[1:]]
        allowed = SIGNATURES[name][2]
        checked = types[:1] if name in ("join", "contains") else types
        for t, arg in zip(checked, args[1:]):
            if allowed is not None and t not in (ANY,) + allowed and not (
                    name in ("min", "max") and len(types) == 1 and t == LIST):
                raise ExprError(arg.pos, f"{name}() does not take {_type_word(t)}")
        if name == "join" and types[0] not in (ANY, LIST):
            raise ExprError(args[1].pos, f"join() takes a list first, not {_type_word(types[0])}")
        if name == "contains" and types[0] not in (ANY, TEXT, LIST):
            raise ExprError(args[1].pos, f"contains() takes a text or a list, not "
                            f"{_type_word(types[0])}")
        result = SIGNATURES[name][3]
        if name == "abs" or (name == "round" and len(types) == 2):
            return types[0] if types[0] in NUMBERS else ANY
        if name == "round":
            return INT if types[0] in NUMBERS else ANY
        if name in ("min", "max"):
            joined = types[0]
            for t in types[1:]:
                joined = _join(joined, t)
            return joined if joined in (INT, FLOAT, TEXT) else ANY
        return result
    if op == "if":
        infer(args[0], type_of)
        return _join(infer(args[1], type_of), infer(args[2], type_of))
    if op in ("and", "or", "not"):
        for arg in args:
            infer(arg, type_of)
        return BOOL
    if op == "neg":
        t = infer(args[0], type_of)
        if t not in (ANY,) + NUMBERS:
            raise ExprError(tree.pos, f"cannot negate {_type_word(t)}")
        return t
    lt, rt = infer(args[0], type_of), infer(args[1], type_of)
    if op in ("+", "-", "*", "/", "//", "%"):
        if ANY in (lt, rt):
            return ANY if op == "+" or op in ("*", "-") else (FLOAT if op == "/" else ANY)
        if op == "+" and lt == rt and lt in (TEXT, LIST):
            return lt
        if lt not in NUMBERS or rt not in NUMBERS:
            raise ExprError(tree.pos, f"cannot apply {op!r} to {_type_word(lt)} and "
                            f"{_type_word(rt)}")
        return FLOAT if op == "/" or FLOAT in (lt, rt) else INT
    if op in ("<", "<=", ">", ">=") and ANY not in (lt, rt) and not (
            lt in NUMBERS and rt in NUMBERS or lt == rt == TEXT):
        raise ExprError(tree.pos, f"cannot order {_type_word(lt)} and {_type_word(rt)} "
                        f"with {op!r}")
    if op in ("in", "not in") and rt not in (ANY, TEXT, LIST):
        raise ExprError(tree.pos, f"{op!r} needs a text or a list on its right, not "
                        f"{_type_word(rt)}")
    if op in ("in", "not in") and rt == TEXT and lt not in (ANY, TEXT):
        raise ExprError(tree.pos, f"{op!r} a text needs a text on its left, not "
                        f"{_type_word(lt)}")
    return BOOL


def _type_word(t: str) -> str:
    return {ANY: "any value", NULL: "null", LIST: "a list", INT: "an int", FLOAT: "a float",
            BOOL: "a bool", TEXT: "a text"}.get(t, t)


def fits(result: str, dtype: str) -> Optional[str]:
    """Why an expression of type ``result`` can never be ``dtype`` (None: it can)."""
    if dtype in ("json", "text") or result == ANY:
        return None
    if result in (LIST, NULL) or (dtype == BOOL and result == FLOAT):
        article = "an" if dtype == INT else "a"
        return f"it gives {_type_word(result)}, which is never {article} {dtype}"
    return None


def value_type(values: Sequence[Any]) -> str:
    """The type shared by ``values`` (``any`` if they differ or are empty)."""
    kinds = {kind(v) for v in values}
    if len(kinds) == 1:
        return kinds.pop()
    return FLOAT if kinds == {INT, FLOAT} else ANY
