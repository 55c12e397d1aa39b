"""Settings of one proxy instance and the backend URL rule: the bottom of the proxy package.

Every other proxy module may import this one; it imports none of them.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import List, Optional, Tuple
from urllib.parse import urlsplit


def parse_backend_url(url: str) -> Tuple[str, int, str]:
    """Split ``http://host:port[/prefix]`` into host, port and path prefix."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"backend URL must be http://host:port, got {url!r}")
    return parts.hostname, parts.port or 80, parts.path.rstrip("/")


@dataclass
class ProxyConfig:
    """Settings of one proxy instance (one model alias)."""

    backends: List[str]
    host: str = "127.0.0.1"
    port: int = 0
    max_queued: Optional[int] = None
    max_header_bytes: int = 64 * 1024
    max_body_bytes: int = 64 * 1024 * 1024
    header_timeout: float = 30.0
    idle_timeout: float = 120.0
    max_connections: int = 2048
    connect_timeout: float = 5.0
    read_timeout: float = 3600.0
    metrics_interval: float = 0.1
    fail_threshold: int = 3
    fail_window: float = 10.0
    down_seconds: float = 5.0
    pool_idle_timeout: float = 2.0
    allow_non_loopback: bool = False

    def validate(self) -> None:
        """Raise ValueError when the settings are unusable."""
        if not self.backends:
            raise ValueError("at least one backend is required")
        for url in self.backends:
            parse_backend_url(url)
        if not self.allow_non_loopback and not _is_loopback(self.host):
            raise ValueError(f"listen host {self.host!r} is not a loopback address")
        if self.max_queued is not None and self.max_queued < 0:
            raise ValueError("max_queued must be >= 0")
        positive = (
            "max_header_bytes",
            "max_body_bytes",
            "max_connections",
            "header_timeout",
            "idle_timeout",
            "connect_timeout",
            "read_timeout",
            "metrics_interval",
            "pool_idle_timeout",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")


def _is_loopback(host: str) -> bool:
    """Tell whether a listen host is a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
