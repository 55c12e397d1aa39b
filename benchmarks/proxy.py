"""Benchmark of the endpoint proxy (agent_stdlib.proxy.main) against direct access and nginx.

Same machine, same run, same backends. The proxy under test (ours, or the nginx
``least_conn`` anchor) is pinned to one core, the load generators and backends to another
(``taskset``). Everything listens on 127.0.0.1 only and stops by itself.

* short requests: a private nginx instance returns a small JSON body (2 backends);
  load = ``wrk`` with a small JSON POST at 32 and 128 connections;
* streaming: a small asyncio SSE server (2 backends) sends events paced like token
  streaming; load = a stdlib asyncio client with 64 and 128 concurrent streams.

Usage: ``python benchmarks/proxy.py [--quick]`` (needs ``nginx``, ``wrk`` and ``taskset``;
Debian: ``apt-get install -y nginx wrk``). Prints a table and the ratios vs the goals of
issue 6.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
SHORT_BODY = '{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"ok"}]}'
POST_LUA = """wrk.method = "POST"
wrk.body = '{"model":"m","prompt":"hello","max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
"""
STREAM_REQ_BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'
TICKS = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------------------
# SSE backend (runs as a subprocess: ``proxy.py --serve-sse PORT,PORT EVENTS INTERVAL``)


async def _sse_handle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, events: int, interval: float
) -> None:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            match = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
            if match:
                await reader.readexactly(int(match.group(1)))
            if head.startswith(b"GET /metrics"):
                body = b"vllm:num_requests_waiting 0\n"
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                continue
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            for seq in range(events):
                if seq:
                    await asyncio.sleep(interval)
                event = (
                    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","seq":%d,'
                    b'"choices":[{"index":0,"delta":{"content":" tok"}}]}\n\n' % seq
                )
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            done = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


def serve_sse(ports: List[int], events: int, interval: float) -> None:
    """Run the SSE backends until SIGTERM."""

    async def run() -> None:
        servers = [
            await asyncio.start_server(
                lambda r, w: _sse_handle(r, w, events, interval), HOST, port, backlog=1024
            )
            for port in ports
        ]
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        print("ready", flush=True)
        await stop.wait()
        for server in servers:
            server.close()

    asyncio.run(run())


# --------------------------------------------------------------------------------------
# Streaming load generator


@dataclass
class StreamResult:
    events: int = 0
    lost: int = 0
    errors: int = 0
    streams: int = 0
    ttfe: List[float] = field(default_factory=list)
    window: Tuple[float, float] = (0.0, 0.0)  # events/s counts only events inside it
    in_window: int = 0

    @property
    def rate(self) -> float:
        return self.in_window / (self.window[1] - self.window[0])


async def _stream_worker(port: int, until: float, expect: int, res: StreamResult) -> None:
    req = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s"
        % (HOST.encode(), port, len(STREAM_REQ_BODY), STREAM_REQ_BODY)
    )
    reader: Optional[asyncio.StreamReader] = None
    writer: Optional[asyncio.StreamWriter] = None
    while time.monotonic() < until:
        got = 0
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(HOST, port, limit=1 << 20)
                writer.get_extra_info("socket").setsockopt(
                    socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
                )
            assert reader is not None
            start = time.perf_counter()
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise ValueError(head[:60])
            buf, first, last_seq = b"", True, -1
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await reader.readline()
                    break
                buf += (await reader.readexactly(size + 2))[:-2]
                *complete, buf = buf.split(b"\n\n")
                for event in complete:
                    if event == b"data: [DONE]":
                        continue
                    seq = int(event[event.index(b'"seq":') + 6 : event.index(b',"choices"')])
                    if seq != last_seq + 1:
                        raise ValueError(f"event {seq} after {last_seq}")
                    last_seq = seq
                    got += 1
                    now = time.monotonic()
                    if res.window[0] <= now < res.window[1]:
                        res.in_window += 1
                    if first:
                        res.ttfe.append(time.perf_counter() - start)
                        first = False
            res.events += got
            res.lost += expect - got
            res.streams += 1
        except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
            res.errors += 1
            res.events += got
            res.lost += expect - got
            print(f"  stream error: {exc!r}", file=sys.stderr)
            if writer is not None:
                writer.close()
            writer = None
            await asyncio.sleep(0.05)
    if writer is not None:
        writer.close()


def run_streams(port: int, streams: int, seconds: float, expect: int) -> StreamResult:
    """Run ``streams`` concurrent streaming clients for about ``seconds``.

    Events/s is measured in a window that skips the first half second (ramp-up) and ends
    before the last streams drain.
    """
    res = StreamResult()

    async def main() -> None:
        start = time.monotonic()
        until = start + seconds
        res.window = (start + 0.5, until)
        await asyncio.gather(*(_stream_worker(port, until, expect, res) for _ in range(streams)))

    asyncio.run(main())
    return res


# --------------------------------------------------------------------------------------
# Processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def cpu_times(pids: List[int]) -> Tuple[float, float]:
    """(utime, stime) seconds of processes (all threads) from /proc/<pid>/stat."""
    user = system = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        user += int(fields[11])
        system += int(fields[12])
    return user / TICKS, system / TICKS


def cpu_seconds(pids: List[int]) -> float:
    """utime + stime of processes (all threads)."""
    return sum(cpu_times(pids))


class Procs:
    """Children started by the benchmark, each in its own session; stopped at the end."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.children: List[subprocess.Popen] = []

    def start(self, name: str, cpu: str, argv: List[str], **kw: object) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            ["taskset", "-c", cpu, *argv], stdout=kw.pop("stdout", log), stderr=log,
            start_new_session=True, **kw,  # type: ignore[arg-type]
        )  # fmt: skip
        self.children.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def stop_all(self) -> None:
        for proc in reversed(self.children):
            self.stop(proc)


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((HOST, port), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


PYTHON_BUILD = (
    "import sys; maps = open('/proc/self/maps').read(); "
    "print(sys.version.split()[0], sys.executable, "
    "'(libpython shared)' if 'libpython' in maps else '(libpython static)')"
)


def describe_python(python: str) -> str:
    """Version, path and build of an interpreter (a shared libpython costs ~10% here)."""
    done = subprocess.run([python, "-c", PYTHON_BUILD], capture_output=True, text=True)
    return done.stdout.strip() or f"{python} (cannot run: {done.stderr.strip()[:80]})"


def nginx_conf(workdir: Path, name: str, http_block: str) -> Path:
    tmp = workdir / f"{name}-tmp"
    tmp.mkdir(exist_ok=True)
    conf = workdir / f"{name}.conf"
    conf.write_text(
        f"""worker_processes 1;
daemon off;
master_process on;
pid {workdir}/{name}.pid;
error_log {workdir}/{name}-error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fcgi; uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  keepalive_requests 100000000; keepalive_timeout 120s;
{http_block}
}}
"""
    )
    return conf


def start_nginx(procs: Procs, name: str, cpu: str, conf: Path) -> Tuple[subprocess.Popen, int]:
    proc = procs.start(
        name, cpu, ["nginx", "-p", str(procs.workdir), "-e", str(conf) + ".err", "-c", str(conf)]
    )
    deadline = time.monotonic() + 10
    while True:  # the worker's pid, for CPU accounting
        kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        text = kids.read_text().split() if kids.exists() else []
        if text:
            return proc, int(text[0])
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"nginx {name} did not start; see {conf}.err")
        time.sleep(0.05)


