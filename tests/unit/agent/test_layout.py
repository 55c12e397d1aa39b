"""Run paths and folder names (``agent_stdlib/layout.py``): one home for each."""

from __future__ import annotations

from pathlib import Path

import pytest

from synthbatch.agent_stdlib.layout import RunLayout, attempt_name, attempt_number, attempt_path


@pytest.mark.parametrize("attempt", [1, 2, 17, 9999, 12345])
def test_an_attempt_folder_name_reads_back_as_its_number(attempt: int) -> None:
    assert attempt_number(attempt_name(attempt)) == attempt


@pytest.mark.parametrize("name", ["attempt-1", "attempt-00a1", "attempt-", "attempts",
                                  "attempt-\u00b2\u00b2\u00b2\u00b2", "x-0001", ".attempt-0001"])
def test_other_names_are_not_attempt_folders(name: str) -> None:
    assert attempt_number(name) is None


def test_the_string_and_path_forms_agree(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path / "runs" / "r")
    assert layout.attempt_json_path(3, 2) == str(layout.attempt(3, 2).attempt_json)
    assert attempt_path(str(layout.shard_dir(3)), 2) == str(layout.attempt(3, 2).root)
    assert layout.attempt(3, 2).root.parent == layout.attempts_dir(3)
