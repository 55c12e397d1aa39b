"""Backpressure: queue samples, the 429 the proxy answers itself, routing around full backends."""

from __future__ import annotations

import json
import threading
import time
from typing import List

from synthbatch.agent_stdlib.proxy.config import ProxyConfig
from synthbatch.agent_stdlib.proxy.http import parse_queue_metric
from synthbatch.agent_stdlib.proxy.route import Router
from tests.unit.agent.proxy.harness import (
    WAIT,
    in_flight,
    request,
    wait_for,
)

# --------------------------------------------------------------------------------------
# Backpressure


def test_parse_queue_metric() -> None:
    text = (
        "# HELP vllm:num_requests_waiting Number of requests waiting.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 2\n'
        'vllm:num_requests_running{model_name="m"} 9\n'
        "garbage line\n"
    )
    assert parse_queue_metric(text) == 5.0
    assert parse_queue_metric("llamacpp:requests_deferred 4 1700000000\n") == 4.0
    assert parse_queue_metric("other 1\n") is None
    assert parse_queue_metric("vllm:num_requests_waiting NaN\n") is None


def test_backpressure_429_when_every_backend_is_over_max_queued(backends, proxy) -> None:
    metrics = 'vllm:num_requests_waiting{model_name="a"} 3\nvllm:num_requests_waiting{x="b"} 2\n'
    be = backends(metrics=metrics)
    p = proxy([be.url], max_queued=4)
    wait_for(lambda: p.health()["backends"][0]["queued"] == 5, what="metrics sample")  # type: ignore[index]
    status, headers, body = request(p)
    assert status == 429
    assert headers["retry-after"] == "1"
    assert json.loads(body)["error"]["type"] == "proxy_error"
    assert be.count == 0
    be.metrics = "vllm:num_requests_waiting 0\n"
    wait_for(lambda: p.health()["backends"][0]["queued"] == 0, what="metrics sample")  # type: ignore[index]
    assert request(p)[0] == 200


def test_backpressure_routes_to_backend_under_the_limit(backends, proxy) -> None:
    full = backends(metrics="vllm:num_requests_waiting 10\n")
    free = backends(metrics="vllm:num_requests_waiting 0\n")
    p = proxy([full.url, free.url], max_queued=4)
    wait_for(lambda: [b["queued"] for b in p.health()["backends"]] == [10, 0])  # type: ignore[index]
    for _ in range(4):
        assert request(p)[0] == 200
        wait_for(lambda: in_flight(p) == [0, 0])
    assert (full.count, free.count) == (0, 4)


def test_backpressure_uses_own_in_flight_without_backend_metric(backends, proxy) -> None:
    be = backends("hold", metrics=None)  # /metrics answers 404
    p = proxy([be.url], max_queued=0)
    wait_for(lambda: p.health()["backends"][0]["queued"] == 0)  # type: ignore[index]
    result: List[int] = []
    t = threading.Thread(target=lambda: result.append(request(p)[0]))
    t.start()
    wait_for(lambda: be.count == 1)
    assert request(p)[0] == 429
    be.release.set()
    t.join(WAIT)
    assert result == [200]


def test_backpressure_fails_open_when_metrics_are_broken(backends, proxy) -> None:
    be = backends(metrics="vllm:num_requests_waiting 99\n")
    be.metrics_status = 500
    p = proxy([be.url], max_queued=1)
    wait_for(lambda: "synthbatch_proxy_backend_queued" in p.metrics_text())
    time.sleep(0.3)  # let a few samples happen; none may block traffic
    assert request(p)[0] == 200


def test_pick_sheds_a_first_attempt_only_when_every_healthy_backend_is_over_the_limit() -> None:
    router = Router(ProxyConfig(backends=["http://127.0.0.1:1", "http://127.0.0.1:2"],
                                max_queued=2))
    now = 100.0
    a, b = router.backends
    for backend, waiting in ((a, 5.0), (b, 1.0)):
        backend.sample_ok_at, backend.sampled_waiting = now, waiting
    assert router.pick(0, now) is b  # the one under the limit
    b.sampled_waiting = 3.0
    assert router.pick(0, now) is None  # both over: shed, nothing counted in flight
    assert (a.in_flight, b.in_flight) == (0, 1)
    assert router.pick(1 << b.index, now) is a  # a failover is never shed
    b.down_until = now + 5  # the only healthy backend is over the limit: still shed
    assert router.pick(0, now) is None
    a.down_until = now + 5  # all down: tried anyway, over the limit or not
    assert router.pick(0, now) in (a, b)
    a.down_until = b.down_until = 0.0
    a.sample_ok_at = now - 60  # a stale sample is unknown: fail open
    assert router.pick(0, now) is a


