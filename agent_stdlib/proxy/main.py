"""Endpoint proxy between the generation client and the model replicas of one alias.

Runs inside the Slurm allocation on a loopback address (the client runs on the same node);
one proxy per model alias, backends = every replica of that alias on any node. Standard
library only (Python 3.9+).

Design: one event loop on one thread (:mod:`agent_stdlib.proxy.loop`: epoll, non-blocking
sockets, a timer heap; asyncio's selector, handle and transport layers cost about a third
of the proxy's CPU per request). Both sides are small protocol objects fed by that loop;
every connection reads into one preallocated buffer and writes straight to its socket
(buffered only when the socket is full, with pause/resume flow control):

* :mod:`agent_stdlib.proxy.client` parses client requests from ``data_received`` and
  streams request bodies on (recorded, bounded by ``max_body_bytes``, for failover);
* :mod:`agent_stdlib.proxy.upstream` reads backend responses and passes body bytes to the
  client as they arrive (SSE events are written the moment the backend sends them); backend
  connections are kept alive in a per-backend pool; TCP_NODELAY on every socket;
* :mod:`agent_stdlib.proxy.core` picks the backend with the fewest outstanding requests
  (ties round-robin, see :mod:`agent_stdlib.proxy.route`), fails over on connect error /
  429 / 503 before any response byte was sent (each backend at most once), expires
  header/body/idle deadlines with one periodic sweeper and reaps idle pooled connections;
* with ``max_queued`` set, a sampler thread per backend polls its ``/metrics`` every
  ``metrics_interval`` and the proxy answers 429 + ``Retry-After: 1`` when every healthy
  backend is over the limit (an unknown sample fails open);
* ``GET /health`` and ``GET /metrics`` are answered by the proxy itself.

This module holds the thread-owning :class:`Proxy` facade and the CLI (the settings are in
:mod:`agent_stdlib.proxy.config`)
(``python agent.pyz proxy --listen 127.0.0.1:0 --port-file F --backend URL ...``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
import threading
from typing import Dict, List, Optional, Tuple

from .config import ProxyConfig
from .core import Core
from .route import Backend

LOG = logging.getLogger("synthbatch.proxy")


class Proxy:
    """Least-outstanding-requests HTTP proxy in front of the replicas of one model alias.

    ``start()`` binds and runs the event loop on a daemon thread; ``stop()`` closes every
    connection and joins it.
    """

    def __init__(self, config: ProxyConfig) -> None:
        config.validate()
        self.config = config
        self.core = Core(config)
        self.backends: List[Backend] = self.core.router.backends
        self.stats = self.core.stats
        self.port = 0
        self._thread: Optional[threading.Thread] = None
        self._stopped = False

    def start(self) -> int:
        """Bind the listener, start the event loop thread; return the bound port."""
        try:
            self.port = self.core.open()
        except BaseException:
            self.core.loop.close()
            raise
        self._thread = threading.Thread(target=self.core.loop.run, name="proxy-loop", daemon=True)
        self._thread.start()
        LOG.info(
            "listening on %s:%d backends=%s max_queued=%s",
            self.config.host,
            self.port,
            ",".join(b.url for b in self.backends),
            self.config.max_queued,
        )
        return self.port

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listener and every connection, then stop the loop thread."""
        if self._stopped or self._thread is None:
            return
        self._stopped = True
        loop = self.core.loop
        loop.call_threadsafe(self.core.close)
        loop.stop()  # runs after close(), and after the connection_lost calls it causes
        self._thread.join(timeout)
        if not self._thread.is_alive():
            loop.close()
        LOG.info("stopped")

    def health(self) -> Dict[str, object]:
        """Return the health document served at ``GET /health``."""
        return self.core.router.health()

    def metrics_text(self) -> str:
        """Render the proxy's counters in Prometheus text format."""
        return self.core.metrics_text()


# --------------------------------------------------------------------------------------
# CLI


def write_port_file(path: str, port: int) -> None:
    """Write the port atomically: temp file in the same directory, fsync, rename."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".port-", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(f"{port}\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _parse_listen(value: str) -> Tuple[str, int]:
    """Parse ``HOST:PORT`` (IPv6 as ``[::1]:PORT``)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def build_parser() -> argparse.ArgumentParser:
    """Build the ``proxy`` role's argument parser."""
    d = ProxyConfig(backends=[])
    p = argparse.ArgumentParser(
        prog="agent.pyz proxy", description="Endpoint proxy for one model alias."
    )
    p.add_argument("--listen", type=_parse_listen, default=("127.0.0.1", 0), metavar="HOST:PORT")
    p.add_argument(
        "--backend",
        action="append",
        required=True,
        metavar="URL",
        help="backend base URL, e.g. http://127.0.0.1:8001 (repeatable)",
    )
    p.add_argument("--port-file", metavar="PATH", help="write the bound port here atomically")
    p.add_argument(
        "--max-queued",
        type=int,
        default=None,
        metavar="N",
        help="per-backend queue limit; 429 when every backend is over it",
    )
    p.add_argument("--max-header-bytes", type=int, default=d.max_header_bytes)
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument("--header-timeout", type=float, default=d.header_timeout)
    p.add_argument("--idle-timeout", type=float, default=d.idle_timeout)
    p.add_argument("--max-connections", type=int, default=d.max_connections)
    p.add_argument("--connect-timeout", type=float, default=d.connect_timeout)
    p.add_argument("--read-timeout", type=float, default=d.read_timeout)
    p.add_argument("--metrics-interval", type=float, default=d.metrics_interval)
    p.add_argument(
        "--pool-idle-timeout",
        type=float,
        default=d.pool_idle_timeout,
        help="close idle backend connections after this many seconds",
    )
    return p


def config_from_args(args: argparse.Namespace) -> ProxyConfig:
    """Turn parsed CLI arguments into a ProxyConfig."""
    host, port = args.listen
    return ProxyConfig(
        backends=list(args.backend),
        host=host,
        port=port,
        max_queued=args.max_queued,
        max_header_bytes=args.max_header_bytes,
        max_body_bytes=args.max_body_bytes,
        header_timeout=args.header_timeout,
        idle_timeout=args.idle_timeout,
        max_connections=args.max_connections,
        connect_timeout=args.connect_timeout,
        read_timeout=args.read_timeout,
        metrics_interval=args.metrics_interval,
        pool_idle_timeout=args.pool_idle_timeout,
    )


def _raise_fd_limit() -> None:
    """Lift the soft open-files limit to the hard one (each client needs two sockets)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError) as exc:
        LOG.debug("cannot raise the open-files limit: %s", exc)


def main(argv: List[str]) -> int:
    """Run the proxy until SIGTERM/SIGINT; return the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s proxy %(levelname)s %(message)s"
    )
    _raise_fd_limit()
    try:
        proxy = Proxy(config_from_args(args))
        port = proxy.start()
    except (ValueError, OSError) as exc:
        LOG.error("cannot start: %s", exc)
        return 1
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        if args.port_file:
            write_port_file(args.port_file, port)
        while not stop.wait(1.0):
            pass
        LOG.info("signal received, stopping")
    except OSError as exc:
        LOG.error("cannot write port file %s: %s", args.port_file, exc)
        return 1
    finally:
        proxy.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
