"""Concurrency per alias: the latency-aware limit alone (fed synthetic latencies of an
engine that slows down past its capacity), the limiter, and against a server that answers
429 above its capacity (backpressure slows the generator down and never uses up a
retry)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import List

import pytest

from fixtures.fake_openai_server import serve_in_thread
from synthbatch.agent_stdlib.client import concurrency
from synthbatch.agent_stdlib.client.concurrency import (
    NOISE_FLOOR_S,
    LatencyLimit,
    Limiter,
    Rounds,
)
from synthbatch.agent_stdlib.client.generate import Shard, limiters, run_shard, window
from synthbatch.agent_stdlib.client.output import Output
from synthbatch.agent_stdlib.client.progress import Progress
from synthbatch.agent_stdlib.client.recipe import compile_recipe
from synthbatch.agent_stdlib.contracts import ColumnSpec, ShardSpec
from synthbatch.agent_stdlib.resume import KeptRecords
from tests.agent_runs import recipe_plan

ONE = (ColumnSpec("text", "llm-text", {"model": "gen", "prompt": "Item {index}.",
                                       "max_tokens": 4}),)


def test_slow_start_then_one_halving_per_round_trip(monkeypatch) -> None:
    now = [100.0]
    monkeypatch.setattr(concurrency.time, "monotonic", lambda: now[0])
    limiter = Limiter(start=4, ceiling=10)
    for _ in range(10):
        limiter.succeeded(now[0] - 1.0)  # every answer as fast as the fastest
    assert limiter.current == 10 and limiter.slow_start  # +1 per answer, capped
    sent = 99.0
    limiter.congested(sent)
    assert limiter.current == 5 and not limiter.slow_start
    now[0] = 101.0
    limiter.congested(sent)  # sent before the halving: the same congestion, seen late
    assert limiter.current == 5
    limiter.congested(100.5)  # sent after it: new congestion
    assert limiter.current == 2
    for _ in range(2):
        limiter.succeeded(now[0] - 1.0)  # toward what is out (1) + sqrt(limit): no growth
    assert limiter.current == 2          # past what the client actually uses
    for _ in range(20):
        limiter.congested(now[0])
        now[0] += 1
    assert limiter.current == 1  # never below one


def engine_latency(in_flight: float, capacity: int, service_s: float = 1.0,
                   slowdown: float = 0.05) -> float:
    """An engine that runs ``capacity`` requests at once and queues the rest (FIFO), and
    slows down while they queue (the fake server's ``overload_factor``): by Little's law a
    request's latency is its service time x ``in_flight / capacity`` past the knee."""
    queued = max(0.0, in_flight - capacity)
    return service_s * max(1.0, in_flight / capacity) * (1 + slowdown * queued / capacity)


def settle(limit: LatencyLimit, capacity: int, rounds: int = 60) -> List[float]:
    """Feed ``rounds`` round trips of answers, one per request in flight; the limit after
    each that does not end inside a probe. In the first the engine's queue fills from
    empty, so its answers come back in waves of ``capacity`` (FIFO); later ones all wait
    behind the standing queue."""
    seen = []
    sent_at = 0.0  # the round's requests all leave together, at the last round's end
    for number in range(rounds):
        in_flight = max(1, int(limit.limit))
        steady = engine_latency(in_flight, capacity)
        unqueued = steady / max(1.0, in_flight / capacity)
        now = sent_at
        for position in range(in_flight):
            latency = unqueued * (position // capacity + 1) if number == 0 else steady
            now = sent_at + latency
            limit.answered(latency, in_flight, now=now)
        sent_at = now
        if not limit.probe_left:
            seen.append(limit.limit)
    return seen


@pytest.mark.parametrize("capacity", [16, 128, 512])
@pytest.mark.parametrize("start", [4, 128])
def test_the_limit_settles_near_the_engines_knee(capacity: int, start: int) -> None:
    """From below (slow start) or above (overloaded 8x from the start) the limit ends at
    or past the knee with a short queue: the engine full and its throughput at least
    0.95 of the best (1 / (1 + 0.05 x queued / capacity) past the knee)."""
    limit = LatencyLimit(start, 100_000)
    seen = settle(limit, capacity, rounds=100)
    for value in seen[-20:]:
        assert capacity <= value and 1 / (1 + 0.05 * (value - capacity) / capacity) >= 0.95, \
            seen[-20:]
    assert not limit.slow_start


def test_a_probe_finds_the_unqueued_latency_an_overloaded_start_hid() -> None:
    """Started 8x past the knee, the first answers already waited behind the engine's own
    slowdown (1.35x its unqueued latency); the probe lets the queue drain, sees the true
    latency, and the limit comes down by as much."""
    limit = LatencyLimit(128, 100_000)
    settle(limit, 16, rounds=1)
    assert limit.lowest[""] == pytest.approx(1.35)
    settle(limit, 16, rounds=100)
    assert limit.lowest[""] == pytest.approx(1.0)


def test_slow_start_doubles_per_round_trip_while_latency_stays_flat() -> None:
    limit = LatencyLimit(8, 100_000)
    seen = settle(limit, capacity=1000, rounds=4)
    assert seen == [16, 32, 64, 128] and limit.slow_start


def full_engine_answers(limiter: Limiter, now: List[float], count: int, sent_at: float,
                        latency: float) -> None:
    """``count`` answers at ``sent_at + latency`` to requests sent at ``sent_at`` (the
    limiter's clock moved there; slots taken and given back as the generator does)."""
    now[0] = sent_at + latency
    for _ in range(count):
        limiter.in_flight -= 1
        limiter.succeeded(sent_at)


def test_slow_start_stops_at_twice_what_a_full_engine_served_in_a_round(monkeypatch) -> None:
    """An engine of capacity 128, started at 128: the first round doubles to 256; in the
    second only 128 answer good (the other 128 queue), so the limit stays at 256 instead
    of growing to 384 on those good answers; their queued twins end slow start."""
    now = [0.0]
    monkeypatch.setattr(concurrency.time, "monotonic", lambda: now[0])
    limiter = Limiter(start=128, ceiling=1024)
    limiter.in_flight = 128
    full_engine_answers(limiter, now, 128, sent_at=0.0, latency=1.0)
    assert limiter.current == 256 and limiter.slow_start
    limiter.in_flight = 256  # sent at 1.0: 128 run, 128 queue
    full_engine_answers(limiter, now, 128, sent_at=1.0, latency=1.05)
    assert limiter.current == 256 and limiter.slow_start
    full_engine_answers(limiter, now, 1, sent_at=1.0, latency=2.1)
    assert not limiter.slow_start and limiter.current < 200  # 255 x 1.25 / 2.1 + 16


def test_slow_start_still_doubles_per_round_on_an_engine_with_room(monkeypatch) -> None:
    now = [0.0]
    monkeypatch.setattr(concurrency.time, "monotonic", lambda: now[0])
    limiter = Limiter(start=128, ceiling=4096)
    sent_at, seen = 0.0, []
    for _ in range(4):
        limiter.in_flight = limiter.current
        full_engine_answers(limiter, now, limiter.current, sent_at=sent_at, latency=4.0)
        sent_at = now[0]
        seen.append(limiter.current)
    assert seen == [256, 512, 1024, 2048] and limiter.slow_start


def test_rounds_are_counted_per_kind_and_added_up() -> None:
    """Twice the sum of each kind's best round: a judge's long round trip does not cut
    the short column's round short, nor the other way round."""
    rounds = Rounds(start=2)
    for _ in range(3):
        rounds.good(sent_at=0.0, now=1.0, key="text")
    for _ in range(5):
        cap = rounds.good(sent_at=0.0, now=4.0, key="judge")
    assert cap == 2 * (3 + 5)
    assert rounds.good(sent_at=1.0, now=2.0, key="text") == 2 * (3 + 5)  # a new round
    assert rounds.count["text"] == 1 and rounds.best["text"] == 3


def test_answers_sent_before_slow_start_ended_do_not_cut_again() -> None:
    """Leaving slow start cuts to the target once; the backlog sent before the cut
    answers slow too, but it reports the queue already cut (following it would take the
    limit below the engine's capacity); an answer sent after the cut moves it again."""
    limit = LatencyLimit(256, 1024)
    limit.answered(1.0, 256, now=1.0)
    limit.answered(2.1, 256, now=3.1)  # the first queued answer: cut
    cut = limit.limit
    assert not limit.slow_start and 150 < cut < 200
    for step in range(100):
        limit.answered(2.0, 150, now=3.2 + step / 100)  # sent at 1.2-2.2, before the cut
    assert limit.limit == cut
    limit.answered(2.0, 150, now=5.2)  # sent at 3.2, after it
    assert limit.limit < cut


def test_overload_backs_off_fast() -> None:
    """Deep past the knee (latency 8x the engine's own) the limit falls by about a third
    every round trip (the gradient at most halves the target)."""
    limit = LatencyLimit(128, 100_000)
    limit.answered(1.0, 128, now=1.0)  # the unqueued latency is known
    limit.answered(8.0, 128, now=8.0)  # leaving slow start: to 128 x 1.25 / 8 + sqrt(129)
    assert 30 < limit.limit < 32 and not limit.slow_start
    limit.limit = 128.0
    for _ in range(128):
        limit.answered(8.0, 128, now=20.0)  # then (sent after the cut) a 1/limit step per
        # answer toward 64 + sqrt
    assert 0.5 * 128 < limit.limit < 0.75 * 128


def test_latency_is_compared_per_kind_of_request() -> None:
    """A long column's answers are slower than a short one's without any queue: each is
    compared with its own fastest."""
    limit = LatencyLimit(10, 100)
    for _ in range(5):
        limit.answered(0.5, 10, "judge", now=4.0)
        limit.answered(4.0, 10, "essay", now=4.0)
    assert limit.limit == 20 and limit.slow_start


def test_an_instant_servers_noise_is_not_congestion() -> None:
    limit = LatencyLimit(10, 100)
    for latency in (0.0002, NOISE_FLOOR_S, 0.003, 0.04):
        limit.answered(latency, 10, now=1.0)
    assert limit.limit == 14 and limit.slow_start


def test_a_fixed_limit_never_moves() -> None:
    limiter = Limiter(start=6, ceiling=6, adaptive=False)
    limiter.succeeded(0.0)
    limiter.congested(1e12)
    assert limiter.current == 6


def test_waiters_are_served_lowest_priority_first_and_cancellation_is_clean() -> None:
    async def scenario() -> List[int]:
        limiter = Limiter(start=1, ceiling=1, adaptive=False)
        order: List[int] = []
        await limiter.acquire(0)

        async def one(priority: int) -> None:
            await limiter.acquire(priority)
            order.append(priority)
            await asyncio.sleep(0)
            limiter.release()

        tasks = [asyncio.ensure_future(one(p)) for p in (5, 3, 9, 1)]
        cancelled = asyncio.ensure_future(limiter.acquire(0))
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.sleep(0)
        limiter.release()
        await asyncio.gather(*tasks)
        assert limiter.in_flight == 0
        return order

    assert asyncio.run(scenario()) == [1, 3, 5, 9]


def test_default_bounds_follow_replicas_and_the_proxy_queue_limit() -> None:
    plan = recipe_plan(ONE, gen_queue=256)
    limits = limiters(plan, compile_recipe(plan))
    assert (limits["gen"].current, limits["gen"].ceiling, limits["gen"].adaptive) == \
        (128, 1024, True)
    assert window(limits, 10_000) == 2 * 1024 + 64
    small = limiters(recipe_plan(ONE, gen_queue=4), compile_recipe(plan))
    assert (small["gen"].current, small["gen"].ceiling) == (4, 1024)  # never shed at start
    fixed = limiters(recipe_plan(ONE, concurrency=5), compile_recipe(plan))
    assert (fixed["gen"].current, fixed["gen"].ceiling, fixed["gen"].adaptive) == \
        (5, 5, False)


def test_a_benchmark_points_shard_concurrency_beats_the_plans() -> None:
    """Each shard of a benchmark case's run is one concurrency point (docs/benchmark.md)."""
    plan = recipe_plan(ONE, records=20, concurrency=5)
    plan = plan.replace(shards=(ShardSpec(0, 0, 4, concurrency=1),
                                ShardSpec(1, 4, 16, concurrency=8)))
    recipe = compile_recipe(plan)
    assert [limiters(plan, recipe, offset)["gen"].ceiling for offset in (0, 4)] == [1, 8]
    assert not limiters(plan, recipe, 4)["gen"].adaptive


def run(url: str, tmp_path: Path, records: int, **client) -> Progress:
    plan = recipe_plan(ONE, records=records, **client)
    progress = Progress(tmp_path / "progress.json", records)
    written = run_shard(plan, {"gen": url}, Shard(0, records, Output(tmp_path, 0), progress,
                                                  KeptRecords()))
    assert written == records
    lines = (tmp_path / "records-000000000000.jsonl").read_text().splitlines()
    assert len(lines) == records
    return progress


@pytest.mark.parametrize("adaptive", [True, False])
def test_429_above_the_servers_capacity_slows_down_and_costs_no_retry(tmp_path: Path,
                                                                      adaptive: bool) -> None:
    """The server runs 8 requests at a time and answers 429 to anything that would wait;
    the generator starts at 32 (or is fixed at 16), and max_retries = 0 with on_error =
    fail: a 429 that used up a retry would fail the shard."""
    client = {"gen_queue": 1000} if adaptive else {"concurrency": 16}
    records = 150 if adaptive else 40  # fixed: each 429 waits its Retry-After (1 s)
    with serve_in_thread(model="fake-model", max_concurrency=8, reject_when_waiting=0,
                         token_latency=0.01) as server:
        progress = run(server.url, tmp_path, records, max_retries=0, on_error="fail",
                       **client)
    gen = progress.aliases["gen"]
    assert gen.errors["429"] > 0 and set(gen.errors) == {"429"}
    assert gen.requests == records + gen.errors["429"]
    if adaptive:
        assert gen.limiter.current <= 16 and not gen.limiter.slow_start  # it came down
    else:
        assert gen.limiter.current == 16


def test_an_uncongested_server_lets_the_limit_grow(tmp_path: Path) -> None:
    with serve_in_thread(model="fake-model") as server:
        progress = run(server.url, tmp_path, 100, gen_queue=4)
    limiter = progress.aliases["gen"].limiter
    assert limiter.current > 4 and not progress.aliases["gen"].errors  # it grew, no 429



def test_progress_records_when_the_generator_started_and_its_first_record(tmp_path) -> None:
    """``benchmark analyze`` reads boot (ready -> first record) and the generation's wall
    time from these."""
    with serve_in_thread(model="fake-model", token_latency=0.01) as server:
        run(server.url, tmp_path, 6, concurrency=2)
    data = json.loads((tmp_path / "progress.json").read_text())
    assert data["started_at"] < data["first_record_at"] <= data["updated_at"]
    assert data["records_done"] == 6
