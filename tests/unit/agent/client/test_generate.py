"""The generator running a recipe: records with their columns and ``_meta``, two models per
record, seed data, retries and ``on_error``, determinism across shards, processes and
resumes (including ``kill -9`` mid-run), and ``--preview``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from fixtures.fake_openai_server import RunningServer, serve_in_thread
from synthbatch.agent_stdlib.candidate import build_manifest
from synthbatch.agent_stdlib.client.records import GenerateError
from synthbatch.agent_stdlib.contracts import EXIT_CLIENT_CONFIG, ColumnSpec, Plan, SeedDataSpec
from tests.agent_runs import QA_COLUMNS, logged, produce, recipe_plan, records
from tests.conftest import REPO

TOPICS = ["tides", "moons", "stars", "comets", "rivers"]


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Tuple[RunningServer, RunningServer]]:
    gen = serve_in_thread(model="fake-model", request_log=str(tmp_path / "gen.log"))
    judge = serve_in_thread(model="fake-model", request_log=str(tmp_path / "judge.log"))
    yield gen, judge
    gen.stop()
    judge.stop()


def seed_file(tmp_path: Path) -> SeedDataSpec:
    path = tmp_path / "topics.jsonl"
    path.write_text("".join(json.dumps({"topic": t, "source": f"s{i}"}) + "\n"
                            for i, t in enumerate(TOPICS)))
    return SeedDataSpec(str(path), "shuffle", ("topic",), rows=len(TOPICS))


def urls(servers: Tuple[RunningServer, RunningServer]) -> Dict[str, str]:
    return {"gen": servers[0].url, "judge": servers[1].url}


def test_a_question_answer_judge_chain_over_two_models(tmp_path: Path, servers) -> None:
    plan = recipe_plan(records=10, seed_data=seed_file(tmp_path))
    written, progress = produce(plan, urls(servers), tmp_path / "out")
    assert written == 10
    rows = records(tmp_path / "out")
    assert [r["index"] for r in rows] == list(range(10))
    first = rows[0]
    assert list(first) == ["index", "topic", "source", "level", "question", "answer", "grade",
                           "label", "_meta"]  # seed fields (even unused), columns, meta
    assert "id" not in first  # drop = true: used by label, left out of the record
    assert first["topic"] in TOPICS and first["level"] in ("beginner", "expert")
    assert isinstance(first["answer"]["answer"], str)
    assert first["grade"]["correct"]["score"] in (0, 1)
    assert first["label"].startswith(f"{first['level']}/{first['grade']['correct']['score']}/")
    meta = first["_meta"]
    assert meta["index"] == 0 and list(meta["columns"]) == ["question", "answer", "grade"] or \
        set(meta["columns"]) == {"question", "answer", "grade"}
    cell = meta["columns"]["grade"]
    assert (cell["model"], cell["served_model"], cell["attempts"]) == ("judge", "fake-model", 1)
    assert cell["usage"]["completion_tokens"] == 6 and cell["latency_ms"] >= 0
    assert meta["columns"]["answer"]["finish_reason"] == "stop"
    # each model alias got its own requests, in dependency order within a record
    gen, judge = logged(tmp_path / "gen.log"), logged(tmp_path / "judge.log")
    assert len(gen) == 20 and len(judge) == 10
    by_prompt = {r["question"]: r for r in rows}
    answers = [g["prompt"] for g in gen if g["prompt"].startswith("Answer: ")]
    assert {a[len("Answer: "):] for a in answers} == set(by_prompt)
    assert all(j["prompt"].startswith("Question: ") for j in judge)
    assert progress.aliases["gen"].requests == 20 and progress.aliases["judge"].requests == 10
    assert progress.tokens == 10 * 3 * 6
    assert json.loads((tmp_path / "out-progress.json").read_text())["records_done"] == 10


def test_every_shard_split_gives_the_same_records(tmp_path: Path, servers) -> None:
    """Records are functions of (seed, index): one shard of 12 equals shards 0-4 and 5-11,
    each produced on its own (latency left out: it is measured, not generated)."""
    plan = recipe_plan(records=12, seed_data=seed_file(tmp_path))
    produce(plan, urls(servers), tmp_path / "whole")
    produce(plan, urls(servers), tmp_path / "split", 0, 5)
    produce(plan, urls(servers), tmp_path / "split", 5, 7)

    def stable(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        for row in rows:
            for cell in row["_meta"]["columns"].values():
                cell.pop("latency_ms")
        return rows

    whole = stable(records(tmp_path / "whole"))
    assert stable(records(tmp_path / "split")) == whole
    other = produce(replace(plan, client=replace(plan.client, seed=8)), urls(servers),
                    tmp_path / "other")
    assert other[0] == 12 and stable(records(tmp_path / "other")) != whole


FLAKY = (ColumnSpec("text", "llm-text", {"model": "gen", "prompt": "Item {index}.",
                                         "max_tokens": 3}),
         ColumnSpec("echo", "expression", {"template": "[{text}]"}))


@pytest.mark.parametrize("on_error", ["drop", "keep", "fail"])
def test_on_error_after_the_retries_are_used_up(tmp_path: Path, on_error: str) -> None:
    """Every 2nd request fails (HTTP 500) and there are no retries."""
    plan = recipe_plan(FLAKY, records=10, on_error=on_error, max_retries=0, concurrency=1)
    out = tmp_path / "out"
    with serve_in_thread(model="fake-model", fail_every=2) as server:
        if on_error == "fail":
            with pytest.raises(GenerateError, match=r"record 1: column text: HTTP 500: .*"
                                                    r"injected failure .*\(attempt 1 of 1\)"):
                produce(plan, {"gen": server.url}, out)
            assert [r["index"] for r in records(out)] == [0]  # what came before is kept
            return
        written, progress = produce(plan, {"gen": server.url}, out)
    assert written == 10 and progress.aliases["gen"].errors == {"5xx": 5}
    rows = records(out)
    if on_error == "drop":
        assert [r["index"] for r in rows] == [0, 2, 4, 6, 8]
        dropped = [json.loads(x) for x in
                   (out / ".dropped-000000000000.jsonl").read_text().splitlines()]
        assert [d["index"] for d in dropped] == [1, 3, 5, 7, 9]
        assert dropped[0]["column"] == "text" and "HTTP 500" in dropped[0]["error"]
        manifest = build_manifest(out, shard=0, attempt=1, expected=10)
        assert (manifest.records, manifest.dropped, progress.dropped) == (5, 5, 5)
    else:
        assert [r["index"] for r in rows] == list(range(10))
        bad = rows[1]
        assert bad["text"] is None and bad["echo"] is None  # the failed column, its users
        assert bad["_error"]["column"] == "text" and "HTTP 500" in bad["_error"]["message"]
        assert "_error" not in rows[0] and rows[0]["echo"] == f"[{rows[0]['text']}]"


def test_retries_and_invalid_structured_answers(tmp_path: Path) -> None:
    """Every 3rd request fails and every 2nd structured answer is broken JSON: both are
    retried (with jittered back-off) and every record comes out valid. One record at a
    time (a shard of one), so the failing turns are known: 1 ok, 2 invalid, 3 HTTP 500,
    4 ok, 5 invalid, 6 HTTP 500, 7 ok, ..."""
    columns = (QA_COLUMNS[0], replace(QA_COLUMNS[2], params={
        **QA_COLUMNS[2].params, "prompt": "Answer about {level} number {index}."}))
    plan = recipe_plan(columns, records=4, max_retries=2)
    errors: Dict[str, int] = {}
    with serve_in_thread(model="fake-model", fail_every=3, invalid_json_every=2) as server:
        for index in range(4):
            written, progress = produce(plan, {"gen": server.url}, tmp_path / "out", index, 1)
            assert written == 1
            for kind, count in progress.aliases["gen"].errors.items():
                errors[kind] = errors.get(kind, 0) + count
    rows = records(tmp_path / "out")
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    assert all(isinstance(r["answer"]["answer"], str) for r in rows)
    assert errors == {"invalid_output": 3, "5xx": 3}
    assert [r["_meta"]["columns"]["answer"]["attempts"] for r in rows] == [1, 3, 3, 3]


def test_a_client_error_is_not_retried(tmp_path: Path) -> None:
    plan = recipe_plan(FLAKY, records=2, on_error="keep", max_retries=5)
    plan = replace(plan, deployments=tuple(replace(d, served_name="no-such-model")
                                           for d in plan.deployments))
    with serve_in_thread(model="fake-model") as server:
        _, progress = produce(plan, {"gen": server.url}, tmp_path / "out")
    assert progress.aliases["gen"].errors == {"4xx": 2}  # one request per record, no retry
    assert "HTTP 404" in records(tmp_path / "out")[0]["_error"]["message"]


def test_samplers_only_need_no_model(tmp_path: Path) -> None:
    columns = (ColumnSpec("n", "integer", {"low": 1, "high": 6}),
               ColumnSpec("s", "expression", {"template": "#{index}: {n} {topic}"}))
    written, progress = produce(recipe_plan(columns, records=30,
                                            seed_data=seed_file(tmp_path)), {},
                                tmp_path / "out")
    rows = records(tmp_path / "out")
    assert written == 30 and rows[7]["s"] == f"#7: {rows[7]['n']} {rows[7]['topic']}"
    assert progress.aliases == {} and "_meta" in rows[0]
    assert sorted(r["topic"] for r in rows[:5]) == sorted(TOPICS)  # shuffle: one pass


# ----------------------------------------------------------------------------- processes


def role_env(tmp_path: Path, endpoints: Dict[str, str], offset: int, count: int,
             output: Path, **extra: str) -> Dict[str, str]:
    return {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO),
            "SYNTHBATCH_ENDPOINTS": json.dumps(endpoints),
            "SYNTHBATCH_RECORD_OFFSET": str(offset), "SYNTHBATCH_NUM_RECORDS": str(count),
            "SYNTHBATCH_OUTPUT_DIR": str(output),
            "SYNTHBATCH_PROGRESS_FILE": str(tmp_path / "progress.json"), **extra}


def start_role(plan: Plan, tmp_path: Path, env: Dict[str, str],
               *args: str) -> subprocess.Popen:
    plan_json = tmp_path / "plan.json"
    plan_json.write_text(plan.to_json())
    Path(env.get("SYNTHBATCH_OUTPUT_DIR", tmp_path)).mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "synthbatch.agent_stdlib", "generate", "--plan",
                             str(plan_json), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def lines_in(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_kill_9_mid_run_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """The generate role is killed (SIGKILL, no chance to flush) after some batches were
    written; the next execution resumes and the shard ends with every record exactly once,
    equal to an uninterrupted run's (dropped records included)."""
    plan = recipe_plan(FLAKY, records=60, on_error="drop", max_retries=0, concurrency=2)
    killed_running = 0
    with serve_in_thread(model="fake-model", token_latency=0.05, fail_every=7) as server:
        endpoints = {"gen": server.url}
        reference = tmp_path / "reference"
        done = start_role(plan, tmp_path, role_env(tmp_path, endpoints, 100, 60, reference))
        assert done.wait(timeout=120) == 0, done.stderr.read() if done.stderr else ""
        out = tmp_path / "killed"
        env = role_env(tmp_path, endpoints, 100, 60, out)
        for _ in range(2):  # kill it twice, at different points
            proc = start_role(plan, tmp_path, env)
            target = lines_in(out / "records-000000000100.jsonl") + 8
            deadline = time.monotonic() + 60
            while lines_in(out / "records-000000000100.jsonl") < target and \
                    time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.005)
            killed_running += proc.poll() is None
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        final = start_role(plan, tmp_path, env)
        assert final.wait(timeout=120) == 0, final.stderr.read() if final.stderr else ""

    def content(folder: Path) -> Tuple[List[Any], List[Any]]:
        rows = [json.loads(x) for x in
                (folder / "records-000000000100.jsonl").read_text().splitlines()]
        drops = [json.loads(x)["index"] for x in
                 (folder / ".dropped-000000000100.jsonl").read_text().splitlines()]
        return [(r["index"], r["text"]) for r in rows], drops

    assert killed_running == 2  # both kills hit a running generator
    kept, dropped = content(out)
    indices = sorted([i for i, _ in kept] + dropped)
    assert indices == list(range(100, 160))  # all there, none twice
    assert [i for i, _ in kept] == sorted(i for i, _ in kept)  # in index order
    both = dict(content(reference)[0]).keys() & dict(kept).keys()  # which fail is not fixed
    assert len(both) > 30
    assert [t for i, t in kept if i in both] == [t for i, t in content(reference)[0]
                                                 if i in both]
    assert build_manifest(out, shard=0, attempt=1, expected=60).records == len(kept)


