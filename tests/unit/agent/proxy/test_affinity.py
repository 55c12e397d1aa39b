"""Affinity routing: consistent hashing with bounded loads on X-Synthbatch-Affinity."""

from __future__ import annotations

import json
import math
import random

from synthbatch.agent_stdlib.contracts import AFFINITY_HEADER
from synthbatch.agent_stdlib.proxy.config import ProxyConfig
from synthbatch.agent_stdlib.proxy.http import HOP_BY_HOP, parse_head, parse_prefix_cache
from synthbatch.agent_stdlib.proxy.route import LOAD_BOUND, Router, Stats, affinity_key, rendezvous
from tests.unit.agent.proxy.harness import request, wait_for

NOW = 100.0


def router(n: int = 4) -> Router:
    return Router(ProxyConfig(backends=[f"http://127.0.0.1:{i + 1}" for i in range(n)]))


def test_affinity_key_is_read_from_the_head_in_any_case_and_not_forwarded() -> None:
    head = parse_head(b"POST / HTTP/1.1\r\nX-Synthbatch-Affinity: rec-7\r\nAccept: */*")
    assert head.affinity == b"rec-7" and b"ffinity" not in head.block.lower()
    assert parse_head(b"POST / HTTP/1.1\r\nx-synthbatch-affinity:abc").affinity == b"abc"
    assert parse_head(b"POST / HTTP/1.1\r\nAccept: */*").affinity == b""
    assert affinity_key(b"rec-7") == b"rec-7"
    assert affinity_key(b"two words") is None  # not a token
    assert affinity_key(b"k" * 129) is None
    assert affinity_key(b"") is None
    assert AFFINITY_HEADER.lower().encode() in HOP_BY_HOP  # the contract's name, one spelling


def test_rendezvous_order_is_stable_and_moves_only_a_removed_backends_keys() -> None:
    keys = [b"key-%d" % i for i in range(400)]
    four = {k: rendezvous(k, 4) for k in keys}
    assert all(rendezvous(k, 4) == four[k] for k in keys)
    homes = [four[k][0] for k in keys]
    assert all(homes.count(i) > 60 for i in range(4))  # spread over every backend


def test_same_key_sticks_to_one_backend_while_loads_are_even() -> None:
    r, stats = router(), Stats()
    chosen = set()
    for i in range(200):  # every other request done: loads stay low and even
        key = b"record-%d" % (i % 20)
        b = r.pick_affine(key, 0, NOW, stats)
        chosen.add((key, b.index))
        b.in_flight -= 1
    assert len(chosen) == 20  # each key always on one backend
    assert stats.affinity_hits_total == 200 and stats.affinity_fallbacks_total == 0


def test_the_load_bound_holds_with_one_hot_key() -> None:
    r, stats = router(), Stats()
    for _ in range(400):  # nothing finishes: one key would otherwise take everything
        r.pick_affine(b"one-system-prompt", 0, NOW, stats)
        loads = [b.in_flight for b in r.backends]
        assert max(loads) <= math.ceil(LOAD_BOUND * sum(loads) / len(loads))
    assert stats.affinity_fallbacks_total > 0
    home = r.backends[rendezvous(b"one-system-prompt", 4)[0]]
    assert home.in_flight == math.ceil(LOAD_BOUND * 100)  # its bound; the rest spread


def test_the_load_bound_holds_under_random_keys_and_completions() -> None:
    r, stats, rng = router(), Stats(), random.Random(1)
    live = []
    for _ in range(5000):
        live.append(r.pick_affine(b"k%d" % rng.randrange(50), 0, NOW, stats))
        loads = [b.in_flight for b in r.backends]
        assert max(loads) <= math.ceil(LOAD_BOUND * sum(loads) / len(loads))
        if len(live) > 64:
            live.pop(rng.randrange(len(live))).in_flight -= 1


