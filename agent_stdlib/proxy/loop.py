"""The endpoint proxy's own event loop: readiness polling, non-blocking sockets, timers.

asyncio costs the proxy about a third of its CPU per request (selector wrappers, handles,
transport bookkeeping), so the proxy runs on this smaller loop instead: ``epoll`` (``poll``
where there is no epoll), a dict from file descriptor to handler, a timer heap and a
thread-safe call queue. :class:`Stream` gives a protocol object the few transport
operations the proxy needs (write with buffering and flow control, pause/resume reading,
half-close, close, abort); :class:`Connecting` opens a non-blocking client connection.

Semantics follow asyncio where the proxy relies on them: ``connection_lost`` is always
called from the loop, never from inside ``close()``/``abort()``; ``pause_writing`` /
``resume_writing`` are called around a high/low water mark of buffered output. Writes are
corked until the end of the loop iteration (see :meth:`Loop._uncork`).

Standard library only (Python 3.9+); all methods except :meth:`Loop.call_threadsafe` and
:meth:`Loop.stop` must be called on the loop's thread.
"""

from __future__ import annotations

import errno
import heapq
import os
import select
import socket
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

READ = select.POLLIN
WRITE = select.POLLOUT
_FAIL = select.POLLHUP | select.POLLERR
RECV_SIZE = 65536
HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024
_RETRY = (BlockingIOError, InterruptedError)


class Timer:
    """A scheduled call; ``cancel()`` makes it a no-op."""

    __slots__ = ("when", "fn", "args", "cancelled")

    def __init__(self, when: float, fn: Callable[..., None], args: Tuple[Any, ...]) -> None:
        self.when = when
        self.fn = fn
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        """Do not run this call."""
        self.cancelled = True


