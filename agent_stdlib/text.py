"""Untrusted text shown to a user: control characters made visible.

Logs and state files hold whatever a server, a client or a damaged file put there. A
server printing ``ESC [ 2 J`` or ``ESC ] 0 ; TITLE BEL`` must not clear the user's
screen or retitle the window through ``synthbatch status``. Every such text goes
through :func:`visible` before it is shown, in human output and in ``--json`` values
alike: C0 controls, DEL and C1 controls become escapes (``\\x1b``, ``\\x07``, ``\\x9b``;
``\\n``, ``\\r``, ``\\t`` for the common three) unless the caller keeps some (a log
printed to a terminal keeps its newlines and tabs). The printable rest of an escape
sequence (``[2J``) stays as it is: harmless text once its ESC is shown.

The agent applies it to the log tails it quotes in a failure reason; the control plane
applies it again to everything it prints (it does not trust files to be clean).

:func:`quoted` is how a message quotes a value it refuses: ``repr`` of the value, and of a
long one only a marked excerpt (its first ``QUOTE_LIMIT`` characters and its length), so
that a message stays short and building it costs nothing however long the value is.
"""

from __future__ import annotations

import re

CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
QUOTE_LIMIT = 60  # characters of a value a message quotes


def visible(text: str, keep: str = "") -> str:
    """``text`` with every control character not in ``keep`` shown as an escape."""
    if not CONTROL.search(text):
        return text

    def escape(match: re.Match[str]) -> str:
        char = match.group()
        if char in keep:
            return char
        return SHORT.get(char) or f"\\x{ord(char):02x}"

    return CONTROL.sub(escape, text)


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` for a message; longer than ``limit`` characters, a marked excerpt:
    ``'aaaa'... (excerpt: first 60 of 30000 characters)``."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}... (excerpt: first {limit} of {len(value)} characters)"
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... (excerpt: first {limit} of {len(text)} characters)"
