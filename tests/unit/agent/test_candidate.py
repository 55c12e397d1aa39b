"""Candidate validation with dropped records: accounted for, never counted as records."""

from __future__ import annotations

from pathlib import Path

import pytest

from synthbatch.agent_stdlib.candidate import (
    CandidateError,
    build_manifest,
    count_records,
    dropped_indices,
    dropped_name,
)


def output(tmp_path: Path, records: int, dropped: int) -> Path:
    out = tmp_path / "output"
    out.mkdir()
    (out / "records-000000000000.jsonl").write_text(
        "".join(f'{{"index": {i}}}\n' for i in range(records)))
    (out / dropped_name("000000000000")).write_text(
        "".join(f'{{"index": {records + i}, "column": "q", "error": "x"}}\n'
                for i in range(dropped)))
    return out


def test_records_plus_dropped_make_the_shard(tmp_path: Path) -> None:
    out = output(tmp_path, 7, 3)
    manifest = build_manifest(out, shard=0, attempt=1, expected=10)
    assert (manifest.records, manifest.dropped) == (7, 3)
    assert [f.path for f in manifest.files] == ["records-000000000000.jsonl"]  # not a record
    assert count_records(out) == 10
    assert dropped_indices(out) == {7, 8, 9}


def test_a_missing_record_is_not_hidden_by_the_dropped_ones(tmp_path: Path) -> None:
    out = output(tmp_path, 6, 3)
    with pytest.raises(CandidateError, match=r"output/ holds 6 records and 3 dropped, the "
                                             r"shard needs 10"):
        build_manifest(out, shard=0, attempt=1, expected=10)


def test_a_dropped_index_listed_twice_counts_once_and_a_torn_line_not_at_all(
        tmp_path: Path) -> None:
    out = output(tmp_path, 8, 0)
    (out / dropped_name("x")).write_text('{"index": 8}\n{"index": 8}\n{"index": 9')
    assert dropped_indices(out) == {8}
    with pytest.raises(CandidateError, match="8 records and 1 dropped"):
        build_manifest(out, shard=0, attempt=1, expected=10)


@pytest.mark.parametrize("line,message", [("nonsense\n", "not a dropped-record line"),
                                          ('{"index": "3"}\n', "no integer index"),
                                          ("[3]\n", "not a dropped-record line")])
def test_a_malformed_dropped_line_is_named(tmp_path: Path, line: str, message: str) -> None:
    out = output(tmp_path, 1, 0)
    (out / dropped_name("a")).write_text(line)
    with pytest.raises(CandidateError, match=rf"output/\.dropped-a\.jsonl:1: {message}"):
        dropped_indices(out)
