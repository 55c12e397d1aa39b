"""Serving telemetry in status (issue 32): flags, per-replica lines, where time goes."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Tuple

from synthbatch.agent_stdlib.contracts import (
    ColumnTokens,
    ProgressRecord,
    ProxyTelemetry,
    ReplicaTelemetry,
    TelemetryPoint,
    TelemetryRecord,
)
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import ensure_dir, write_bytes_atomic
from synthbatch.control.runs.status.rows import ShardRow
from synthbatch.control.runs.telemetry import (
    MIN_POINTS,
    WINDOW_POINTS,
    alias_loads,
    flags,
    run_flags,
    shard_lines,
    shard_telemetry,
    time_split,
)

Values = Tuple[Optional[float], ...]


def record(aliases: Sequence[str], values: Sequence[Values], points: int = WINDOW_POINTS,
           updated_at: float = 1000.0) -> TelemetryRecord:
    """Replicas of ``aliases`` sampled ``points`` times with the same ``values`` each."""
    replicas = tuple(ReplicaTelemetry(alias=a, url=f"http://h:{i}") for i, a in
                     enumerate(aliases))
    series = tuple(TelemetryPoint(at=float(i), values=tuple(values)) for i in range(points))
    return TelemetryRecord(interval_s=5.0, updated_at=updated_at, replicas=replicas,
                           series=series)


def test_a_saturated_and_an_idle_alias_are_named() -> None:
    rec = record(["gen", "judge", "judge"],
                 [(1.0, 120.0, 0.98, 40.0, 1.0), (0.0, 0.0, 0.0, 0.0, 0.0),
                  (0.0, 0.0, 0.01, 0.0, 0.0)])
    assert flags([rec]) == ["gen: KV cache 98%, 120 waiting — add replicas",
                            "judge: 2 replicas, 0% busy, 0 waiting — over-provisioned"]


def test_busy_is_the_share_of_samples_with_a_request_running() -> None:
    values = [(0.0, 0.0, None, None, None)] * (WINDOW_POINTS - 1) + [(2.0, 0.0, None, 5.0, 2.0)]
    series = tuple(TelemetryPoint(at=float(i), values=(v,)) for i, v in enumerate(values))
    rec = TelemetryRecord(interval_s=5.0, updated_at=0.0,
                          replicas=(ReplicaTelemetry(alias="judge", url="u"),), series=series)
    (load,) = alias_loads([rec])
    assert round(load.busy, 4) == round(1 / WINDOW_POINTS, 4)
    assert flags([rec]) == [f"judge: 1 replica, {1 / WINDOW_POINTS:.0%} busy, 0 waiting — "
                            "over-provisioned"]


def test_a_balanced_alias_and_a_young_one_are_not_flagged() -> None:
    busy = record(["gen"], [(8.0, 1.0, 0.6, 300.0, 8.0)])
    assert flags([busy]) == []
    young = record(["gen"], [(1.0, 50.0, 0.99, 1.0, 1.0)], points=MIN_POINTS - 1)
    assert flags([young]) == []
    assert flags([record(["gen"], [(1.0, 50.0, 0.99, 1.0, 1.0)], points=MIN_POINTS)])
    idle_young = record(["judge"], [(0.0, 0.0, 0.0, 0.0, 0.0)], points=WINDOW_POINTS - 1)
    assert flags([idle_young]) == []  # idle is judged over a whole window


def test_waiting_alone_saturates_without_kv_figures() -> None:
    rec = record(["gen"], [(4.0, 9.0, None, 10.0, 13.0)])
    assert flags([rec]) == ["gen: 9 waiting — add replicas"]


def test_shards_add_up_per_alias() -> None:
    """Two shards' replicas of one alias count together: one idle shard does not hide a
    saturated one's queue, the mean does."""
    hot = record(["gen"], [(1.0, 10.0, None, 1.0, 1.0)])
    cold = record(["gen"], [(0.0, 0.0, None, 0.0, 0.0)])
    (load,) = alias_loads([hot, cold])
    assert (load.replicas, load.waiting) == (2, 5.0)
    assert flags([hot, cold]) == ["gen: 10 waiting — add replicas"]


def test_where_time_goes() -> None:
    rec = TelemetryRecord(interval_s=5.0, updated_at=0.0, started_at=110.0, ready_at=150.0,
                          stopping_at=400.0, stopped_at=403.5)
    progress = ProgressRecord(records_done=1, records_total=1, tokens=0, requests_per_s=0.0,
                              updated_at=0.0, first_record_at=152.0)
    assert time_split(rec, progress, 100.0, now=999.0) == {
        "queue_s": 10.0, "servers_s": 40.0, "first_record_s": 2.0, "generation_s": 248.0,
        "shutdown_s": 3.5}
    running = rec.replace(stopping_at=None, stopped_at=None)
    assert time_split(running, progress, None, now=200.0)["generation_s"] == 48.0
    assert time_split(None, None, 100.0, now=200.0) == dict.fromkeys(
        ("queue_s", "servers_s", "first_record_s", "generation_s", "shutdown_s"))


