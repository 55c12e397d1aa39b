"""The order a shard's records go to the engines in: records that share a context close
together, so that an engine still holds their shared prefix in its cache.

Records open in index order (``generate.Producer``) and wait for their alias's limiter,
which serves the lowest rank first. Without seed data (or a window of 1) the rank is the
index. With seed data, records are taken in blocks of ``width`` indexes (the producer's
window, so that the reorder buffer stays as small as before); within a block, every
record that takes the same seed row as an earlier one of the block is ranked right after
it (records outnumbering rows: ``in-order`` gives record ``i`` row ``i mod rows``, so
records ``i``, ``i + rows``, ... share a row). Output order on disk stays by index.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional


def rank(index: int, first: int, width: int) -> int:
    """The rank of record ``index`` whose group's first record in its block is ``first``:
    blocks in order, groups by their first record, records of a group by index."""
    return first * width + index % width


class DispatchOrder:
    """Ranks records as they open (in increasing index order)."""

    def __init__(self, width: int, group_of: Optional[Callable[[int], int]]) -> None:
        self.width = max(1, width)
        self.group_of = group_of  # record index -> its seed row (None: no grouping)
        self._firsts: Dict[int, Dict[int, int]] = {}  # block -> group -> first index

    def rank(self, index: int) -> int:
        """The limiter priority of record ``index``."""
        if self.group_of is None or self.width == 1:
            return index
        block = index // self.width
        firsts = self._firsts.get(block)
        if firsts is None:
            for old in [b for b in self._firsts if b < block - 1]:
                del self._firsts[old]  # blocks the producer has left behind
            firsts = self._firsts[block] = {}
        first = firsts.setdefault(self.group_of(index), index)
        return rank(index, first, self.width)
