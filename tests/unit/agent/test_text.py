"""Untrusted text made visible (``agent_stdlib.text``) and the CLI's output edge."""

from __future__ import annotations

import io
import json

import pytest

from synthbatch.agent_stdlib.allocation.supervisor import tail
from synthbatch.agent_stdlib.text import CONTROL, visible
from synthbatch.control.cli.output import VisibleStream, emit_json, shown
from synthbatch.control.errors import one_line


@pytest.mark.parametrize("text, expected", [
    ("\x1b[2J\x1b]0;TITLE\x07", "\\x1b[2J\\x1b]0;TITLE\\x07"),
    ("\x9b2J \x85 \x7f \x00", "\\x9b2J \\x85 \\x7f \\x00"),  # C1, DEL, NUL
    ("a\nb\tc\rd", "a\\nb\\tc\\rd"),
    ("plain, UTF-8 \u2713 and \u00e9", "plain, UTF-8 \u2713 and \u00e9"),
    ("\\x1b stays as it is", "\\x1b stays as it is"),
])
def test_visible_escapes_control_characters(text: str, expected: str) -> None:
    assert visible(text) == expected


def test_visible_keeps_what_the_caller_keeps_and_is_idempotent() -> None:
    assert visible("a\n\tb\x1b", keep="\n\t") == "a\n\tb\\x1b"
    every = "".join(chr(c) for c in range(0x00, 0x250))
    once = visible(every)
    assert not CONTROL.search(once) and visible(once) == once


def test_one_line_makes_reasons_visible() -> None:
    assert one_line("server exited\n\x1b[2Jboom\x07") == "server exited \\x1b[2Jboom\\x07"


def test_json_values_and_keys_are_made_visible() -> None:
    data = {"reason\x1b": ["a\x1bb", {"n": 1, "t": "x\x07\n"}], "ok": None}
    assert shown(data) == {"reason\\x1b": ["a\\x1bb", {"n": 1, "t": "x\\x07\n"}], "ok": None}
    assert "\\u001b" not in json.dumps(shown(data))


@pytest.mark.parametrize("char", [chr(c) for c in (*range(0x00, 0x20), *range(0x7f, 0xa0))])
def test_emit_json_never_prints_a_control_character_a_json_reader_would_decode(
        char: str, capsys: pytest.CaptureFixture) -> None:
    emit_json({"reason": f"a{char}b", "n": [1]})
    value = json.loads(capsys.readouterr().out)["reason"]
    assert value == (f"a{char}b" if char in "\n\t" else f"a{visible(char)}b")


def test_visible_stream_decodes_across_writes_and_shows_bad_bytes() -> None:
    out = io.BytesIO()
    stream = VisibleStream(out)
    data = "\u2713\x1b[0m\n".encode() + b"\xff"
    for i in range(len(data)):  # one byte per write: a character split across writes
        stream.write(data[i:i + 1])
    stream.write(b"\xe2\x9c")  # a torn last character
    stream.flush()
    assert out.getvalue().decode() == "\u2713\\x1b[0m\n\\xff\\xe2\\x9c"


def test_agent_log_tail_is_one_visible_line(tmp_path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"starting\n\x1b[2J\x1b]0;TITLE\x07crash\n\xc2\x9b\xff\n")  # U+009B, a bad byte
    assert tail(log) == "starting | \\x1b[2J\\x1b]0;TITLE\\x07crash | \\x9b\ufffd"
