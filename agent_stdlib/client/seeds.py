"""Which seed-data row each record takes, and reading it.

* ``in-order``: record ``i`` takes row ``i mod rows``: a shard's record range is a
  contiguous range of rows (wrapping around when the run has more records than rows);
* ``shuffle``: rows in a seeded permutation, a new one each time the records wrap around,
  so every row is used once per pass;
* ``sample``: a row drawn with replacement from the record's own bits.

All three are functions of (seed, record index) only (``samplers.cell_bits``), so every
shard, resume and retry picks the same rows. The permutation is a small Feistel cipher
over the next power of four (cycle-walking back into range): nothing of the size of the
file is held in memory, only the byte offset of each row (``agent_stdlib.recipe.seeds``).
"""

from __future__ import annotations

import hashlib
from typing import Any, BinaryIO, Dict, Optional, Sequence

from ..contracts import SeedDataSpec
from ..recipe.seeds import SeedError, SeedIndex, open_rows, read_row, scan
from .samplers import cell_bits

ROUNDS = 4
COLUMN = "\x00seed-data"  # the cell name of row picks: no column can be called that


def _round_key(seed: int, epoch: int, rnd: int, half: int, value: int) -> int:
    digest = hashlib.sha256(f"{seed}\x00{epoch}\x00{rnd}\x00{value}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << half) - 1)


def permute(position: int, rows: int, seed: int, epoch: int) -> int:
    """The row at ``position`` of the seeded permutation of ``range(rows)`` for ``epoch``."""
    bits = max(2, (rows - 1).bit_length())
    bits += bits % 2
    half = bits // 2
    mask = (1 << half) - 1
    value = position
    while True:  # cycle-walk: at most a few steps, the domain is < 4 x rows
        left, right = value >> half, value & mask
        for rnd in range(ROUNDS):
            left, right = right, left ^ _round_key(seed, epoch, rnd, half, right)
        value = (left << half) | right
        if value < rows:
            return value


def row_for(order: str, seed: int, index: int, rows: int) -> int:
    """The row record ``index`` takes."""
    if order == "in-order":
        return index % rows
    if order == "shuffle":
        epoch, position = divmod(index, rows)
        return permute(position, rows, seed, epoch)
    if order == "sample":
        return int.from_bytes(cell_bits(seed, COLUMN, index)[:8], "big") % rows
    raise SeedError(f"seed_data.order: unknown order {order!r}")


class SeedRows:
    """The rows of a plan's seed data, read by record index."""

    def __init__(self, spec: SeedDataSpec, seed: int) -> None:
        self.spec, self.seed = spec, seed
        self.index: SeedIndex = scan(spec.path, validate=False, required=spec.fields)
        if spec.rows and spec.rows != self.index.rows:
            raise SeedError(f"{spec.path}: {self.index.rows} rows now, {spec.rows} when the "
                            f"run was planned: the file changed")
        missing = [name for name in spec.fields if name not in self.index.fields] \
            if self.index.format == "csv" else []
        if missing:
            raise SeedError(f"{spec.path}: the header has no field {missing[0]!r}")
        self._handle: Optional[BinaryIO] = open_rows(spec.path)

    @property
    def fields(self) -> Sequence[str]:
        """The file's fields (CSV header, or the first JSONL row's keys)."""
        return self.index.fields

    def number(self, index: int) -> int:
        """The number of the seed row record ``index`` takes."""
        return row_for(self.spec.order, self.seed, index, self.index.rows)

    def row(self, index: int) -> Dict[str, Any]:
        """The seed row of record ``index`` (SeedError naming file and line if bad)."""
        assert self._handle is not None
        return read_row(self._handle, self.index, self.number(index), self.spec.fields)

    def close(self) -> None:
        """Close the file."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