def start_our_proxy(
    procs: Procs, name: str, cpu: str, backends: List[int], python: str, floor: bool = False
) -> Tuple[subprocess.Popen, int]:
    """Start ``python -m agent_stdlib proxy`` (or, with ``floor``, benchmarks/proxy_floor.py)."""
    port_file = procs.workdir / f"{name}.port"
    if floor:
        argv = [python, str(REPO / "benchmarks" / "proxy_floor.py"), str(port_file)]
        argv += [str(port) for port in backends]
    else:
        argv = [python, "-m", "agent_stdlib", "proxy", "--listen", f"{HOST}:0"]
        argv += ["--port-file", str(port_file), "--max-queued", "1000"]
        for port in backends:
            argv += ["--backend", f"http://{HOST}:{port}"]
    proc = procs.start(name, cpu, argv, cwd=str(REPO))
    deadline = time.monotonic() + 10
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"proxy did not start; see {procs.workdir}/{name}.log")
        time.sleep(0.05)
    return proc, int(port_file.read_text())


# --------------------------------------------------------------------------------------
# wrk


def parse_duration(text: str) -> float:
    """wrk duration ("435.00us", "1.2ms", "2.00s") in milliseconds."""
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if not match:
        raise ValueError(text)
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[match.group(2)]
    return float(match.group(1)) * scale


