"""Retries that can succeed: what the next request of an LLM cell changes after an
invalid structured, judge or code answer (pure: a body in, a body and the change out).

Repeating the identical request is pointless at temperature 0 and barely useful above
it, so a retry of an invalid answer always changes something:

* a new ``seed`` (derived from the cell's bits and the attempt, so a rerun is the same);
* if the answer was cut by the length limit (``finish_reason`` ``"length"``), twice the
  ``max_tokens``, up to :data:`TOKEN_CAP_FACTOR` times the column's own and at most
  :data:`TOKEN_CAP`;
* at temperature 0, a small temperature (:data:`RETRY_TEMPERATURE`).

What changed is returned so that the cell's ``_meta`` can record it (``retries``).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

TOKEN_CAP_FACTOR = 4
TOKEN_CAP = 8192
RETRY_TEMPERATURE = 0.3
RETRIED_KINDS = ("llm-structured", "llm-judge", "llm-code")


def token_cap(max_tokens: int) -> int:
    """The most tokens a retry may ask for: a few times the column's own, bounded."""
    return max(max_tokens, min(TOKEN_CAP, max_tokens * TOKEN_CAP_FACTOR))


def retry_body(body: Dict[str, Any], base_max_tokens: int, seed: int,
               finish_reason: Optional[str]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(the next request, what it changed) after an invalid answer to ``body``.

    ``seed`` is this retry's seed; it differs from the previous request's, so the next
    request is never byte-identical to the one before it."""
    out = dict(body)
    change: Dict[str, Any] = {}
    if out.get("seed") == seed:  # the caller's seeds differ per attempt; be certain
        seed += 1
    out["seed"] = change["seed"] = seed
    tokens = int(out.get("max_tokens") or base_max_tokens)
    if finish_reason == "length":
        more = min(token_cap(base_max_tokens), tokens * 2)
        if more > tokens:
            out["max_tokens"] = change["max_tokens"] = more
    if not out.get("temperature"):
        out["temperature"] = change["temperature"] = RETRY_TEMPERATURE
    return out, change