def test_same_records_from_processes_with_different_hash_seeds(tmp_path: Path,
                                                               servers) -> None:
    plan = recipe_plan(records=6, seed_data=seed_file(tmp_path))
    outputs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"out-{hash_seed}"
        proc = start_role(plan, tmp_path, role_env(tmp_path, urls(servers), 0, 6, out,
                                                   PYTHONHASHSEED=hash_seed))
        assert proc.wait(timeout=60) == 0
        rows = records(out)
        for row in rows:
            del row["_meta"]
        outputs.append(rows)
    assert outputs[0] == outputs[1]


def test_preview_prints_records_and_leaves_out_models_without_an_endpoint(
        tmp_path: Path, servers) -> None:
    plan = recipe_plan(records=100, seed_data=seed_file(tmp_path))
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO),
           "SYNTHBATCH_ENDPOINTS": json.dumps({"gen": servers[0].url})}
    proc = start_role(plan, tmp_path, env, "--preview", "3")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    rows = [json.loads(x) for x in out.decode().splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2]
    assert "question" in rows[0] and "answer" in rows[0]
    assert "grade" not in rows[0] and "label" not in rows[0]  # judge has no endpoint
    assert not list(tmp_path.glob("records-*"))
    proc = start_role(plan, tmp_path, {**env, "SYNTHBATCH_ENDPOINTS": "{}"}, "--preview", "2")
    out, _ = proc.communicate(timeout=60)
    rows = [json.loads(x) for x in out.decode().splitlines()]
    assert proc.returncode == 0 and set(rows[0]) == {"index", "topic", "source", "level",
                                                     "_meta"}