def test_shard_lines_show_the_last_values_and_a_damaged_file_is_said(tmp_path: Path) -> None:
    rec = TelemetryRecord(
        interval_s=5.0, updated_at=0.0, started_at=0.0, ready_at=12.0,
        replicas=(ReplicaTelemetry(alias="gen", url="http://n1:8000", engine="vllm",
                                   running=16.0, waiting=120.0, kv_cache_usage=0.98,
                                   prefix_hit_rate=0.5, gen_tokens_per_s=812.5,
                                   proxy_in_flight=136),),
        proxies={"gen": ProxyTelemetry(requests=10, responses_429=7, retries=1)})
    write_bytes_atomic(tmp_path / "telemetry.json", rec.to_json().encode())
    detail = shard_telemetry(tmp_path, None, None, now=20.0)
    text = "\n".join(shard_lines(detail))
    assert "time: servers ready 12.0s" in text
    assert ("gen http://n1:8000: 16 running, 120 waiting, KV 98%, prefix hits 50%, "
            "812.5 tok/s, proxy in flight 136, 429s 7") in text
    (tmp_path / "telemetry.json").write_text("{half")
    damaged = shard_telemetry(tmp_path, None, None, now=20.0)
    assert damaged["replicas"] == [] and "not valid JSON" in damaged["problem"]
    assert "telemetry: " in "\n".join(shard_lines(damaged))


def test_run_flags_read_running_shards_with_fresh_telemetry(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    hot = record(["gen"], [(1.0, 30.0, 1.0, 1.0, 1.0)], updated_at=1000.0)
    for shard, rec in ((0, hot), (1, hot.replace(updated_at=10.0)), (2, hot)):
        root = ensure_dir(layout.attempt(shard, 1).root)
        write_bytes_atomic(root / "telemetry.json", rec.to_json().encode())
    rows = [{"index": 0, "state": "running", "attempt": 1},
            {"index": 1, "state": "running", "attempt": 1},  # stale: agent gone
            {"index": 2, "state": "succeeded", "attempt": 1},
            {"index": 3, "state": "running", "attempt": 1}]  # no telemetry yet
    assert run_flags(layout, map(ShardRow.from_dict, rows), now=1010.0) == [
        "gen: KV cache 100%, 30 waiting — add replicas"]


def test_run_flags_read_a_bounded_sample_of_the_running_shards(tmp_path: Path,
                                                               monkeypatch) -> None:
    """10,000 running shards: status reads FLAG_SHARDS telemetry files, spread out."""
    from synthbatch.control.runs import telemetry

    read_paths = []
    monkeypatch.setattr(telemetry, "read", lambda path: (read_paths.append(path), (None, None))[1])
    rows = [{"index": i, "state": "running", "attempt": 1} for i in range(10_000)]
    assert run_flags(RunLayout(tmp_path), map(ShardRow.from_dict, rows), now=0.0) == []
    assert len(read_paths) == telemetry.FLAG_SHARDS
    assert [p.parent.parent.parent.name for p in read_paths][::7] == ["shard-00000", "shard-08750"]


def test_latency_per_column_is_split_into_proxy_queue_and_engine() -> None:
    from synthbatch.agent_stdlib.contracts import AliasProgress
    from synthbatch.control.runs.telemetry import latency_split

    progress = ProgressRecord(
        records_done=1, records_total=1, tokens=0, requests_per_s=0.0, updated_at=0.0,
        aliases={"gen": AliasProgress(columns={"question": ColumnTokens(4, latency_s=2.0),
                                               "answer": ColumnTokens(2, latency_s=3.0)}),
                 "judge": AliasProgress(columns={"grade": ColumnTokens(1, latency_s=0.1)})})
    rec = TelemetryRecord(interval_s=5.0, updated_at=0.0, proxies={
        "gen": ProxyTelemetry(timed=6, queue_s=0.6, upstream_s=4.2)})
    rows = latency_split(rec, progress)
    assert rows == [
        {"column": "answer", "alias": "gen", "answers": 2, "mean_s": 1.5,
         "proxy_queue_s": 0.1, "engine_s": 1.4, "alias_engine_s": 0.7},
        {"column": "question", "alias": "gen", "answers": 4, "mean_s": 0.5,
         "proxy_queue_s": 0.1, "engine_s": 0.4, "alias_engine_s": 0.7},
        {"column": "grade", "alias": "judge", "answers": 1, "mean_s": 0.1,
         "proxy_queue_s": None, "engine_s": None, "alias_engine_s": None}]
    text = "\n".join(shard_lines({"latency": rows}))
    assert "  answer (gen): 2 answers, mean 1500.0 ms = proxy queue 100.0 ms + engine " \
           "1400.0 ms" in text
    assert latency_split(rec, None) == []


def test_the_series_indices_follow_the_contracts_order() -> None:
    """status reads the series by index without loading the contracts; one order."""
    from synthbatch.agent_stdlib.contracts import TELEMETRY_SERIES
    from synthbatch.control.runs import telemetry

    names = {"running": telemetry.RUNNING, "waiting": telemetry.WAITING,
             "kv_cache_usage": telemetry.KV, "gen_tokens_per_s": telemetry.TOK_S,
             "proxy_in_flight": telemetry.IN_FLIGHT}
    assert [n for n, _ in sorted(names.items(), key=lambda kv: kv[1])] == \
        list(TELEMETRY_SERIES)
