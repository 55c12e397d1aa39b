"""What one shard of a Data Designer run must produce (pure, standard library only).

The ``dd`` role (:mod:`agent_stdlib.client.data_designer`) runs a NeMo Data Designer config
for the shard's record range. The rules it follows are here, without Data Designer, so they
are unit-tested on their own:

* **model aliases** (:func:`resolve_models`): each Data Designer model alias a column uses
  is served by the deployment of the same alias, or the one ``[client.models]`` maps it to;
  an alias no deployment serves, a mapping for an alias the config does not define and a
  deployment no column uses are problems (one line each);
* **seed rows** (:func:`shard_seed_rows`): record ``i`` of the run reads the seed row an
  unsharded Data Designer run would give it with ``ordered`` sampling, row
  ``start + i mod size`` of the selected range, so the seed is partitioned by the shard's
  record range; with ``shuffle`` the shard's rows are permuted among its own records by a
  generator seeded with the shard's offset (deterministic, repeatable on resume);
* **renumbering** (:func:`record_line`): Data Designer numbers the rows of every run from 0,
  so the adapter passes the global record index through the seed dataset in
  :data:`INDEX_COLUMN` and writes it as the record's top-level ``"index"`` (a row Data
  Designer dropped leaves its index missing; a later pass generates only those);
* **JSON values** (:func:`plain`): what pyarrow hands over made JSON-safe (NaN -> null,
  dates as ISO text, bytes as base64).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
import random
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

INDEX_COLUMN = "_synthbatch_index"  # the global record index, carried through the seed
RESERVED_COLUMNS = ("index", INDEX_COLUMN)


def resolve_models(defined: Sequence[str], used: Mapping[str, Sequence[str]],
                   mapping: Mapping[str, str],
                   deployments: Sequence[str]) -> Tuple[Dict[str, str], List[str]]:
    """Data Designer alias -> deployment alias for every alias a column uses, and problems.

    ``defined`` are the config's model aliases, ``used`` maps an alias to the columns that
    use it, ``mapping`` is ``[client.models]`` (others keep their name), ``deployments``
    the run's deployment aliases.
    """
    targets: Dict[str, str] = {}
    problems: List[str] = []
    for alias in sorted(set(mapping) - set(defined)):
        problems.append(f"client.models.{alias}: the Data Designer config defines no model "
                        f"alias {alias!r} (it has: {_names(defined)})")
    for alias in sorted(used):
        target = mapping.get(alias, alias)
        columns = ", ".join(sorted(used[alias]))
        if alias not in defined:
            problems.append(f"column(s) {columns} use model alias {alias!r}, which the Data "
                            f"Designer config does not define (model_configs: "
                            f"{_names(defined)})")
        elif target not in deployments:
            problems.append(f"model alias {alias!r} (column(s) {columns}) is served by no "
                            f"deployment (deployments: {_names(deployments)}); name a "
                            f"deployment {alias!r} or map it: [client.models] {alias} = "
                            f"\"<deployment>\"")
        else:
            targets[alias] = target
    for alias in sorted(set(deployments) - set(targets.values())):
        problems.append(f"deployment {alias!r} is used by no column of the Data Designer "
                        f"config (model aliases used: {_names(sorted(used))})")
    return targets, problems


def _names(items: Iterable[str]) -> str:
    shown = ", ".join(sorted(items))
    return shown or "none"


def reserved_columns(columns: Iterable[str], where: str) -> List[str]:
    """A problem for each column name synthbatch writes itself (``index``)."""
    return [f"{where} {name!r}: the name is reserved for synthbatch's record index"
            for name in columns if name in RESERVED_COLUMNS]


def selected_range(size: int, start: Optional[int] = None,
                   end: Optional[int] = None) -> Tuple[int, int]:
    """The seed rows ``[start, end]`` (inclusive) a run reads: all of them by default.

    ValueError when the dataset is empty or the range is outside it.
    """
    if size <= 0:
        raise ValueError("the seed dataset has no rows")
    first, last = (0, size - 1) if start is None or end is None else (start, end)
    if not 0 <= first <= last < size:
        raise ValueError(f"the seed selection [{first}, {last}] is outside the dataset's "
                         f"{size} rows")
    return first, last


def shard_seed_rows(offset: int, count: int, first: int, last: int,
                    shuffle: bool) -> List[int]:
    """The seed row of each record ``offset .. offset+count-1`` of the run (in order).

    Ordered: record ``i`` reads row ``first + i mod (last - first + 1)``, as an unsharded
    Data Designer run does. Shuffled: the same rows, permuted among the shard's records by
    ``random.Random(offset)``.
    """
    size = last - first + 1
    rows = [first + (offset + j) % size for j in range(count)]
    if shuffle:
        random.Random(offset).shuffle(rows)
    return rows


def row_ranges(rows: Iterable[int]) -> List[Tuple[int, int]]:
    """Sorted distinct ``rows`` as inclusive ``(start, end)`` runs (what to read)."""
    ranges: List[Tuple[int, int]] = []
    for row in sorted(set(rows)):
        if ranges and row == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], row)
        else:
            ranges.append((row, row))
    return ranges


def missing(present: Iterable[int], offset: int, count: int) -> List[int]:
    """The record indices of the shard not in ``present``, ascending."""
    have = set(present)
    return [i for i in range(offset, offset + count) if i not in have]


def batch_targets(targets: Sequence[int], batch: int, buffer_size: int) -> List[int]:
    """The record indices Data Designer's row group ``batch`` was asked for."""
    return list(targets[batch * buffer_size:(batch + 1) * buffer_size])


def plain(value: Any) -> Any:
    """``value`` as JSON data: NaN/inf -> None, dates -> ISO text, bytes -> base64, Decimal
    -> text; dicts and lists converted inside; anything else unknown -> ``str``."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return str(value)


def record_line(row: Mapping[str, Any]) -> Tuple[int, bytes]:
    """One Data Designer row -> (its global index, its JSONL line with ``"index"`` first).

    ValueError when the row does not carry :data:`INDEX_COLUMN` as an integer.
    """
    index = row.get(INDEX_COLUMN)
    if not isinstance(index, int) or isinstance(index, bool):
        raise ValueError(f"a Data Designer row lost its {INDEX_COLUMN} column (got {index!r})")
    record: Dict[str, Any] = {"index": index}
    record.update((str(k), plain(v)) for k, v in row.items() if k != INDEX_COLUMN)
    text = json.dumps(record, ensure_ascii=False, allow_nan=False)
    return index, (text + "\n").encode("utf-8")
