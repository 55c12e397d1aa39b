"""Serving telemetry through a whole allocation (issue 32): one deployment starved (the
fake engine runs one request at a time), the other idle; status's flags name both."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from synthbatch.agent_stdlib.contracts import ColumnSpec, ProgressRecord, TelemetryRecord
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import load_record
from synthbatch.control.runs.status.rows import ShardRow
from synthbatch.control.runs.telemetry import read, run_flags, shard_telemetry
from tests.agent_runs import recipe_plan, server_argv, stage, start_allocation

COLUMNS = (
    ColumnSpec("level", "category", {"values": ["beginner", "expert"]}),
    ColumnSpec("question", "llm-text", {"model": "gen", "prompt": "Write a {level} question.",
                                        "max_tokens": 6}),
    ColumnSpec("grade", "llm-judge", {
        "model": "judge", "prompt": "Question: {question}", "max_tokens": 6,
        "scores": [{"name": "clear", "options": {"1": "clear", "0": "unclear"}}]}),
)


def test_status_names_the_starved_and_the_idle_deployment(
        tmp_path: Path, agent_pyz: Path, python_exe: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SYNTHBATCH_TELEMETRY_S", "0.3")
    plan = recipe_plan(COLUMNS, records=80, concurrency=16)
    starved = server_argv(python_exe, "--max-concurrency", "1", "--token-latency", "0.02")
    gen, judge = plan.deployments
    plan = replace(plan, deployments=(replace(gen, command=tuple(starved)),
                                      replace(judge, command=tuple(server_argv(python_exe)))))
    args = stage(tmp_path / "run", plan)
    layout = RunLayout(tmp_path / "run")
    proc = start_allocation(python_exe, agent_pyz, args)
    running = [ShardRow(0, "running", None, 1, None, 1)]
    seen: list = []
    try:
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            seen = run_flags(layout, running, time.time())
            if [f.split(":")[0] for f in seen] == ["gen", "judge"] and \
                    "add replicas" in seen[0]:
                break
            time.sleep(0.2)
    finally:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert len(seen) == 2, (seen, read(layout.attempt(0, 1).telemetry_json))
    assert seen[0].startswith("gen: KV cache ") and seen[0].endswith(
        " waiting — add replicas")
    assert seen[1].startswith("judge: 1 replica, ") and seen[1].endswith(
        " busy, 0 waiting — over-provisioned")
    record = load_record(layout.attempt(0, 1).telemetry_json, TelemetryRecord)
    assert record is not None and {r.alias for r in record.replicas} == {"gen", "judge"}
    assert all(r.engine == "vllm" for r in record.replicas)
    assert record.proxies["gen"].requests > 0
    # where time went: every mark of the execution, in order
    assert record.started_at <= record.ready_at <= record.stopping_at <= record.stopped_at
    detail = shard_telemetry(layout.attempt(0, 1).root,
                             load_record(layout.attempt(0, 1).progress_json, ProgressRecord),
                             None, time.time())
    assert all(detail["time"][k] is not None for k in
               ("servers_s", "first_record_s", "generation_s", "shutdown_s")), detail
    latency = {row["column"]: row for row in detail["latency"]}
    assert set(latency) == {"question", "grade"}
    assert latency["question"]["answers"] == latency["grade"]["answers"] == 80
    assert latency["question"]["proxy_queue_s"] is not None
