"""Prompt layout that shares, affinity keys, and the dispatch order of records that
share a seed row (docs/generator.md, "Layout and affinity")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

from fixtures.fake_openai_server import serve_in_thread
from synthbatch.agent_stdlib.client import http
from synthbatch.agent_stdlib.client.llm import messages
from synthbatch.agent_stdlib.client.order import DispatchOrder, rank
from synthbatch.agent_stdlib.contracts import ColumnSpec, SeedDataSpec
from tests.agent_runs import produce, recipe_plan, records

DOCS = ["the moon pulls the sea " * 20, "rivers run to the ocean " * 20]
COLUMNS = (
    ColumnSpec("summary", "llm-text", {"model": "gen", "prompt": "Summarize it.",
                                       "max_tokens": 4}),
    ColumnSpec("question", "llm-text", {"model": "gen", "system": "You write exams.",
                                        "prompt": "Ask about it.", "max_tokens": 4}),
    ColumnSpec("answer", "llm-structured", {
        "model": "gen", "context": "Answer from the document only.",
        "prompt": "Answer: {question}", "max_tokens": 4,
        "schema": {"type": "object", "required": ["answer"],
                   "properties": {"answer": {"type": "string"}}}}),
    ColumnSpec("grade", "llm-judge", {
        "model": "gen", "continue_from": "answer", "prompt": "Grade that answer.",
        "max_tokens": 4, "scores": [{"name": "ok", "options": {"1": "yes", "0": "no"}}]}),
)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> List[Dict[str, Any]]:
    """Every request the generator posts: its body and affinity key."""
    out: List[Dict[str, Any]] = []
    post = http.Endpoint.post

    async def spy(self: http.Endpoint, path: str, payload: bytes, affinity: str = ""):
        out.append({"body": json.loads(payload), "key": affinity})
        return await post(self, path, payload, affinity)

    monkeypatch.setattr(http.Endpoint, "post", spy)
    return out


def seeds(tmp_path: Path) -> SeedDataSpec:
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"document": d}) + "\n" for d in DOCS))
    return SeedDataSpec(str(path), "in-order", ("document",), rows=len(DOCS))


def run(tmp_path: Path, count: int, **client: Any) -> List[Dict[str, Any]]:
    plan = recipe_plan(COLUMNS, records=count, seed_data=seeds(tmp_path),
                       context="Document:\n{document}", **client)
    with serve_in_thread(model="fake-model") as server:
        written, _ = produce(plan, {"gen": server.url, "judge": server.url}, tmp_path / "out")
    assert written == count
    return records(tmp_path / "out")


def test_a_records_requests_start_with_the_same_bytes(tmp_path: Path, sent) -> None:
    rows = run(tmp_path, 4)
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    by_doc: Dict[str, List[Dict[str, Any]]] = {}
    for request in sent:
        first = request["body"]["messages"][0]
        assert first["role"] == "system"
        doc = next(d for d in DOCS if d in first["content"])
        by_doc.setdefault(doc, []).append(request)
    for doc, requests in by_doc.items():
        prefix = f"Document:\n{doc}"
        assert all(r["body"]["messages"][0]["content"].startswith(prefix) for r in requests)
        assert len({r["key"] for r in requests}) == 1  # one key per document
    assert len({r["key"] for r in sent}) == 2


def test_a_continuation_repeats_the_conversation_it_continues(tmp_path: Path, sent) -> None:
    rows = run(tmp_path, 2)
    answers = [r for r in sent if r["body"].get("response_format", {}).get(
        "json_schema", {}).get("name") == "answer"]
    grades = [r for r in sent if r["body"].get("response_format", {}).get(
        "json_schema", {}).get("name") == "grade"]
    assert len(answers) == len(grades) == 2
    for grade in grades:
        history = grade["body"]["messages"][:-2]
        match = [a for a in answers if a["body"]["messages"] == history]
        assert len(match) == 1 and match[0]["key"] == grade["key"]
        answer_text = grade["body"]["messages"][-2]
        assert answer_text["role"] == "assistant"
        row = next(r for r in rows if r["document"] in history[0]["content"])
        assert json.loads(answer_text["content"]) == row["answer"]
        assert grade["body"]["messages"][-1]["content"].endswith("Grade that answer.")
        assert "impartial judge" in grade["body"]["messages"][-1]["content"]  # its rubric


def test_without_a_record_dependent_context_each_record_has_its_own_key(
        tmp_path: Path, sent) -> None:
    plan = recipe_plan(COLUMNS, records=3, seed_data=seeds(tmp_path), context="Be kind.")
    with serve_in_thread(model="fake-model") as server:
        produce(plan, {"gen": server.url, "judge": server.url}, tmp_path / "out")
    keys = {r["key"] for r in sent}
    assert keys == {"rec-0", "rec-1", "rec-2"}
    assert all(r["body"]["messages"][0]["content"].startswith("Be kind.") for r in sent
               if r["body"]["messages"][0]["role"] == "system")


def test_layout_puts_shared_text_first_and_own_instructions_after() -> None:
    assert messages("Q", "own", ["ctx", "col"]) == [
        {"role": "system", "content": "ctx\n\ncol\n\nown"}, {"role": "user", "content": "Q"}]
    assert messages("Q", None) == [{"role": "user", "content": "Q"}]
    history = [{"role": "system", "content": "ctx"}, {"role": "user", "content": "A?"},
               {"role": "assistant", "content": "a"}]
    assert messages("Q", "rubric", ["", "col"], history) == history + [
        {"role": "user", "content": "col\n\nrubric\n\nQ"}]


def test_dispatch_order_groups_records_of_one_seed_row_within_a_block() -> None:
    order = DispatchOrder(8, lambda i: i % 3)  # in-order over 3 rows, blocks of 8
    ranks = {i: order.rank(i) for i in range(16)}  # opened in index order
    first_block = sorted(range(8), key=ranks.get)
    assert first_block == [0, 3, 6, 1, 4, 7, 2, 5]
    second_block = sorted(range(8, 16), key=ranks.get)
    assert second_block == [8, 11, 14, 9, 12, 15, 10, 13]
    assert max(ranks[i] for i in range(8)) < min(ranks[i] for i in range(8, 16))
    assert len(set(ranks.values())) == 16


def test_without_seed_rows_the_order_is_the_index() -> None:
    order = DispatchOrder(8, None)
    assert [order.rank(i) for i in range(5)] == [0, 1, 2, 3, 4]
    assert rank(9, 8, 8) == 8 * 8 + 1


def test_a_record_of_one_request_carries_no_key(tmp_path: Path, sent) -> None:
    plan = recipe_plan(COLUMNS[:1], records=3)
    with serve_in_thread(model="fake-model") as server:
        produce(plan, {"gen": server.url, "judge": server.url}, tmp_path / "out")
    assert [r["key"] for r in sent] == ["", "", ""]  # routed as requests without a key
