"""Serving telemetry in the agent (issue 32): engine and proxy /metrics parsing, rates, the
size bound, and one sampling round against the fake engine."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from fixtures.fake_openai_server import serve_in_thread
from synthbatch.agent_stdlib.allocation.telemetry import (
    MAX_BYTES,
    MAX_POINTS,
    Telemetry,
    encode,
    interval_from_env,
    parse_engine_metrics,
    parse_proxy_metrics,
    parse_slots,
    point,
    replica_view,
)
from synthbatch.agent_stdlib.contracts import ReplicaTelemetry, TelemetryRecord
from synthbatch.agent_stdlib.proxy.config import ProxyConfig
from synthbatch.agent_stdlib.proxy.route import Router, Stats
from synthbatch.agent_stdlib.statefile import load_record

# as vLLM 0.32 (V1) exports them: gauges and counters, labelled by model and engine
VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 200.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 50.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 1000.0
"""
SGLANG = """\
sglang:num_running_reqs{model_name="m",tp_rank="0"} 5.0
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 2.0
sglang:token_usage{model_name="m",tp_rank="0"} 0.9
sglang:prompt_tokens_total{model_name="m"} 400.0
sglang:cached_tokens_total{model_name="m"} 100.0
sglang:generation_tokens_total{model_name="m"} 321.0
"""
LLAMACPP = """\
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 4
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 77
llamacpp:prompt_tokens_total 30
llamacpp:prompt_tokens_cached_total 10
"""


def test_vllm_names_parse_to_the_figures() -> None:
    engine, figures = parse_engine_metrics(VLLM) or ("", {})
    assert engine == "vllm"
    assert figures == {"running": 3.0, "waiting": 7.0, "kv": 0.42, "gen": 1000.0,
                       "queries": 200.0, "hits": 50.0}


def test_sglang_and_llamacpp_names_parse() -> None:
    assert parse_engine_metrics(SGLANG) == ("sglang", {
        "running": 5.0, "waiting": 2.0, "kv": 0.9, "gen": 321.0, "queries": 400.0,
        "hits": 100.0})
    engine, figures = parse_engine_metrics(LLAMACPP) or ("", {})
    assert engine == "llamacpp"
    assert (figures["running"], figures["waiting"], figures["gen"]) == (1.0, 4.0, 77.0)
    assert (figures["queries"], figures["hits"]) == (40.0, 10.0)  # evaluated + cached


def test_llamacpp_slots_count_the_busy_slots() -> None:
    slots = [{"id": 0, "is_processing": True}, {"id": 1, "is_processing": False},
             {"id": 2, "state": 1}, {"id": 3, "state": 0}]
    assert parse_slots(json.dumps(slots)) == ("llamacpp", {"running": 2.0})
    assert parse_slots("not json") is None
    assert parse_slots('{"error": 1}') is None


def test_text_without_engine_names_is_none() -> None:
    assert parse_engine_metrics("# nothing\nprocess_cpu_seconds_total 3\n") is None


def test_rates_come_from_the_counters_change() -> None:
    first = parse_engine_metrics(VLLM)
    later = parse_engine_metrics(VLLM.replace("} 1000.0", "} 1500.0")
                                 .replace("} 200.0", "} 400.0").replace("} 50.0", "} 200.0"))
    assert first is not None and later is not None
    view = replica_view("gen", "http://h:1", later, 110.0, (100.0, first), 4)
    assert view.gen_tokens_per_s == 50.0  # 500 tokens in 10 s
    assert view.prefix_hit_rate == 0.75  # 150 of the 200 tokens asked since
    assert (view.running, view.waiting, view.kv_cache_usage, view.proxy_in_flight) == \
        (3.0, 7.0, 0.42, 4)
    alone = replica_view("gen", "http://h:1", first, 100.0, None, None)
    assert alone.gen_tokens_per_s is None and alone.prefix_hit_rate == 0.25  # lifetime


