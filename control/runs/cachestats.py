"""Prefix-cache reuse and affinity routing of a running shard (issue 30), as status shows it.

The generator publishes them per alias in ``progress.json`` (``AliasProgress.cache``,
``agent_stdlib/client/cachestats.py``); this module checks them (a damaged field is named,
never a traceback), adds them up over shards and renders the one line ``status --shard N``
prints per alias.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from synthbatch.agent_stdlib.statefile import StateError
from synthbatch.agent_stdlib.text import visible

COUNTERS = ("prompt_tokens_cached", "affinity_hits", "affinity_fallbacks")


def cache_figures(figures: Dict[str, Any], alias: str, path: str) -> Optional[Dict[str, Any]]:
    """The checked ``cache`` part of one alias's progress figures; None when absent (a
    generator from before issue 30). Raises StateError naming the field."""
    cache = figures.get("cache")
    if cache is None:
        return None
    where = f"{path}: field 'aliases.{alias}.cache"
    if not isinstance(cache, dict):
        raise StateError(f"{where}' has the wrong type")
    out: Dict[str, Any] = {}
    for name in COUNTERS:
        value = cache.get(name, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise StateError(f"{where}.{name}' has the wrong type")
        out[name] = value
    rates = cache.get("replica_hit_rate", {})
    if not isinstance(rates, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in rates.values()):
        raise StateError(f"{where}.replica_hit_rate' has the wrong type")
    out["replica_hit_rate"] = {str(k): float(v) for k, v in rates.items()}
    return out


def add_cache(total: Optional[Dict[str, Any]], part: Dict[str, Any]) -> Dict[str, Any]:
    """Two shards' cache figures added up (replica hit rates: the latest seen wins, they
    are the engine's own ratios, not counts)."""
    if total is None:
        return {**part, "replica_hit_rate": dict(part.get("replica_hit_rate", {}))}
    out = {name: total.get(name, 0) + part.get(name, 0) for name in COUNTERS}
    out["replica_hit_rate"] = {**total.get("replica_hit_rate", {}),
                               **part.get("replica_hit_rate", {})}
    return out


def cache_line(alias: str, figures: Dict[str, Any]) -> Optional[str]:
    """``model gen: prefix cache 58.0% of 12,345 prompt tokens; affinity 120 hits, 3
    load-bound fallbacks; replica hit rate http://h:1 0.94, ...``; None without figures."""
    cache = figures.get("cache")
    if not isinstance(cache, dict):
        return None
    tokens_in = figures.get("tokens_in", 0) or 0
    cached = cache.get("prompt_tokens_cached", 0)
    share = f"{100.0 * cached / tokens_in:.1f}%" if tokens_in else "-"
    line = (f"  model {visible(alias)}: prefix cache {share} of {tokens_in:,} prompt tokens;"
            f" affinity {cache.get('affinity_hits', 0):,} hits, "
            f"{cache.get('affinity_fallbacks', 0):,} load-bound fallbacks")
    rates = cache.get("replica_hit_rate") or {}
    if rates:
        line += "; replica hit rate " + ", ".join(
            f"{visible(url)} {rate:.2f}" for url, rate in sorted(rates.items()))
    return line
