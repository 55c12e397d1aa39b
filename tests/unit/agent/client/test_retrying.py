"""Retries that can succeed (issue 35): a retry of an invalid structured or judge answer
changes the seed, the token budget when cut by the length limit, and a temperature of 0;
the cell's ``_meta`` records what changed, and no retry repeats the request before it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from fixtures.fake_openai_server import serve_in_thread
from synthbatch.agent_stdlib.client.retrying import RETRY_TEMPERATURE, retry_body, token_cap
from tests.agent_runs import QA_COLUMNS, logged, produce, recipe_plan, records


def test_a_cut_answer_at_temperature_zero_changes_seed_tokens_and_temperature() -> None:
    body = {"model": "m", "max_tokens": 64, "temperature": 0.0}
    nxt, change = retry_body(body, 64, seed=11, finish_reason="length")
    assert change == {"seed": 11, "max_tokens": 128, "temperature": RETRY_TEMPERATURE}
    assert nxt == {"model": "m", "max_tokens": 128, "temperature": RETRY_TEMPERATURE,
                   "seed": 11}
    assert body == {"model": "m", "max_tokens": 64, "temperature": 0.0}  # not mutated


def test_tokens_grow_only_up_to_the_cap_and_only_when_cut() -> None:
    body = {"max_tokens": token_cap(64), "temperature": 0.7, "seed": 3}
    nxt, change = retry_body(body, 64, seed=3, finish_reason="length")
    assert change == {"seed": 4} and nxt["max_tokens"] == token_cap(64) == 256
    _, change = retry_body({"max_tokens": 64, "temperature": 0.7}, 64, 9, "stop")
    assert change == {"seed": 9}


def test_judge_retries_are_never_byte_identical_and_say_what_changed(
        tmp_path: Path) -> None:
    """The fake server cuts every 2nd structured answer (``finish_reason`` ``length``);
    the judge runs at temperature 0. Each retry differs from the request before it, and
    the record's ``_meta`` lists the change."""
    columns = (QA_COLUMNS[0], replace(QA_COLUMNS[1], params={
        **QA_COLUMNS[1].params, "prompt": "Write one {level} question number {index}."}),
        replace(QA_COLUMNS[3], params={**QA_COLUMNS[3].params,
                                       "prompt": "Question: {question}",
                                       "temperature": 0.0}))
    plan = recipe_plan(columns, records=6, max_retries=5, on_error="keep")
    log = tmp_path / "judge.log"
    with serve_in_thread(model="fake-model") as gen, \
            serve_in_thread(model="fake-model", invalid_json_every=2,
                            request_log=str(log)) as judge:
        written, progress = produce(plan, {"gen": gen.url, "judge": judge.url},
                                    tmp_path / "out")
    assert written == 6
    assert progress.aliases["judge"].errors.get("invalid_output", 0) >= 1
    rows = records(tmp_path / "out")
    retried = [r["_meta"]["columns"]["grade"] for r in rows
               if r["_meta"]["columns"]["grade"]["attempts"] > 1]
    assert retried, "no judge cell was retried"
    for cell in retried:
        assert len(cell["retries"]) == cell["attempts"] - 1
        first = cell["retries"][0]
        assert first["attempt"] == 2 and first["after"] == "invalid_output"
        assert isinstance(first["seed"], int)
        assert first["max_tokens"] == 12 and first["temperature"] == RETRY_TEMPERATURE
    by_prompt = {}
    for entry in logged(log):
        by_prompt.setdefault(entry["prompt"], []).append(entry)
    repeats = [e for entries in by_prompt.values() for a, e in zip(entries, entries[1:])
               if a["body_sha256"] == e["body_sha256"]]
    assert not repeats
    assert any(len(entries) > 1 and entries[1]["max_tokens"] > entries[0]["max_tokens"]
               for entries in by_prompt.values())
    assert all("retries" not in r["_meta"]["columns"]["grade"] for r in rows
               if r["_meta"]["columns"]["grade"]["attempts"] == 1)
    json.dumps(rows)