def test_proxy_counters_from_the_proxys_own_renderer() -> None:
    router = Router(ProxyConfig(backends=["http://127.0.0.1:1", "http://127.0.0.1:2"]))
    router.backends[1].in_flight = 5
    stats = Stats(requests_total=9, retries_total=2, rejected_429_total=3,
                  passthrough_429_total=1)
    counters, flights = parse_proxy_metrics(router.metrics_text(stats, 0))
    assert (counters.requests, counters.retries, counters.responses_429) == (9, 2, 4)
    assert flights == {"http://127.0.0.1:1": 0, "http://127.0.0.1:2": 5}


def test_the_file_never_exceeds_the_bound_and_keeps_the_newest_points() -> None:
    replicas = tuple(ReplicaTelemetry(alias="gen", url=f"http://10.0.0.{i}:8000",
                                      running=123.0, waiting=456.0, kv_cache_usage=0.987654,
                                      gen_tokens_per_s=12345.67, proxy_in_flight=99)
                     for i in range(64))
    series = tuple(point(1e9 + i, replicas) for i in range(MAX_POINTS))
    record = TelemetryRecord(interval_s=5.0, updated_at=1e9, replicas=replicas, series=series)
    payload = encode(record)
    assert len(payload) <= MAX_BYTES
    kept = json.loads(payload)["series"]
    assert 0 < len(kept) < MAX_POINTS
    assert kept[-1]["at"] == series[-1].at  # the oldest went first


def test_one_hour_of_two_replicas_fits_well_within_the_bound() -> None:
    replicas = tuple(ReplicaTelemetry(alias="gen", url=f"http://10.0.0.{i}:8000",
                                      running=12.0, waiting=3.0, kv_cache_usage=0.5,
                                      gen_tokens_per_s=812.25, proxy_in_flight=16)
                     for i in range(2))
    series = tuple(point(1.7e9 + 5 * i, replicas) for i in range(MAX_POINTS))
    record = TelemetryRecord(interval_s=5.0, updated_at=1.7e9, replicas=replicas,
                             series=series)
    assert len(json.loads(encode(record))["series"]) == MAX_POINTS
    assert len(encode(record)) < MAX_BYTES // 10


def test_interval_from_the_environment() -> None:
    assert interval_from_env({}) == 5.0
    assert interval_from_env({"SYNTHBATCH_TELEMETRY_S": "0"}) == 0.0
    assert interval_from_env({"SYNTHBATCH_TELEMETRY_S": "0.5"}) == 0.5
    assert interval_from_env({"SYNTHBATCH_TELEMETRY_S": "soon"}) == 5.0


def test_a_sample_of_the_fake_engine_at_capacity(tmp_path: Path) -> None:
    """The fake engine's /metrics, in vLLM's names, read by one sampling round: one
    request runs (capacity 1), the others wait, and the KV model is full."""
    import http.client

    with serve_in_thread(model="fake-model", max_concurrency=1, token_latency=0.05) as srv:
        def ask() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
            body = json.dumps({"model": "fake-model", "prompt": "hi", "max_tokens": 20})
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            conn.getresponse().read()
            conn.close()
        threads = [threading.Thread(target=ask) for _ in range(4)]
        for t in threads:
            t.start()
        telemetry = Telemetry(tmp_path / "telemetry.json", interval=0)
        telemetry.start({"gen": [srv.url], "judge": ["http://127.0.0.1:9"]}, {})
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            telemetry.sample()
            if telemetry.last[("gen", srv.url)].waiting == 3.0:
                break
            time.sleep(0.02)
        for t in threads:
            t.join()
    record = load_record(tmp_path / "telemetry.json", TelemetryRecord)
    assert record is not None
    gen = next(r for r in record.replicas if r.alias == "gen")
    assert (gen.engine, gen.running, gen.waiting, gen.kv_cache_usage) == \
        ("vllm", 1.0, 3.0, 1.0)
    judge = next(r for r in record.replicas if r.alias == "judge")
    assert judge.engine == "" and judge.error  # unreachable: said, not raised
    assert record.series and record.started_at is not None