class Loop:
    """A single-threaded readiness loop (see the module docstring)."""

    def __init__(self) -> None:
        self._epoll = hasattr(select, "epoll")
        self._poller: Any = select.epoll() if self._epoll else select.poll()
        self.handlers: Dict[int, Callable[[int], None]] = {}
        self._timers: List[Tuple[float, int, Timer]] = []
        self._seq = 0
        self._soon: List[Tuple[Callable[..., None], Tuple[Any, ...]]] = []
        self._calls: Deque[Tuple[Callable[..., None], Tuple[Any, ...]]] = deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.add(self._wake_r.fileno(), READ, self._drain_wakeups)
        self.running = False
        self.now = time.monotonic()  # refreshed once per iteration: the hot-path clock
        self.corked: List[Stream] = []  # streams with writes to send at the iteration's end

    # ---- registration -----------------------------------------------------------------

    def add(self, fd: int, mask: int, handler: Callable[[int], None]) -> None:
        """Watch ``fd`` for ``mask`` events; ``handler(events)`` is called when ready."""
        self._poller.register(fd, mask)
        self.handlers[fd] = handler

    def modify(self, fd: int, mask: int) -> None:
        """Change the events watched on a registered ``fd``."""
        self._poller.modify(fd, mask)

    def remove(self, fd: int) -> None:
        """Stop watching ``fd``."""
        if self.handlers.pop(fd, None) is not None:
            try:
                self._poller.unregister(fd)
            except (KeyError, ValueError, OSError):
                pass

    # ---- calls ------------------------------------------------------------------------

    def call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` after the events of this iteration."""
        self._soon.append((fn, args))

    def call_later(self, delay: float, fn: Callable[..., None], *args: Any) -> Timer:
        """Run ``fn(*args)`` in ``delay`` seconds; returns a cancellable :class:`Timer`."""
        timer = Timer(time.monotonic() + delay, fn, args)
        self._seq += 1
        heapq.heappush(self._timers, (timer.when, self._seq, timer))
        return timer

    def call_threadsafe(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop thread (callable from any thread)."""
        self._calls.append((fn, args))
        try:
            self._wake_w.send(b"\0")
        except OSError:  # the wake-up pipe is full: the loop is awake anyway
            pass

    def _drain_wakeups(self, events: int) -> None:
        """Empty the wake-up socket and run the calls queued by other threads."""
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass
        calls = self._calls
        while calls:
            fn, args = calls.popleft()
            fn(*args)

    # ---- running ----------------------------------------------------------------------

    def run(self) -> None:
        """Run until :meth:`stop`."""
        self.running = True
        poll = self._poller.poll
        handlers = self.handlers
        timers = self._timers
        scale = 1.0 if self._epoll else 1000.0
        monotonic = time.monotonic
        while self.running:
            if self._soon or self.corked:
                timeout = 0.0
            elif timers:
                timeout = max(0.0, timers[0][0] - monotonic())
            else:
                timeout = -1.0
            try:
                events = poll(timeout * scale if timeout >= 0 else -1)
            except InterruptedError:
                events = ()
            self.now = monotonic()
            for fd, ev in events:
                handler = handlers.get(fd)
                if handler is not None:
                    handler(ev)
            if timers and timers[0][0] <= self.now:
                self._run_timers()
            if self._soon:
                soon, self._soon = self._soon, []
                for fn, args in soon:
                    fn(*args)
            if self.corked:
                self._uncork()

    def _uncork(self) -> None:
        """Send what every stream was given during this iteration (one send per stream).

        Sending at the end of the iteration rather than inside ``write()`` means a peer
        process that gets several messages is woken once per burst, not once per message,
        which costs the sender less kernel time than the sends themselves.
        """
        corked, self.corked = self.corked, []
        for stream in corked:
            if stream.wbuf:  # (a WRITE event may have sent it already; a lost stream has none)
                stream._write_ready()

    def _run_timers(self) -> None:
        """Run every timer that is due."""
        timers = self._timers
        now = time.monotonic()
        while timers and timers[0][0] <= now:
            timer = heapq.heappop(timers)[2]
            if not timer.cancelled:
                timer.fn(*timer.args)

    def stop(self) -> None:
        """Make :meth:`run` return (callable from any thread)."""
        self.call_threadsafe(self._stop)

    def _stop(self) -> None:
        self.running = False

    def close(self) -> None:
        """Release the poller and the wake-up sockets (after :meth:`run` returned)."""
        self.remove(self._wake_r.fileno())
        self._wake_r.close()
        self._wake_w.close()
        if self._epoll:
            self._poller.close()


class Stream:
    """A connected non-blocking socket driving a protocol object.

    The protocol gets ``data_received(bytes)``, ``eof_received()`` (return True to keep the
    write side open), ``connection_lost(exc)``, ``pause_writing()`` and
    ``resume_writing()``, like an asyncio protocol.
    """

    __slots__ = (
        "loop", "sock", "fd", "protocol", "mask", "wbuf", "wsize", "reading", "closing",
        "eof_pending", "write_paused", "lost",
    )  # fmt: skip

    def __init__(self, loop: Loop, sock: socket.socket, protocol: Any) -> None:
        self.loop = loop
        self.sock = sock
        self.fd = sock.fileno()
        self.protocol = protocol
        self.wbuf: List[bytes] = []
        self.wsize = 0
        self.reading = True
        self.closing = False
        self.eof_pending = False
        self.write_paused = False
        self.lost = False
        self.mask = READ
        loop.add(self.fd, READ, self._on_event)

    # ---- events -----------------------------------------------------------------------

    def _on_event(self, events: int) -> None:
        if events != READ or not self.reading:
            if events & WRITE or (events & _FAIL and self.wbuf):
                self._write_ready()
            if not self.reading or self.lost or not events & (READ | _FAIL):
                return
        try:
            data = self.sock.recv(RECV_SIZE)  # cheaper than recv_into + a copy out
        except _RETRY:
            return
        except OSError as exc:
            self._force_close(exc)
            return
        if data:
            self.protocol.data_received(data)
        elif not self.protocol.eof_received():
            self.close()
        else:
            self._set_reading(False)

    def _write_ready(self) -> None:
        """Send the buffered data; watch for writability while some of it is left."""
        wbuf = self.wbuf
        data = wbuf[0] if len(wbuf) == 1 else b"".join(wbuf)
        try:
            n = self.sock.send(data)
        except _RETRY:
            n = 0
        except OSError as exc:
            self._force_close(exc)
            return
        if n < len(data):
            rest = data[n:]
            self.wbuf = [rest]
            self.wsize = len(rest)
            if self.write_paused and self.wsize <= LOW_WATER:
                self.write_paused = False
                self.protocol.resume_writing()
            if not self.mask & WRITE:
                self._update_mask()
            return
        wbuf.clear()
        self.wsize = 0
        if self.write_paused or self.mask & WRITE or self.eof_pending or self.closing:
            self._flushed()

    def _flushed(self) -> None:
        """Everything buffered was sent: resume the writer, stop watching, half-close, close."""
        if self.write_paused:
            self.write_paused = False
            self.protocol.resume_writing()
            if self.wbuf:  # written again from the callback: corked, sent later
                return
        if self.mask & WRITE:
            self._update_mask()
        if self.eof_pending:
            self.eof_pending = False
            self._shutdown_write()
        if self.closing:
            self._finish(None)

    # ---- transport operations ---------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Queue ``data``; it is sent at the end of this loop iteration (or when the socket
        can take more, if earlier data is still waiting)."""
        if self.closing or self.lost or not data:
            return
        wbuf = self.wbuf
        if not wbuf:  # first data since the last send: send it at the iteration's end
            self.loop.corked.append(self)
        wbuf.append(data)
        self.wsize += len(data)
        if self.wsize > HIGH_WATER and not self.write_paused:
            self.write_paused = True
            self.protocol.pause_writing()

    def pause_reading(self) -> None:
        """Stop reading until :meth:`resume_reading`."""
        self._set_reading(False)

    def resume_reading(self) -> None:
        """Read again."""
        if not self.closing:
            self._set_reading(True)

    def _set_reading(self, on: bool) -> None:
        if self.reading != on:
            self.reading = on
            self._update_mask()

    def _update_mask(self) -> None:
        """Watch for exactly what is wanted; unregister when nothing is (HUP/ERR would spin)."""
        if self.lost:
            return
        mask = (READ if self.reading else 0) | (WRITE if self.wbuf else 0)
        if mask == self.mask:
            return
        loop = self.loop
        if not mask:
            loop.remove(self.fd)
        elif not self.mask:
            loop.add(self.fd, mask, self._on_event)
        else:
            loop.modify(self.fd, mask)
        self.mask = mask

    def can_write_eof(self) -> bool:
        """Half-close is supported."""
        return True

    def write_eof(self) -> None:
        """Close the write side once the buffered data is sent."""
        if self.closing or self.lost:
            return
        if self.wbuf:
            self.eof_pending = True
        else:
            self._shutdown_write()

    def _shutdown_write(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def is_closing(self) -> bool:
        """True once close/abort was called or the connection is gone."""
        return self.closing or self.lost

    def close(self) -> None:
        """Close after the buffered data is sent; ``connection_lost(None)`` follows."""
        if self.closing or self.lost:
            return
        self.closing = True
        self._set_reading(False)
        if not self.wbuf:
            self._finish(None)

    def abort(self) -> None:
        """Close at once, dropping buffered data; ``connection_lost(None)`` follows."""
        self._force_close(None)

    def _force_close(self, exc: Optional[Exception]) -> None:
        if self.lost:
            return
        self.closing = True
        self.wbuf = []
        self.wsize = 0
        self._finish(exc)

    def _finish(self, exc: Optional[Exception]) -> None:
        """Unregister now, close the socket and tell the protocol on the next iteration."""
        if self.lost:
            return
        self.lost = True
        self.loop.remove(self.fd)
        self.mask = 0
        self.loop.call_soon(self._lost, exc)

    def _lost(self, exc: Optional[Exception]) -> None:
        try:
            self.protocol.connection_lost(exc)
        finally:
            self.sock.close()
            self.protocol = None


def set_nodelay(sock: socket.socket) -> None:
    """Disable Nagle (first tokens must not wait for a delayed ACK)."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


class Connecting:
    """A non-blocking TCP connect to ``addr``: ``done(self, sock, None)`` or
    ``done(self, None, error)`` is called from the loop (also on timeout), unless
    :meth:`cancel` came first."""

    def __init__(
        self,
        loop: Loop,
        addr: Tuple[Any, ...],
        family: int,
        timeout: float,
        done: Callable[[Connecting, Optional[socket.socket], Optional[OSError]], None],
    ) -> None:
        self.loop = loop
        self.done: Optional[Callable[..., None]] = done
        self.sock = sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        set_nodelay(sock)
        self.timer: Optional[Timer] = None
        err = sock.connect_ex(addr)
        if err not in (0, errno.EINPROGRESS, errno.EAGAIN):
            loop.call_soon(self._finish, None, OSError(err, os.strerror(err)))
            return
        self.fd = sock.fileno()
        loop.add(self.fd, WRITE, self._writable)
        self.timer = loop.call_later(timeout, self._expired, timeout)

    def _writable(self, events: int) -> None:
        code = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            self._finish(None, OSError(code, os.strerror(code)))
        else:
            self._finish(self.sock, None)

    def _expired(self, timeout: float) -> None:
        self._finish(None, TimeoutError(f"timed out after {timeout:g}s"))

    def _release(self) -> Optional[Callable[..., None]]:
        """Stop watching (once); return the callback, or None when already released."""
        done, self.done = self.done, None
        if done is not None and self.timer is not None:
            self.timer.cancel()
            self.loop.remove(self.fd)
        return done

    def _finish(self, sock: Optional[socket.socket], error: Optional[OSError]) -> None:
        done = self._release()
        if done is None:
            return
        if sock is None:
            self.sock.close()
        done(self, sock, error)

    def cancel(self) -> None:
        """Give up without calling back (the socket is closed)."""
        if self._release() is not None:
            self.sock.close()
