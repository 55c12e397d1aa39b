"""The floor of the endpoint proxy's design: its own loop and streams, no HTTP semantics.

Run by ``benchmarks/proxy.py`` as the ``floor`` target: the same ``proxy_loop`` (epoll,
corked writes, buffered streams) as ``agent_stdlib.proxy.main``, with protocols that only split
Content-Length framed messages and send each request to the backend with fewer requests in
flight. No header validation, no hop-by-hop rewriting, no chunked bodies, no failover, no
limits, no metrics. Its CPU per request shows what the I/O layer costs; ours minus the
floor is the cost of the proxy's HTTP handling in Python. Not a usable proxy.

    python benchmarks/proxy_floor.py PORT_FILE BACKEND_PORT [BACKEND_PORT ...]
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from synthbatch.agent_stdlib.proxy.loop import READ, Loop, Stream, set_nodelay  # noqa: E402


def message_end(data: bytes) -> int:
    """Length of the first complete Content-Length framed message in ``data``, or -1."""
    idx = data.find(b"\r\n\r\n")
    if idx < 0:
        return -1
    length = 0
    for line in data[:idx].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    end = idx + 4 + length
    return end if len(data) >= end else -1


class Floor:
    """Backends, their idle connections and in-flight counts."""

    def __init__(self, loop: Loop, ports: List[int]) -> None:
        self.loop = loop
        self.ports = ports
        self.pools: List[List[Upstream]] = [[] for _ in ports]
        self.in_flight = [0] * len(ports)

    def upstream(self) -> Upstream:
        """An idle connection to the backend with the fewest requests in flight."""
        index = min(range(len(self.ports)), key=self.in_flight.__getitem__)
        self.in_flight[index] += 1
        if self.pools[index]:
            return self.pools[index].pop()
        sock = socket.create_connection(("127.0.0.1", self.ports[index]))
        sock.setblocking(False)
        set_nodelay(sock)
        up = Upstream(self, index)
        up.transport = Stream(self.loop, sock, up)
        return up


class Peer:
    """Protocol basics shared by both sides."""

    transport: Stream
    buf = b""

    def eof_received(self) -> bool:
        """Close on EOF."""
        return False

    def connection_lost(self, exc: Optional[Exception]) -> None:
        """Nothing to clean up."""


class Upstream(Peer):
    """A backend connection: passes one response at a time to its client."""

    def __init__(self, floor: Floor, index: int) -> None:
        self.floor = floor
        self.index = index
        self.client: Optional[Client] = None

    def data_received(self, data: bytes) -> None:
        """Forward a complete response and go back to the pool."""
        self.buf += data
        end = message_end(self.buf)
        if end < 0 or self.client is None:
            return
        self.client.transport.write(self.buf[:end])
        self.buf = self.buf[end:]
        self.client = None
        self.floor.in_flight[self.index] -= 1
        self.floor.pools[self.index].append(self)


class Client(Peer):
    """A client connection: each complete request goes to a backend connection."""

    def __init__(self, floor: Floor) -> None:
        self.floor = floor

    def data_received(self, data: bytes) -> None:
        """Send a complete request on."""
        self.buf += data
        end = message_end(self.buf)
        if end < 0:
            return
        up = self.floor.upstream()
        up.client = self
        up.transport.write(self.buf[:end])
        self.buf = self.buf[end:]


def main(argv: List[str]) -> None:
    """Listen on 127.0.0.1:0, write the port, serve until killed."""
    loop = Loop()
    floor = Floor(loop, [int(p) for p in argv[1:]])
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    listener.setblocking(False)

    def accept(events: int) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            set_nodelay(sock)
            client = Client(floor)
            client.transport = Stream(loop, sock, client)

    loop.add(listener.fileno(), READ, accept)
    port_file = Path(argv[0])
    temp = port_file.with_suffix(".tmp")
    temp.write_text(str(listener.getsockname()[1]))
    temp.replace(port_file)
    loop.run()


if __name__ == "__main__":
    main(sys.argv[1:])
