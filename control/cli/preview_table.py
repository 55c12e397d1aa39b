"""``synthbatch preview``'s compact view: one row per record, long text cut, ``_meta``
hidden (``--json`` prints everything); :class:`Rows` prints the rows as records arrive.
Every value is untrusted text: control characters are shown as escapes
(:func:`agent_stdlib.text.visible`)."""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Optional, Sequence

from synthbatch.agent_stdlib.text import visible

CELL_CHARS = 40  # characters of a value a row shows
HIDDEN = ("index", "_meta", "_error")


def cell_text(value: Any, width: int = CELL_CHARS) -> str:
    """One value on one line, at most ``width`` characters (``...`` marks a cut)."""
    if value is None:
        text = "-"
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    text = visible(" ".join(text.split()))
    return text if len(text) <= width else text[:width - 3] + "..."


def columns_of(records: Sequence[Dict[str, Any]]) -> List[str]:
    """The record fields shown, in the records' own order (``index`` first, ``_meta``
    hidden, ``_error`` last as ``error``)."""
    names: List[str] = []
    for record in records:
        names += [k for k in record if k not in HIDDEN and k not in names]
    return names


def table(records: Sequence[Dict[str, Any]], width: int = CELL_CHARS) -> List[str]:
    """The header and one row per record, columns aligned."""
    names = columns_of(records)
    errors = any(isinstance(r.get("_error"), dict) for r in records)
    header = ["index", *names] + (["error"] if errors else [])
    rows = []
    for record in records:
        row = [cell_text(record.get("index"), width)]
        row += [cell_text(record.get(n), width) for n in names]
        if errors:
            error = record.get("_error")
            row.append(cell_text(f"{error.get('column')}: {error.get('message')}"
                                 if isinstance(error, dict) else None, width))
        rows.append(row)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
            for r in [header, *rows]]


class Rows:
    """The table streamed: the header and column widths come from the first record, then
    one row per record as it arrives (``emit`` prints a line); a later record's longer
    value widens nothing, and a record's error follows its row."""

    def __init__(self, emit: Callable[[str], None], width: int = CELL_CHARS) -> None:
        self.emit, self.width = emit, width
        self.names: Optional[List[str]] = None
        self.widths: List[int] = []

    def __call__(self, record: Dict[str, Any]) -> None:
        """Print ``record``'s row (after the header, for the first)."""
        cells = [cell_text(record.get("index"), self.width)]
        if self.names is None:
            self.names = columns_of([record])
            cells += [cell_text(record.get(n), self.width) for n in self.names]
            header = ["index", *self.names]
            self.widths = [max(len(h), len(c)) for h, c in zip(header, cells)]
            self.emit(self._line(header))
        else:
            cells += [cell_text(record.get(n), self.width) for n in self.names]
        error = record.get("_error")
        line = self._line(cells)
        if isinstance(error, dict):
            line += "  error: " + cell_text(f"{error.get('column')}: "
                                            f"{error.get('message')}", self.width * 2)
        self.emit(line)

    def _line(self, cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, self.widths)).rstrip()