def test_fallback_is_least_connections_when_the_home_is_over_the_bound() -> None:
    r, stats = router(), Stats()
    home = r.backends[rendezvous(b"k", 4)[0]]
    home.in_flight = 10
    got = r.pick_affine(b"k", 0, NOW, stats)
    assert got is not home and got.in_flight == 1
    assert (stats.affinity_hits_total, stats.affinity_fallbacks_total) == (0, 1)


def test_a_down_or_tried_home_passes_the_key_to_its_next_backend() -> None:
    r, stats = router(), Stats()
    order = rendezvous(b"k", 4)
    r.backends[order[0]].down_until = NOW + 5
    assert r.pick_affine(b"k", 0, NOW, stats).index == order[1]
    r.backends[order[0]].down_until = 0.0
    r.backends[order[1]].in_flight = 0
    assert r.pick_affine(b"k", 1 << order[0], NOW, stats).index == order[1]
    assert stats.affinity_fallbacks_total == 0


def test_proxy_routes_keyed_requests_to_one_backend_and_counts_them(backends, proxy) -> None:
    bes = [backends() for _ in range(3)]
    p = proxy([be.url for be in bes])
    for _ in range(9):
        assert request(p, headers={AFFINITY_HEADER: "record-1"})[0] == 200
    assert sorted(be.count for be in bes) == [0, 0, 9]
    for _ in range(6):  # no key: today's least-connections, round-robin on ties
        assert request(p)[0] == 200
    assert sorted(be.count for be in bes) == [2, 2, 11]
    status, _, body = request(p, method="GET", path="/metrics")
    assert 'synthbatch_proxy_affinity_total{result="hit"} 9' in body.decode()
    assert 'synthbatch_proxy_affinity_total{result="fallback"} 0' in body.decode()


def test_parse_prefix_cache_sums_vllms_counters() -> None:
    text = ('vllm:prefix_cache_queries_total{engine="0"} 100.0\n'
            'vllm:prefix_cache_queries_total{engine="1"} 60\n'
            'vllm:prefix_cache_hits_total{engine="0"} 40\n')
    assert parse_prefix_cache(text) == (160.0, 40.0)
    assert parse_prefix_cache("vllm:num_requests_waiting 1\n") is None


def test_proxy_shows_each_backends_prefix_cache_hit_ratio(fake_servers, proxy) -> None:
    server = fake_servers(cache_blocks=100, block_tokens=4)
    p = proxy([server.url], metrics_interval=0.05, max_queued=64)  # sampled with a limit
    body = json.dumps({"model": "fake-model", "max_tokens": 1, "messages": [
        {"role": "user", "content": "one two three four five six seven"}]}).encode()
    for _ in range(2):  # 8 tokens each ("<user>" and 7 words); the second hits 8
        assert request(p, path="/v1/chat/completions", body=body)[0] == 200
    wanted = f'synthbatch_proxy_backend_prefix_cache_hit_ratio{{backend="{server.url}"}} 0.5'
    wait_for(lambda: wanted in request(p, method="GET", path="/metrics")[2].decode(),
             what="a metrics sample with the hit ratio")


def test_a_key_is_shed_like_any_request_when_every_backend_is_over_its_queue_limit() -> None:
    r = Router(ProxyConfig(backends=["http://127.0.0.1:1", "http://127.0.0.1:2"],
                           max_queued=2))
    stats = Stats()
    for b, waiting in zip(r.backends, (5.0, 3.0)):
        b.sample_ok_at, b.sampled_waiting = NOW, waiting
    assert r.pick_affine(b"k", 0, NOW, stats) is None  # 429, as without a key
    assert stats.affinity_fallbacks_total == 1


def test_parse_prefix_cache_reads_llamacpps_cached_tokens() -> None:
    # as llama-server --metrics prints them (xllamacpp, SmolLM2): evaluated and cached
    text = ("# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 1195\n"
            "llamacpp:prompt_tokens_cached_total 1179\nllamacpp:tokens_predicted_total 8\n")
    assert parse_prefix_cache(text) == (2374.0, 1179.0)
