"""Per-column statistics of merged records, accumulated one Arrow table at a time.

For every top-level column but ``_meta``: its type, nulls, and by kind: text -> empty
values and lengths (min, mean, max); numbers -> min, mean, max; text, integers and booleans
-> the distribution of values while there are at most ``MAX_DISTINCT`` of them; a judge
column -> a histogram of each score. From ``_meta``: prompt and completion tokens per LLM
column. Memory is bounded by the number of columns (value counts stop at
``MAX_DISTINCT``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pyarrow as pa
import pyarrow.compute as pc

MAX_DISTINCT = 20


def _count_values(array: pa.Array) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for item in pc.value_counts(array.drop_null()).to_pylist():
        key = item["values"]
        out[key if isinstance(key, str) else str(key).lower()
            if isinstance(key, bool) else str(key)] = int(item["counts"])
    return out


class _Column:
    def __init__(self) -> None:
        self.kind = ""
        self.rows = self.nulls = self.empty = 0
        self.length: List[float] = []  # min, sum, max
        self.number: List[float] = []
        self.counted = {"length": 0, "number": 0}
        self.values: Optional[Dict[str, int]] = {}
        self.scores: Dict[str, Dict[str, int]] = {}

    def add(self, array: pa.ChunkedArray, judge: bool) -> None:
        array = array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
        kind = array.type
        self.kind = self.kind if pa.types.is_null(kind) and self.kind else str(kind)
        self.rows += len(array)
        self.nulls += array.null_count
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            lengths = pc.utf8_length(array)
            self.empty += int(pc.sum(pc.equal(lengths, 0)).as_py() or 0)
            self._range("length", lengths)
        if pa.types.is_integer(kind) or pa.types.is_floating(kind):
            self._range("number", array)
        if self.values is not None and (pa.types.is_string(kind) or
                                        pa.types.is_integer(kind) or
                                        pa.types.is_boolean(kind)):
            head = _count_values(array.slice(0, 4 * MAX_DISTINCT))  # free text: stop early
            for key, count in (head if len(head) > MAX_DISTINCT else
                               _count_values(array)).items():
                self.values[key] = self.values.get(key, 0) + count
            if len(self.values) > MAX_DISTINCT:
                self.values = None
        elif not pa.types.is_null(kind):
            self.values = None
        if judge and pa.types.is_struct(kind):
            for field in kind:
                if pa.types.is_struct(field.type) and \
                        field.type.get_field_index("score") >= 0:
                    counts = self.scores.setdefault(field.name, {})
                    scores = pc.struct_field(pc.struct_field(array, field.name), "score")
                    for key, count in _count_values(scores).items():
                        counts[key] = counts.get(key, 0) + count

    def _range(self, name: str, array: pa.Array) -> None:
        valid = array.drop_null()
        if not len(valid):
            return
        low, high = pc.min_max(valid).values()
        total = float(pc.sum(valid).as_py() or 0)
        have: List[float] = getattr(self, name)
        if have:
            have[:] = [min(have[0], low.as_py()), have[1] + total, max(have[2], high.as_py())]
        else:
            have[:] = [low.as_py(), total, high.as_py()]
        self.counted[name] += len(valid)

    def summary(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"type": self.kind, "nulls": self.nulls}
        if self.length:
            out["empty"] = self.empty
            out["length"] = {"min": self.length[0], "max": self.length[2],
                             "mean": round(self.length[1] / self.counted["length"], 1)}
        if self.number:
            out["range"] = {"min": self.number[0], "max": self.number[2],
                            "mean": round(self.number[1] / self.counted["number"], 4)}
        # text is shown as a distribution only when values repeat (not free text)
        if self.values and (not self.length or
                            len(self.values) < max(2, (self.rows - self.nulls) // 2)):
            out["values"] = dict(sorted(self.values.items(), key=lambda kv: (-kv[1], kv[0])))
        if self.scores:
            out["scores"] = {name: dict(sorted(counts.items()))
                             for name, counts in self.scores.items()}
        return out


class ColumnStats:
    """Accumulates the statistics of every table it is given (``add``), then ``summary``."""

    def __init__(self, judges: Optional[List[str]] = None) -> None:
        self.judges = set(judges or [])
        self.columns: Dict[str, _Column] = {}
        self.tokens: Dict[str, Dict[str, int]] = {}
        self.records = 0

    def add(self, table: pa.Table) -> None:
        """Count ``table``'s rows into the statistics."""
        self.records += table.num_rows
        for name in table.column_names:
            if name == "_meta":
                self._tokens(table.column(name).combine_chunks())
                continue
            self.columns.setdefault(name, _Column()).add(table.column(name),
                                                         name in self.judges)

    def _tokens(self, meta: pa.Array) -> None:
        kind = meta.type
        if not pa.types.is_struct(kind) or kind.get_field_index("columns") < 0:
            return
        cells = pc.struct_field(meta, "columns")
        if not pa.types.is_struct(cells.type):
            return
        for column in cells.type:
            cell = pc.struct_field(cells, column.name)
            if not pa.types.is_struct(cell.type) or cell.type.get_field_index("usage") < 0:
                continue
            usage = pc.struct_field(cell, "usage")
            if not pa.types.is_struct(usage.type):
                continue
            sums = self.tokens.setdefault(column.name, {"prompt_tokens": 0,
                                                        "completion_tokens": 0})
            for key in sums:
                if usage.type.get_field_index(key) >= 0:
                    sums[key] += int(pc.sum(pc.struct_field(usage, key)).as_py() or 0)

    def summary(self) -> Dict[str, Any]:
        """``{"records", "columns": {name: stats}, "tokens": {column: {prompt_tokens,
        completion_tokens}}}``."""
        return {"records": self.records,
                "columns": {name: column.summary() for name, column in self.columns.items()},
                "tokens": self.tokens}
