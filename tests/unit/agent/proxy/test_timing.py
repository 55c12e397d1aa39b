"""The proxy's queue and upstream seconds (issue 32: where a request's time goes)."""

from __future__ import annotations

import json

from synthbatch.agent_stdlib.allocation.telemetry import parse_proxy_metrics
from tests.unit.agent.proxy.harness import request


def test_proxied_answers_are_timed_before_and_after_forwarding(proxy, fake_servers) -> None:
    server = fake_servers(model="fake-model", token_latency=0.02)
    p = proxy([server.url])
    body = json.dumps({"model": "fake-model", "prompt": "hi", "max_tokens": 5}).encode()
    for _ in range(3):
        assert request(p, body=body)[0] == 200
    assert request(p, method="GET", path="/health")[0] == 200  # the proxy's own: not timed
    counters, _ = parse_proxy_metrics(p.metrics_text())
    assert counters.timed == 3
    # the engine sleeps 5 x 0.02 s per answer: at least that much is upstream time
    assert counters.upstream_s >= 3 * 5 * 0.02
    assert 0.0 <= counters.queue_s < counters.upstream_s
