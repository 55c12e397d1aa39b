"""Resume across attempts: scanning an earlier attempt's kept output (the generator using it:
``tests/unit/agent/client/test_resume_generate.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from synthbatch.agent_stdlib.candidate import CandidateError, count_records
from synthbatch.agent_stdlib.contracts import AttemptRecord
from synthbatch.agent_stdlib.resume import record_index, scan_kept
from tests.agent_runs import kept_line as line
from tests.agent_runs import write_text as write

# ----------------------------------------------------------------------------- scan_kept


def test_record_index_accepts_only_complete_json_objects_with_an_int_index() -> None:
    assert record_index(b'{"index": 7}\n') == 7
    assert record_index(b'{"index": 7}') is None  # torn: no newline
    assert record_index(b'{"index": 7, "x": \n') is None
    assert record_index(b'[1, 2]\n') is None
    assert record_index(b'{"index": true}\n') is None
    assert record_index(b'{"index": "7"}\n') is None
    assert record_index(b"\n") is None


def test_scan_kept_indexes_complete_records_in_range(tmp_path: Path) -> None:
    out = tmp_path / "output"
    write(out / "records-000000000010.jsonl",
          "".join(line(i) + "\n" for i in (10, 11, 12)) + line(13)[:9])  # torn last line
    kept = scan_kept(out, offset=10, count=5)
    assert sorted(kept.spans) == [10, 11, 12]
    assert kept.skipped == 1
    assert 11 in kept and 13 not in kept and len(kept) == 3
    assert list(kept.missing(range(10, 15))) == [13, 14]


def test_scan_kept_skips_out_of_range_duplicates_and_garbage(tmp_path: Path) -> None:
    out = tmp_path / "output"
    write(out / "a.jsonl", "\n".join([line(4), line(5), "not json", line(9), line(5, v=2)])
          + "\n")
    kept = scan_kept(out, offset=5, count=3)
    assert sorted(kept.spans) == [5]
    assert kept.skipped == 4  # 4 (below), garbage, 9 (above), the second 5
    buf = _Sink()
    assert kept.copy_run(5, 8, buf, {}) == 1
    assert buf.data == (line(5) + "\n").encode()  # the first copy wins


def test_scan_kept_of_a_missing_or_symlinked_folder_is_empty(tmp_path: Path) -> None:
    assert len(scan_kept(tmp_path / "nope", 0, 10)) == 0
    real = tmp_path / "real"
    write(real / "a.jsonl", line(0) + "\n")
    (tmp_path / "link").symlink_to(real)
    assert len(scan_kept(tmp_path / "link", 0, 10)) == 0


def test_scan_kept_counts_the_dropped_records_as_done(tmp_path: Path) -> None:
    folder = tmp_path / "output"
    write(folder / "r.jsonl", line(0) + "\n" + line(2) + "\n")
    write(folder / ".dropped-000000000000.jsonl", '{"index": 1, "error": "x"}\n'
          '{"index": 9}\n{"index": 3')  # out of range, torn
    kept = scan_kept(folder, 0, 4)
    assert sorted(kept.spans) == [0, 2] and sorted(kept.dropped) == [1]
    assert len(kept) == 3 and 1 in kept and list(kept.missing(range(4))) == [3]
    assert kept.dropped[1] == b'{"index": 1, "error": "x"}\n'


def test_completion_tokens_of_both_record_shapes() -> None:
    from synthbatch.agent_stdlib.resume import completion_tokens

    assert completion_tokens({"usage": {"completion_tokens": 4}}) == 4
    assert completion_tokens({"_meta": {"columns": {
        "q": {"usage": {"completion_tokens": 5}}, "a": {"usage": {"completion_tokens": 7}},
        "bad": {"usage": {"completion_tokens": True}}, "none": "x"}}}) == 12
    assert completion_tokens({"_meta": "x", "usage": {"completion_tokens": 2}}) == 2


def test_scan_kept_ignores_hidden_files_and_symlinked_files(tmp_path: Path) -> None:
    out = tmp_path / "output"
    write(out / ".tmp.jsonl", line(0) + "\n")
    other = write(tmp_path / "elsewhere.jsonl", line(1) + "\n")
    out.joinpath("link.jsonl").symlink_to(other)
    write(out / "sub" / "b.jsonl", line(2) + "\n")
    assert sorted(scan_kept(out, 0, 3).spans) == [2]


class _Sink:
    def __init__(self) -> None:
        self.data = b""
        self.writes = 0

    def write(self, data: bytes) -> int:
        self.data += data
        self.writes += 1
        return len(data)


def test_copy_run_copies_adjacent_lines_as_one_block_and_stops_at_a_gap(tmp_path: Path) -> None:
    out = tmp_path / "output"
    write(out / "a.jsonl", "".join(line(i) + "\n" for i in (0, 1, 2, 4)))
    kept = scan_kept(out, 0, 6)
    sink, handles = _Sink(), {}
    assert kept.copy_run(0, 6, sink, handles) == 3
    assert sink.writes == 1
    assert sink.data == "".join(line(i) + "\n" for i in (0, 1, 2)).encode()
    assert kept.copy_run(3, 6, sink, handles) == 0
    assert kept.copy_run(4, 6, sink, handles) == 1
    assert kept.copy_run(0, 2, _Sink(), handles) == 2  # bounded by stop
    for handle in handles.values():
        handle.close()


def test_copy_run_notices_a_file_that_shrank(tmp_path: Path) -> None:
    out = tmp_path / "output"
    path = write(out / "a.jsonl", line(0) + "\n" + line(1) + "\n")
    kept = scan_kept(out, 0, 2)
    path.write_text(line(0)[:5])
    with pytest.raises(OSError, match="changed while resuming"):
        kept.copy_run(0, 2, _Sink(), {})


# ----------------------------------------------------------------------------- candidate


def test_count_records_ignores_a_torn_last_line_but_not_a_bad_complete_one(
        tmp_path: Path) -> None:
    out = tmp_path / "output"
    write(out / "a.jsonl", line(0) + "\n" + line(1) + "\n" + line(2)[:7])
    assert count_records(out) == 2
    write(out / "b.jsonl", "oops\n")
    with pytest.raises(CandidateError, match="b.jsonl:1"):
        count_records(out)
    with pytest.raises(CandidateError, match="missing"):
        count_records(tmp_path / "absent")


def test_attempt_record_carries_resume_from_and_old_records_still_load() -> None:
    record = AttemptRecord(run_id="r", shard=1, attempt=2, state="created", revision=1,
                           updated_at=1.0, resume_from=1)
    assert AttemptRecord.from_dict(record.to_dict()).resume_from == 1
    old = record.to_dict()
    del old["resume_from"]
    assert AttemptRecord.from_dict(old).resume_from is None
