"""The proxy in front of fixtures/fake_openai_server.py (vLLM-like backends)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List, Tuple

from fixtures.fake_openai_server import (
    DEFAULT_MODEL,
    expected_completion,
)
from tests.conftest import REPO
from tests.unit.agent.proxy.harness import (
    WAIT,
    completion,
    dechunk,
    raw,
    wait_for,
)

# --------------------------------------------------------------------------------------
# Against fixtures/fake_openai_server.py (vLLM-like backends)


def test_skewed_latency_slow_backend_gets_fewer_requests(fake_servers, proxy) -> None:
    slow = fake_servers(token_latency=0.05)  # 5 tokens: ~0.25 s per request
    fast = fake_servers()
    p = proxy([slow.url, fast.url])
    statuses: List[int] = []

    def worker(n: int) -> None:
        for i in range(15):
            statuses.append(completion(p, f"w{n}-{i}", max_tokens=5)[0])

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert statuses == [200] * 60
    served = [b["requests"] for b in p.health()["backends"]]  # type: ignore[index]
    assert sum(served) == 60
    assert served[0] * 3 < served[1], served


def test_streaming_from_fake_server_is_ordered_and_not_buffered(fake_servers, proxy) -> None:
    be = fake_servers(token_latency=0.05)
    p = proxy([be.url])
    body = json.dumps({"model": DEFAULT_MODEL, "prompt": "tell", "max_tokens": 6, "stream": True})
    s = raw(p)
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body.encode())
    )
    data, arrivals = b"", []
    while b"0\r\n\r\n" not in data:
        piece = s.recv(65536)
        assert piece, "EOF before the end of the stream"
        data += piece
        arrivals.append((time.monotonic(), data.count(b"data: ")))
    s.close()
    events = [e for e in dechunk(data.partition(b"\r\n\r\n")[2]).split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    text = "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1])
    assert text == expected_completion(DEFAULT_MODEL, "tell", 6)
    # 6 tokens 50 ms apart: a buffering proxy would deliver them all at once
    first_event = next(t for t, n in arrivals if n >= 1)
    assert arrivals[-1][0] - first_event >= 0.15


def _spawn_fake_server(tmp_path: Path, name: str) -> Tuple[subprocess.Popen, str]:
    port_file = tmp_path / f"{name}.port"
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "fixtures" / "fake_openai_server.py"), "--port-file",
         str(port_file)],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_for(port_file.exists, what=f"{name} port file")
    return proc, f"http://127.0.0.1:{int(port_file.read_text())}"


def test_failover_when_a_backend_is_killed(proxy, tmp_path) -> None:
    victim, victim_url = _spawn_fake_server(tmp_path, "victim")
    survivor, survivor_url = _spawn_fake_server(tmp_path, "survivor")
    try:
        p = proxy([victim_url, survivor_url])
        for i in range(6):  # both backends used; the victim's connection is now pooled
            assert completion(p, f"before {i}")[0] == 200
        assert min(b["requests"] for b in p.health()["backends"]) > 0  # type: ignore[index]
        victim.kill()
        victim.wait(WAIT)
        for i in range(10):
            status, doc = completion(p, f"after {i}")
            assert status == 200, doc
            assert doc["choices"][0]["text"] == expected_completion(DEFAULT_MODEL, f"after {i}", 3)
        assert p.health()["backends"][0]["healthy"] is False  # type: ignore[index]
    finally:
        for proc in (victim, survivor):
            proc.kill()
            proc.wait(WAIT)


def test_backpressure_from_fake_server_queue(fake_servers, proxy) -> None:
    be = fake_servers(token_latency=0.1, max_concurrency=1)
    p = proxy([be.url], max_queued=1, metrics_interval=0.05)
    results: List[int] = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(completion(p, f"q{i}", 12)[0]))
        for i in range(3)
    ]
    for t in threads:
        t.start()
    # one request runs (1.2 s), two wait: vllm:num_requests_waiting 2 > max_queued 1
    wait_for(lambda: p.health()["backends"][0]["queued"] == 2, what="queue sample")  # type: ignore[index]
    status, doc = completion(p, "rejected")
    assert status == 429 and doc["error"]["type"] == "proxy_error"
    assert 'responses_429_total{source="proxy"} 1' in p.metrics_text()
    for t in threads:
        t.join(30)
    assert results == [200, 200, 200]


