"""A small keep-alive HTTP/1.1 client on asyncio streams: JSON POSTs to one base URL.

One :class:`Endpoint` per model alias keeps its idle connections and reuses them, so a
request costs a write and a read, not a TCP handshake; hundreds of requests share one
thread and one event loop. A kept-alive connection the server closed in the meantime is
noticed on the first read and the request is sent again once on a fresh connection.
Responses are read by ``Content-Length``, chunked transfer coding, or to the end of the
connection. ``https://`` URLs use the system's certificate store.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from ..contracts import AFFINITY_HEADER

Conn = Tuple[asyncio.StreamReader, asyncio.StreamWriter]
MAX_IDLE = 4096
LIMIT = 1 << 20  # longest response head or chunk-size line


class HttpError(Exception):
    """The exchange failed before a complete response arrived (connection, protocol)."""


@dataclass(frozen=True)
class Reply:
    """A complete response."""

    status: int
    headers: Dict[str, str]  # names lower-cased
    body: bytes


def _close(conn: Conn) -> None:
    try:
        conn[1].close()
    except Exception:  # noqa: BLE001 - closing a broken transport may raise anything
        pass


class Endpoint:
    """POSTs to ``base_url`` (``http[s]://host[:port][/prefix]``) over kept-alive connections."""

    def __init__(self, base_url: str, api_key: Optional[str] = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint {base_url!r} is not an http(s) URL")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.ssl: Optional[ssl.SSLContext] = ssl.create_default_context() \
            if parts.scheme == "https" else None
        authority = self.host if parts.port is None else f"{self.host}:{self.port}"
        if ":" in self.host:
            authority = f"[{self.host}]" + (f":{self.port}" if parts.port else "")
        self._head = f"Host: {authority}\r\nContent-Type: application/json\r\n" + (
            f"Authorization: Bearer {api_key}\r\n" if api_key else "")
        self._idle: List[Conn] = []

    async def _connect(self) -> Conn:
        try:
            return await asyncio.open_connection(
                self.host, self.port, ssl=self.ssl, limit=LIMIT,
                server_hostname=self.host if self.ssl else None)
        except OSError as err:
            raise HttpError(f"connection to {self.host}:{self.port} failed: "
                            f"{err.strerror or err}") from err

    async def post(self, path: str, payload: bytes, affinity: str = "") -> Reply:
        """POST ``payload`` (JSON) to ``prefix + path``; HttpError if no response came.
        A non-empty ``affinity`` goes out as the proxy's affinity header.

        Callers bound the time with ``asyncio.wait_for``; a cancelled exchange closes its
        connection.
        """
        extra = f"{AFFINITY_HEADER}: {affinity}\r\n" if affinity else ""
        request = (f"POST {self.prefix}{path} HTTP/1.1\r\n{self._head}{extra}"
                   f"Content-Length: {len(payload)}\r\n\r\n").encode("latin-1") + payload
        while True:
            reused = bool(self._idle)
            conn = self._idle.pop() if reused else await self._connect()
            try:
                conn[1].write(request)
                reply, keep = await _read_response(conn[0])
            except (asyncio.IncompleteReadError, ConnectionError) as err:
                _close(conn)
                if reused and (not isinstance(err, asyncio.IncompleteReadError)
                               or not err.partial):
                    continue  # the server closed the idle connection: send it again
                raise HttpError(f"connection to {self.host}:{self.port} broke: "
                                f"{err!r}") from err
            except (OSError, ValueError, asyncio.LimitOverrunError) as err:
                _close(conn)
                raise HttpError(f"bad exchange with {self.host}:{self.port}: {err}") from err
            except BaseException:
                _close(conn)  # cancelled (a timeout): the connection is in an unknown state
                raise
            if keep and len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
            else:
                _close(conn)
            return reply

    def close(self) -> None:
        """Close every idle connection."""
        while self._idle:
            _close(self._idle.pop())


async def _read_response(reader: asyncio.StreamReader) -> Tuple[Reply, bool]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    try:
        status = int(rest[:3])
    except ValueError as err:
        raise ValueError(f"bad status line {lines[0][:80]!r}") from err
    headers: Dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif status in (204, 304) or 100 <= status < 200:
        body = b""
    else:
        body, keep = await reader.read(), False
    return Reply(status, headers, body), keep


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass  # trailers
            return b"".join(parts)
        chunk = await reader.readexactly(size + 2)
        parts.append(chunk[:-2])
