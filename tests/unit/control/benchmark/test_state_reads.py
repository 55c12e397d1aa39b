"""The benchmark reads run and benchmark state through the one tolerant reader (issue 29):
a symlink or a damaged file is named or skipped, never followed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.control.benchmark import store
from synthbatch.control.benchmark.analyze import attempt_dir
from synthbatch.control.errors import InvalidInput, NotFound


def _bench(workspace: Path, text: str) -> Path:
    path = store.bench_dir(workspace, "b1") / "benchmark.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def test_a_symlinked_benchmark_record_is_refused_by_name(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"cases": []}))
    path = _bench(tmp_path / "ws", "")
    path.unlink()
    path.symlink_to(elsewhere)
    with pytest.raises(InvalidInput, match="benchmark.json: cannot open"):
        store.load(tmp_path / "ws", "b1")


def test_a_missing_or_damaged_benchmark_record_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="^benchmark b1: no such benchmark"):
        store.load(tmp_path / "ws", "b1")
    _bench(tmp_path / "ws", "{not json")
    with pytest.raises(InvalidInput, match="benchmark.json: not valid JSON"):
        store.load(tmp_path / "ws", "b1")


def test_a_symlinked_winner_is_not_followed(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path / "run")
    for attempt in (1, 2):
        layout.attempt(0, attempt).root.mkdir(parents=True)
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps({"attempt": 1}))
    layout.winner_json(0).symlink_to(planted)
    assert attempt_dir(layout, 0) == layout.attempt(0, 2).root  # the latest, not the link's
    layout.winner_json(0).unlink()
    layout.winner_json(0).write_text(json.dumps({"attempt": 1}))
    assert attempt_dir(layout, 0) == layout.attempt(0, 1).root