def run_wrk(cpu: str, port: int, conns: int, seconds: float, lua: Path) -> Dict[str, float]:
    out = subprocess.run(
        ["taskset", "-c", cpu, "wrk", "-t1", f"-c{conns}", f"-d{seconds:g}s", "--latency",
         "-s", str(lua), f"http://{HOST}:{port}/v1/completions"],
        check=True, capture_output=True, text=True, timeout=seconds + 30,
    ).stdout  # fmt: skip
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)$", out, re.M))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    for problem in (errors, socket_errors):
        if problem:
            print(f"  wrk on port {port}: {problem.group(0)}")
    return {"rps": rps, "p50": parse_duration(lat["50"]), "p99": parse_duration(lat["99"])}


# --------------------------------------------------------------------------------------
# Main


def median(values: List[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (~40 s)")
    parser.add_argument("--proxy-cpu", default="0", help="core of the proxy under test")
    parser.add_argument("--load-cpu", default="1", help="core of load generators and backends")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds per load")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per wrk run")
    parser.add_argument("--events", type=int, default=40, help="SSE events per stream")
    parser.add_argument("--interval", type=float, default=0.01, help="seconds between events")
    parser.add_argument(
        "--python", default=sys.executable,
        help="interpreter of our proxy and the floor (default: this one); the header names its "
        "version and build",
    )  # fmt: skip
    parser.add_argument("--serve-sse", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_sse:
        serve_sse([int(p) for p in args.serve_sse.split(",")], args.events, args.interval)
        return 0
    for tool in ("nginx", "wrk", "taskset"):
        if shutil.which(tool) is None:
            print(f"missing {tool} (Debian: apt-get install -y nginx wrk util-linux)")
            return 2
    rounds = args.rounds or (1 if args.quick else 3)
    seconds = args.seconds or (2.0 if args.quick else 5.0)
    stream_seconds = 3.0 if args.quick else 6.0
    os.sched_setaffinity(0, {int(args.load_cpu)})
    with tempfile.TemporaryDirectory(prefix="proxy-bench-") as tmp:
        procs = Procs(Path(tmp))
        try:
            return run(procs, args, rounds, seconds, stream_seconds)
        finally:
            procs.stop_all()


def run(
    procs: Procs, args: argparse.Namespace, rounds: int, seconds: float, stream_seconds: float
) -> int:
    work, pcpu, lcpu = procs.workdir, args.proxy_cpu, args.load_cpu
    lua = work / "post.lua"
    lua.write_text(POST_LUA)
    short = [free_port(), free_port()]
    sse = [free_port(), free_port()]
    ngx_short, ngx_sse = free_port(), free_port()
    servers = "\n".join(
        f"  server {{ listen {HOST}:{p}; location / {{ default_type application/json; "
        f"return 200 '{SHORT_BODY}'; }} }}"
        for p in short
    )
    start_nginx(procs, "backends", lcpu, nginx_conf(work, "backends", servers))
    sse_proc = procs.start(
        "sse", lcpu,
        [sys.executable, "-I", str(Path(__file__).resolve()), "--serve-sse",
         ",".join(map(str, sse)), "--events", str(args.events), "--interval", str(args.interval)],
    )  # fmt: skip
    proxy_block = ""
    for name, ports, listen in (("short", short, ngx_short), ("sse", sse, ngx_sse)):
        members = " ".join(f"server {HOST}:{p};" for p in ports)
        proxy_block += (
            f"  upstream {name} {{ least_conn; {members} keepalive 256; }}\n"
            f"  server {{ listen {HOST}:{listen}; location / {{ proxy_pass http://{name}; "
            'proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; '
            "proxy_request_buffering off; } }\n"
        )
    _, ngx_worker = start_nginx(
        procs, "nginx-proxy", pcpu, nginx_conf(work, "nginx-proxy", proxy_block)
    )
    for port in short + sse + [ngx_short, ngx_sse]:
        wait_port(port)
    print(
        f"proxy python: {describe_python(args.python)}; proxy on cpu {pcpu}, "
        f"load+backends on cpu {lcpu}, "
        f"{rounds} round(s), wrk {seconds:g}s, streams {stream_seconds:g}s "
        f"({args.events} events every {args.interval * 1000:g} ms)"
    )

    # ---- short requests -----------------------------------------------------------------
    ours, ours_port = start_our_proxy(procs, "proxy-short", pcpu, short, args.python)
    floor, floor_port = start_our_proxy(procs, "floor", pcpu, short, args.python, floor=True)
    targets = {
        "direct": (short[0], []),
        "nginx": (ngx_short, [ngx_worker]),
        "proxy": (ours_port, [ours.pid]),
        "floor": (floor_port, [floor.pid]),
    }
    for port, _ in targets.values():  # warm-up
        run_wrk(lcpu, port, 32, 1.0, lua)
    short_rows: Dict[Tuple[str, int], List[Dict[str, float]]] = {}
    for conns in (32, 128):
        for _ in range(rounds):
            for name, (port, pids) in targets.items():
                user0, sys0 = cpu_times(pids)
                r = run_wrk(lcpu, port, conns, seconds, lua)
                user1, sys1 = cpu_times(pids)
                count = r["rps"] * seconds / 1e6
                r["user_req"] = (user1 - user0) / count if pids else float("nan")
                r["us_req"] = r["user_req"] + (sys1 - sys0) / count if pids else float("nan")
                short_rows.setdefault((name, conns), []).append(r)
    procs.stop(ours)
    procs.stop(floor)

    # ---- streaming ----------------------------------------------------------------------
    ours, ours_port = start_our_proxy(procs, "proxy-sse", pcpu, sse, args.python)
    stargets = {
        "direct": (sse[0], []),
        "nginx": (ngx_sse, [ngx_worker]),
        "proxy": (ours_port, [ours.pid]),
    }
    run_streams(ours_port, 8, 1.0, args.events)  # warm-up
    stream_rows: Dict[Tuple[str, int], List[Dict[str, float]]] = {}
    for streams in (64, 128):
        for _ in range(max(1, rounds - 1)):
            for name, (port, pids) in stargets.items():
                cpu0 = cpu_seconds(pids) if pids else 0.0
                res = run_streams(port, streams, stream_seconds, args.events)
                cpu = cpu_seconds(pids) - cpu0 if pids else float("nan")
                stream_rows.setdefault((name, streams), []).append({
                    "eps": res.rate, "lost": res.lost, "errors": res.errors,
                    "ttfe": median(res.ttfe) * 1e3, "us_event": cpu / max(1, res.events) * 1e6,
                })  # fmt: skip
    procs.stop(ours)
    procs.stop(sse_proc)
    return report(short_rows, stream_rows)


def report(short_rows: Dict, stream_rows: Dict) -> int:
    def med(rows: Dict, key: Tuple[str, int], name: str) -> float:
        return median([r[name] for r in rows[key]])

    def order(kv: Tuple[Tuple[str, int], List]) -> Tuple[int, str]:
        return kv[0][1], kv[0][0]

    print("\nshort requests (wrk, JSON POST), medians over rounds")
    print(
        f"{'target':8} {'conns':>5} {'req/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'cpu us/req':>10} "
        f"{'of it user':>10}"
    )
    for k, _ in sorted(short_rows.items(), key=order):
        cells = [med(short_rows, k, f) for f in ("rps", "p50", "p99", "us_req", "user_req")]
        print(
            f"{k[0]:8} {k[1]:>5} {cells[0]:>9.0f} {cells[1]:>7.2f} {cells[2]:>7.2f} "
            f"{cells[3]:>10.1f} {cells[4]:>10.1f}"
        )
    print("\nstreaming (SSE), medians over rounds")
    print(
        f"{'target':8} {'streams':>7} {'events/s':>9} {'lost':>5} {'errors':>6} "
        f"{'ttfe p50 ms':>11} {'cpu us/ev':>9}"
    )
    for k, rows in sorted(stream_rows.items(), key=order):
        lost, errors = sum(r["lost"] for r in rows), sum(r["errors"] for r in rows)
        eps, ttfe, cpu = (med(stream_rows, k, f) for f in ("eps", "ttfe", "us_event"))
        print(f"{k[0]:8} {k[1]:>7} {eps:>9.0f} {lost:>5} {errors:>6} {ttfe:>11.2f} {cpu:>9.1f}")
    print("\nratios vs goals (issue 6)")
    results = []

    def goal(ok: bool, text: str) -> None:
        results.append(ok)
        print(f"  {'ok  ' if ok else 'MISS'} {text}")

    for conns in (32, 128):
        pairs = zip(short_rows[("proxy", conns)], short_rows[("nginx", conns)])
        per_round = [p["rps"] / n["rps"] for p, n in pairs]
        ratio = median(per_round)
        rounds = ", ".join(f"{r:.2f}" for r in per_round)
        goal(ratio >= 0.6, f"short req/s / nginx @{conns}: {ratio:.2f} (>= 0.6; rounds {rounds})")
        ours = med(short_rows, ("proxy", conns), "us_req")
        base = med(short_rows, ("floor", conns), "us_req")
        print(f"  info CPU per request @{conns}: proxy {ours:.1f} us = floor {base:.1f} us (loop, "
              f"sockets, kernel) + {ours - base:.1f} us of HTTP handling; nginx "
              f"{med(short_rows, ('nginx', conns), 'us_req'):.1f} us")
    p50, p99 = med(short_rows, ("proxy", 32), "p50"), med(short_rows, ("proxy", 32), "p99")
    p99_128 = med(short_rows, ("proxy", 128), "p99")
    goal(p50 <= 1.5, f"latency @32 p50 {p50:.2f} ms (<= 1.5)")
    goal(p99 <= 3.0, f"latency @32 p99 {p99:.2f} ms (<= 3)")
    goal(p99_128 <= 10.0, f"latency @128 p99 {p99_128:.2f} ms (<= 10)")
    for streams in (64, 128):
        key, direct = ("proxy", streams), ("direct", streams)
        ratio = med(stream_rows, key, "eps") / med(stream_rows, direct, "eps")
        lost = sum(r["lost"] + r["errors"] for r in stream_rows[key])
        delta = med(stream_rows, key, "ttfe") - med(stream_rows, direct, "ttfe")
        cpu = med(stream_rows, key, "us_event")
        goal(ratio >= 0.97, f"events/s / direct @{streams}: {ratio:.3f} (>= 0.97)")
        goal(lost == 0, f"lost events + failed streams @{streams}: {lost} (0)")
        goal(delta <= 1.5, f"TTFE p50 delta vs direct @{streams}: {delta:+.2f} ms (<= 1.5)")
        goal(cpu <= 25, f"proxy CPU per event @{streams}: {cpu:.1f} us (<= 25)")
    print(json.dumps({"goals_met": sum(results), "goals": len(results)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
