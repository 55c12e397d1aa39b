"""Prefix-cache reuse and the proxy's affinity counters in ``progress.json`` (issue 30)."""

from __future__ import annotations

import http.client

from fixtures.fake_openai_server import DEFAULT_MODEL, serve_in_thread
from synthbatch.agent_stdlib.client.cachestats import (
    ProxySampler,
    cache_view,
    cached_tokens,
    parse_proxy_metrics,
)
from synthbatch.agent_stdlib.client.concurrency import Limiter
from synthbatch.agent_stdlib.client.progress import AliasCounters
from synthbatch.agent_stdlib.contracts import CacheProgress, ProgressRecord
from synthbatch.agent_stdlib.proxy.config import ProxyConfig
from synthbatch.agent_stdlib.proxy.main import Proxy
from synthbatch.agent_stdlib.proxy.route import Router, Stats


def test_cached_tokens_from_llamacpp_timings_and_openai_usage() -> None:
    assert cached_tokens({"timings": {"cache_n": 58, "prompt_n": 42}}) == 58
    assert cached_tokens({"usage": {"prompt_tokens_details": {"cached_tokens": 7}}}) == 7
    for data in ({}, None, {"timings": {"cache_n": True}}, {"timings": {"cache_n": -3}},
                 {"usage": {"prompt_tokens_details": "x"}}):
        assert cached_tokens(data) == 0


def test_the_proxys_own_metrics_parse_back_to_its_counters() -> None:
    router = Router(ProxyConfig(backends=["http://127.0.0.1:1", "http://127.0.0.1:2"]))
    router.backends[0].prefix_cache = (100.0, 94.0)
    text = router.metrics_text(Stats(affinity_hits_total=120, affinity_fallbacks_total=3), 0)
    assert parse_proxy_metrics(text) == (120, 3, {"http://127.0.0.1:1": 0.94})
    assert parse_proxy_metrics("garbage\nsynthbatch_proxy_affinity_total 5\n") == (0, 0, {})


def test_the_alias_figures_carry_cached_tokens_and_round_trip() -> None:
    counters = AliasCounters(Limiter(4, 8))
    counters.answered({"prompt_tokens": 100}, cached=58)
    counters.answered({"prompt_tokens": 100}, cached=0)
    view = counters.view()
    assert view.tokens_in == 200 and view.cache.prompt_tokens_cached == 58
    record = ProgressRecord(records_done=1, records_total=2, tokens=0, requests_per_s=0.0,
                            updated_at=1.0, aliases={"gen": view})
    assert ProgressRecord.from_dict(record.to_dict()) == record
    old = record.to_dict()
    del old["aliases"]["gen"]["cache"]  # a generator from before: the default
    assert ProgressRecord.from_dict(old).aliases["gen"].cache == CacheProgress()


def test_the_sampler_reads_affinity_counters_from_a_running_proxy() -> None:
    engine = serve_in_thread()
    proxy = Proxy(ProxyConfig(backends=[f"http://127.0.0.1:{engine.port}"]))
    proxy.start()
    try:
        for _ in range(3):
            conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
            conn.request("POST", "/v1/chat/completions",
                         body=(b'{"model": "%s", "messages": [{"role": "user", '
                               b'"content": "hi"}], "max_tokens": 2}' % DEFAULT_MODEL.encode()),
                         headers={"Content-Type": "application/json",
                                  "X-Synthbatch-Affinity": "record-1"})
            assert conn.getresponse().status == 200
            conn.close()
        sampler = ProxySampler(f"http://127.0.0.1:{proxy.port}")
        sampler.sample()
        view = cache_view(5, sampler)
        assert (view.affinity_hits, view.affinity_fallbacks) == (3, 0)
        assert view.prompt_tokens_cached == 5
    finally:
        proxy.stop()
        engine.stop()


def test_the_sampler_keeps_its_figures_when_the_endpoint_is_gone() -> None:
    sampler = ProxySampler("http://127.0.0.1:9")
    sampler.latest = (1, 2, {})
    sampler.sample()
    assert sampler.latest == (1, 2, {})