def test_the_seed_data_is_read_where_the_agent_says(tmp_path: Path) -> None:
    """In a client image the plan's host path is not visible; ``--seed-data`` (the path
    under the image's mount, from launch) is read instead."""
    real = seed_file(tmp_path)
    plan = recipe_plan(records=100, seed_data=replace(
        real, path=str(tmp_path / "host-only" / "topics.jsonl")))
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO),
           "SYNTHBATCH_ENDPOINTS": "{}"}
    proc = start_role(plan, tmp_path, env, "--preview", "2")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_CLIENT_CONFIG and b"host-only/topics.jsonl" in err
    proc = start_role(plan, tmp_path, env, "--preview", "2", "--seed-data", real.path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    rows = [json.loads(x) for x in out.decode().splitlines()]
    assert [r["topic"] in TOPICS for r in rows] == [True, True]


class _StubbornProducer:
    """A stopped producer that leaves one request behind which swallows its cancellation
    (as Python 3.11's ``asyncio.wait_for`` does when the exchange breaks just as it is
    cancelled) and would go on retrying for an hour."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.retries = 0

    async def run(self, first: int) -> int:
        async def swallowing() -> None:
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    self.retries += 1

        task = asyncio.ensure_future(swallowing())
        await asyncio.sleep(0)
        self.stop.set()  # the signal came
        task.cancel()
        return first


def test_a_stopped_producer_abandons_requests_that_swallow_their_cancellation() -> None:
    from synthbatch.agent_stdlib.client.generate import drive

    producer, result = _StubbornProducer(), []
    worker = threading.Thread(target=lambda: result.append(drive(producer, 7)), daemon=True)
    worker.start()
    worker.join(timeout=60)  # asyncio.run would wait for that request forever
    assert not worker.is_alive(), "the stopped client waited for an abandoned request"
    assert result == [7]
