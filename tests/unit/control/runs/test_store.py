"""Run ids: minted and validated in one place (control/runs/store.py)."""

from __future__ import annotations

import re

from synthbatch.control.runs.store import RUN_ID as RUN_ID_PATTERN
from synthbatch.control.runs.store import new_run_id


def test_new_run_id_format() -> None:
    run_id = new_run_id("quickstart", now=0)
    assert re.fullmatch(r"quickstart-19700101-000000-[0-9a-f]{6}", run_id), run_id


def test_new_run_id_uses_utc() -> None:
    assert new_run_id("x", now=1_700_000_000).startswith("x-20231114-221320-")


def test_new_run_id_unique_and_valid() -> None:
    ids = {new_run_id("a.b_c-d") for _ in range(200)}
    assert len(ids) == 200
    assert all(RUN_ID_PATTERN.match(i) for i in ids)
