"""Seed data files: indexing by byte offset, reading rows back, errors with file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from synthbatch.agent_stdlib.recipe.seeds import SeedError, open_rows, read_row, scan


def write(path: Path, data: str) -> str:
    path.write_bytes(data.encode("utf-8"))
    return str(path)


def rows(path: str, **kwargs) -> list:
    index = scan(path, **kwargs)
    with open_rows(path) as handle:
        return [read_row(handle, index, i) for i in range(index.rows)]


def test_jsonl_rows_by_offset_blank_lines_skipped(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", '{"topic": "tides", "meta": {"lang": "en"}}\n\n'
                                       '{"topic": "über"}\n{"topic": "x", "n": 3}')
    index = scan(path, required=["topic"])
    assert index.fields == ("topic", "meta") and index.rows == 3
    assert list(index.offsets) == [0, 44, 63]
    assert rows(path) == [{"topic": "tides", "meta": {"lang": "en"}}, {"topic": "über"},
                          {"topic": "x", "n": 3}]


def test_csv_with_quoted_newlines_and_a_bom(tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", '\ufefftopic,level\r\n"tides, and ""moons""",1\r\n'
                                     '"two\nlines",2\r\n\r\nlast,3\r\n')
    index = scan(path, required=["level"])
    assert index.fields == ("topic", "level") and index.rows == 3
    assert rows(path) == [{"topic": 'tides, and "moons"', "level": "1"},
                          {"topic": "two\nlines", "level": "2"},
                          {"topic": "last", "level": "3"}]


@pytest.mark.parametrize("name,data,message", [
    ("t.jsonl", "", "t.jsonl: empty (no rows)"),
    ("t.jsonl", "\n\n", "t.jsonl: empty (no rows)"),
    ("t.csv", "topic\n", "t.csv: empty (no rows)"),
    ("t.jsonl", '{"topic": 1}\n[1, 2]\n', "t.jsonl:2: not a JSON object"),
    ("t.jsonl", '{"topic": 1}\n\n{"topic": \n', "t.jsonl:3: not valid JSON"),
    ("t.jsonl", '{"topic": 1}\n{"other": 2}\n', "t.jsonl:2: no field 'topic'"),
    ("t.csv", "topic,level\na,1\nb\n", "t.csv:3: 1 fields, the header has 2"),
    ("t.csv", "topic,topic\na,b\n", "t.csv:1: the header names 'topic' twice"),
    ("t.csv", "topic,\na,b\n", "t.csv:1: the header has an empty field name"),
    ("t.csv", "level\n1\n", "t.csv:1: the header has no field 'topic'"),
    ("t.txt", "x\n", "unknown seed data format '.txt'"),
])
def test_bad_files_are_named_with_their_line(tmp_path: Path, name: str, data: str,
                                             message: str) -> None:
    path = write(tmp_path / name, data)
    with pytest.raises(SeedError) as err:
        scan(path, required=["topic"])
    assert message in str(err.value)


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SeedError, match="no such file"):
        scan(str(tmp_path / "none.jsonl"))
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(SeedError, match="not a regular file|cannot read"):
        scan(str(tmp_path / "dir.jsonl"))


def test_without_validation_a_bad_row_is_found_when_read(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", '{"topic": 1}\n{"topic": 2}\nnot json\n')
    index = scan(path, validate=False)
    assert index.rows == 3
    with open_rows(path) as handle:
        assert read_row(handle, index, 1) == {"topic": 2}
        with pytest.raises(SeedError, match=r"t.jsonl:3: not valid JSON"):
            read_row(handle, index, 2)
