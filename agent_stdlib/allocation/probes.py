"""Readiness probes: plain HTTP GETs against a backend, bounded by a timeout."""

from __future__ import annotations

import http.client
from urllib.parse import urlsplit


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """True if GET ``url`` (its path and query) answers 200 within ``timeout_s``; never
    raises."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80,
                                      timeout=timeout_s)
    try:
        conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
        response = conn.getresponse()
        response.read()
        return response.status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()
