"""The proxy's own event loop: streams, flow control, connects, timers, thread-safe calls."""

from __future__ import annotations

import socket
import threading
import time
from typing import List, Optional, Tuple

import pytest

from synthbatch.agent_stdlib.proxy.loop import HIGH_WATER, Connecting, Loop, Stream


class Recorder:
    """A protocol that records every callback."""

    def __init__(self, loop: Loop, keep_open_on_eof: bool = False) -> None:
        self.loop = loop
        self.data: List[bytes] = []
        self.events: List[str] = []
        self.keep_open_on_eof = keep_open_on_eof

    def data_received(self, data: bytes) -> None:
        self.data.append(data)

    def eof_received(self) -> bool:
        self.events.append("eof")
        return self.keep_open_on_eof

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.events.append(f"lost:{type(exc).__name__ if exc else None}")

    def pause_writing(self) -> None:
        self.events.append("pause")

    def resume_writing(self) -> None:
        self.events.append("resume")


def spin(loop: Loop, until, timeout: float = 5.0) -> None:
    """Run loop iterations until ``until()`` holds."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "condition not reached"
        loop.call_soon(loop._stop)  # one iteration: poll without waiting, then stop
        loop.run()
        time.sleep(0.001)


@pytest.fixture()
def loop():
    lp = Loop()
    yield lp
    lp.close()


def pair(loop: Loop, proto: Recorder) -> Tuple[Stream, socket.socket]:
    a, b = socket.socketpair()
    a.setblocking(False)
    return Stream(loop, a, proto), b


def test_data_eof_and_connection_lost_is_deferred(loop) -> None:
    proto = Recorder(loop)
    stream, peer = pair(loop, proto)
    peer.sendall(b"hello")
    spin(loop, lambda: proto.data)
    assert b"".join(proto.data) == b"hello"
    peer.shutdown(socket.SHUT_WR)
    spin(loop, lambda: "lost:None" in proto.events)
    assert proto.events == ["eof", "lost:None"]
    assert stream.sock.fileno() == -1
    peer.close()


def test_close_calls_connection_lost_from_the_loop_not_inline(loop) -> None:
    proto = Recorder(loop)
    stream, peer = pair(loop, proto)
    stream.close()
    assert proto.events == []  # asyncio semantics: never from inside close()
    spin(loop, lambda: proto.events)
    assert proto.events == ["lost:None"]
    peer.close()


def test_write_buffers_pauses_and_resumes_and_delivers_everything_in_order(loop) -> None:
    proto = Recorder(loop)
    stream, peer = pair(loop, proto)
    payload = bytes(range(256)) * (4 * HIGH_WATER // 256)
    for i in range(0, len(payload), 65536):
        stream.write(payload[i : i + 65536])
    assert "pause" in proto.events and stream.wbuf
    got = bytearray()
    peer.setblocking(False)

    def drained() -> bool:
        try:
            while True:
                chunk = peer.recv(1 << 20)
                if not chunk:
                    break
                got.extend(chunk)
        except BlockingIOError:
            pass
        return len(got) == len(payload)

    spin(loop, drained)
    assert bytes(got) == payload
    assert proto.events.count("pause") == 1 and proto.events[-1] == "resume"
    assert stream.mask == 1  # back to reading only
    peer.close()


def test_write_eof_after_buffered_data(loop) -> None:
    proto = Recorder(loop, keep_open_on_eof=True)
    stream, peer = pair(loop, proto)
    payload = b"x" * (2 * HIGH_WATER)
    stream.write(payload)
    stream.write_eof()
    peer.settimeout(5)
    got = bytearray()

    def read_all() -> bool:
        try:
            peer.setblocking(False)
            while True:
                chunk = peer.recv(1 << 20)
                if not chunk:
                    return True
                got.extend(chunk)
        except BlockingIOError:
            return False

    spin(loop, read_all)
    assert len(got) == len(payload)
    peer.close()


def test_paused_reader_with_hung_up_peer_does_not_spin(loop) -> None:
    proto = Recorder(loop)
    stream, peer = pair(loop, proto)
    stream.pause_reading()
    peer.close()
    assert stream.fd not in loop.handlers  # nothing watched: HUP cannot busy-loop
    stream.resume_reading()
    spin(loop, lambda: "lost:None" in proto.events)


def test_connect_refused_and_success(loop) -> None:
    results: List[Tuple[Optional[socket.socket], Optional[OSError]]] = []
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    Connecting(loop, ("127.0.0.1", closed_port), socket.AF_INET, 2.0,
               lambda _, s, e: results.append((s, e)))  # fmt: skip
    spin(loop, lambda: results)
    assert results[0][0] is None and isinstance(results[0][1], ConnectionRefusedError)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        results.clear()
        Connecting(loop, server.getsockname(), socket.AF_INET, 2.0,
                   lambda _, s, e: results.append((s, e)))  # fmt: skip
        spin(loop, lambda: results)
        sock, err = results[0]
        assert err is None and sock is not None
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        sock.close()


def test_cancelled_connect_never_calls_back(loop) -> None:
    results: List[object] = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        pending = Connecting(loop, server.getsockname(), socket.AF_INET, 2.0,
                             lambda _, s, e: results.append(s))  # fmt: skip
        pending.cancel()
        fired: List[bool] = []
        loop.call_later(0.05, fired.append, True)
        spin(loop, lambda: fired)
    assert results == []


def test_timers_run_in_order_and_cancel(loop) -> None:
    seen: List[str] = []
    loop.call_later(0.03, seen.append, "late")
    loop.call_later(0.01, seen.append, "early")
    loop.call_later(0.02, seen.append, "cancelled").cancel()
    spin(loop, lambda: len(seen) == 2)
    assert seen == ["early", "late"]


def test_call_threadsafe_wakes_a_blocked_loop(loop) -> None:
    seen: List[str] = []
    thread = threading.Thread(target=loop.run)
    thread.start()
    time.sleep(0.05)  # the loop is now blocked in poll() with nothing scheduled
    loop.call_threadsafe(seen.append, "from another thread")
    loop.stop()
    thread.join(5)
    assert not thread.is_alive()
    assert seen == ["from another thread"]
