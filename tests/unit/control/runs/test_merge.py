"""Candidate manifests (agent side) and merging the winners of a run (control side)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from synthbatch.agent_stdlib.candidate import CandidateError, build_manifest, verify_files
from synthbatch.agent_stdlib.contracts import (
    WinnerRecord,
    sha256_bytes,
)
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import ensure_dir, publish_immutable, publish_json_immutable
from synthbatch.control.errors import Conflict
from synthbatch.control.runs.merge import files_sha256, merge_run, verify_jsonl
from tests.fakes import make_plan_for

# ----------------------------------------------------------------------------- build_manifest


def write_lines(path: Path, lines: List[str]) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(data)
    return data


def test_manifest_counts_records(tmp_path: Path) -> None:
    out = tmp_path / "output"
    a = write_lines(out / "b.jsonl", ['{"i": 0}', "", '{"i": 1}', "   "])
    b = write_lines(out / "a" / "c.jsonl", ['{"i": 2}'])
    manifest = build_manifest(out, shard=4, attempt=2, expected=3)
    assert (manifest.shard, manifest.attempt, manifest.records) == (4, 2, 3)
    assert [f.path for f in manifest.files] == ["a/c.jsonl", "b.jsonl"]
    by_path = {f.path: f for f in manifest.files}
    assert by_path["b.jsonl"].records == 2 and by_path["a/c.jsonl"].records == 1
    assert by_path["b.jsonl"].bytes == len(a)
    assert by_path["b.jsonl"].sha256 == hashlib.sha256(a).hexdigest()
    assert by_path["a/c.jsonl"].sha256 == hashlib.sha256(b).hexdigest()


def test_manifest_last_line_without_newline(tmp_path: Path) -> None:
    out = tmp_path / "output"
    out.mkdir()
    (out / "x.jsonl").write_bytes(b'{"i": 0}\n{"i": 1}')
    assert build_manifest(out, 0, 1, 2).files[0].bytes == 17


def test_manifest_empty_output(tmp_path: Path) -> None:
    out = tmp_path / "output"
    out.mkdir()
    assert build_manifest(out, 0, 1, 0).files == ()
    with pytest.raises(CandidateError, match="holds 0 records, the shard needs 1"):
        build_manifest(out, 0, 1, 1)


def test_manifest_wrong_record_count(tmp_path: Path) -> None:
    out = tmp_path / "output"
    write_lines(out / "x.jsonl", ['{"i": 0}', '{"i": 1}', '{"i": 2}'])
    with pytest.raises(CandidateError, match="holds 3 records, the shard needs 4"):
        build_manifest(out, 0, 1, 4)
    with pytest.raises(CandidateError, match="holds 3 records, the shard needs 2"):
        build_manifest(out, 0, 1, 2)


def test_manifest_non_json_line(tmp_path: Path) -> None:
    out = tmp_path / "output"
    write_lines(out / "sub" / "x.jsonl", ['{"i": 0}', "", '{"i": 1', '{"i": 2}'])
    with pytest.raises(CandidateError) as info:
        build_manifest(out, 0, 1, 3)
    assert str(info.value).startswith("sub/x.jsonl:3: not a JSON record")
    assert "\n" not in str(info.value)


def test_manifest_non_utf8_line(tmp_path: Path) -> None:
    out = tmp_path / "output"
    out.mkdir()
    (out / "x.jsonl").write_bytes(b'{"i": 0}\n"\xff"\n')
    with pytest.raises(CandidateError, match="x.jsonl:2"):
        build_manifest(out, 0, 1, 2)


def test_manifest_ignores_hidden_temp_files(tmp_path: Path) -> None:
    out = tmp_path / "output"
    write_lines(out / "x.jsonl", ['{"i": 0}'])
    write_lines(out / ".x.jsonl.tmp", ["half a rec"])
    write_lines(out / ".partial", ['{"i": 1}'])
    manifest = build_manifest(out, 0, 1, 1)
    assert [f.path for f in manifest.files] == ["x.jsonl"]


def test_manifest_rejects_symlinked_file(tmp_path: Path) -> None:
    out = tmp_path / "output"
    write_lines(out / "x.jsonl", ['{"i": 0}'])
    outside = tmp_path / "secret.jsonl"
    write_lines(outside, ['{"i": 1}'])
    (out / "y.jsonl").symlink_to(outside)
    with pytest.raises(CandidateError, match="output/y.jsonl: symlinks are not allowed"):
        build_manifest(out, 0, 1, 2)


def test_manifest_rejects_symlinked_dir(tmp_path: Path) -> None:
    out = tmp_path / "output"
    write_lines(out / "x.jsonl", ['{"i": 0}'])
    (tmp_path / "elsewhere").mkdir()
    (out / "d").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CandidateError, match="output/d: symlinks"):
        build_manifest(out, 0, 1, 1)


def test_manifest_rejects_hidden_symlink(tmp_path: Path) -> None:
    out = tmp_path / "output"
    out.mkdir()
    (out / ".hidden").symlink_to("/etc/passwd")
    with pytest.raises(CandidateError, match="symlinks"):
        build_manifest(out, 0, 1, 0)


def test_manifest_rejects_fifo(tmp_path: Path) -> None:
    out = tmp_path / "output"
    out.mkdir()
    os.mkfifo(out / "pipe")
    with pytest.raises(CandidateError, match="output/pipe: not a regular file"):
        build_manifest(out, 0, 1, 0)


def test_manifest_output_missing_or_symlink(tmp_path: Path) -> None:
    with pytest.raises(CandidateError, match="missing or not a directory"):
        build_manifest(tmp_path / "output", 0, 1, 0)
    (tmp_path / "real").mkdir()
    (tmp_path / "output").symlink_to(tmp_path / "real")
    with pytest.raises(CandidateError, match="missing or not a directory"):
        build_manifest(tmp_path / "output", 0, 1, 0)


# ----------------------------------------------------------------------------- verify_files


@pytest.fixture
def candidate(tmp_path: Path) -> Path:
    out = tmp_path / "output"
    write_lines(out / "a.jsonl", ['{"i": 0}', '{"i": 1}'])
    write_lines(out / "s" / "b.jsonl", ['{"i": 2}'])
    return out


def test_verify_untouched(candidate: Path) -> None:
    manifest = build_manifest(candidate, 0, 1, 3)
    verify_files(candidate, manifest.files)


def test_verify_same_size_tampering(candidate: Path) -> None:
    manifest = build_manifest(candidate, 0, 1, 3)
    path = candidate / "a.jsonl"
    path.write_bytes(path.read_bytes().replace(b'"i": 1', b'"i": 7'))
    with pytest.raises(CandidateError, match="a.jsonl: content does not match"):
        verify_files(candidate, manifest.files)


def test_verify_appended(candidate: Path) -> None:
    manifest = build_manifest(candidate, 0, 1, 3)
    with open(candidate / "s" / "b.jsonl", "ab") as handle:
        handle.write(b'{"i": 3}\n')
    with pytest.raises(CandidateError, match="b.jsonl"):
        verify_files(candidate, manifest.files)


def test_verify_deleted(candidate: Path) -> None:
    manifest = build_manifest(candidate, 0, 1, 3)
    (candidate / "a.jsonl").unlink()
    with pytest.raises(CandidateError, match="missing or not a regular file"):
        verify_files(candidate, manifest.files)


def test_verify_replaced_by_symlink(candidate: Path, tmp_path: Path) -> None:
    manifest = build_manifest(candidate, 0, 1, 3)
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes((candidate / "a.jsonl").read_bytes())
    (candidate / "a.jsonl").unlink()
    (candidate / "a.jsonl").symlink_to(copy)  # same bytes, but through a link
    with pytest.raises(CandidateError, match="missing or not a regular file"):
        verify_files(candidate, manifest.files)


# ----------------------------------------------------------------------------- merge


def build_run(root: Path, records: int = 5, count: int = 3,
              winners: Optional[Dict[int, int]] = None) -> RunLayout:
    """A run dir; ``winners`` maps shard -> attempt (default: every shard, attempt 1)."""
    layout = RunLayout(ensure_dir(root))
    plan = make_plan_for(records, count)
    publish_immutable(layout.plan_json, plan.to_json().encode(), mode=0o400)
    chosen = winners if winners is not None else {s.index: 1 for s in plan.shards}
    for shard in plan.shards:
        if shard.index not in chosen:
            continue
        attempt = chosen[shard.index]
        out = layout.attempt(shard.index, attempt).output
        ids = list(range(shard.record_offset, shard.record_offset + shard.num_records))
        half = len(ids) // 2
        write_lines(out / "part-1.jsonl", [json.dumps({"i": i}) for i in ids[half:]])
        if half:
            write_lines(out / "part-0.jsonl", [json.dumps({"i": i}) for i in ids[:half]])
        manifest = build_manifest(out, shard.index, attempt, shard.num_records)
        result = manifest.to_json().encode()
        publish_immutable(layout.attempt(shard.index, attempt).result_json, result)
        winner = WinnerRecord(shard=shard.index, attempt=attempt, records=manifest.records,
                              result_sha256=sha256_bytes(result), files=manifest.files,
                              created_at=1.0)
        assert publish_json_immutable(layout.winner_json(shard.index), winner.to_dict())
    return layout


def merged_ids(path: Path) -> List[int]:
    return [json.loads(line)["i"] for line in path.read_text().splitlines()]


def test_merge_in_shard_order(tmp_path: Path) -> None:
    layout = build_run(tmp_path / "run", records=11, count=4, winners={0: 1, 1: 3, 2: 1, 3: 2})
    manifest = merge_run(layout, None, allow_partial=False)
    target = layout.merged / "records.jsonl"
    assert manifest["output"] == str(target)
    assert merged_ids(target) == list(range(11))
    data = target.read_bytes()
    assert verify_jsonl(target, manifest) is None and "sha256" not in manifest
    assert manifest["files_sha256"] == files_sha256(
        [(f["sha256"], f["bytes"]) for s in manifest["shards"] for f in s["files"]])
    assert manifest["bytes"] == len(data) and manifest["schema_version"] == 2
    assert manifest["records"] == 11
    assert manifest["complete"] is True and manifest["missing_shards"] == []
    assert [(s["shard"], s["attempt"]) for s in manifest["shards"]] == [(0, 1), (1, 3), (2, 1),
                                                                        (3, 2)]
    on_disk = json.loads((layout.merged / "manifest.json").read_text())
    assert on_disk == {k: v for k, v in manifest.items() if k not in ("manifest", "card")}
    assert manifest["manifest"] == str(layout.merged / "manifest.json")
    assert sorted(p.name for p in layout.merged.iterdir()) == [
        "README.md", "card.json", "manifest.json", "records.jsonl"]


def test_merge_is_idempotent(tmp_path: Path) -> None:
    layout = build_run(tmp_path / "run")
    first = merge_run(layout, None, False)
    before = (layout.merged / "records.jsonl").read_bytes()
    second = merge_run(layout, None, False)
    assert (layout.merged / "records.jsonl").read_bytes() == before
    assert {k: v for k, v in first.items() if k != "merged_at"} == \
        {k: v for k, v in second.items() if k != "merged_at"}


def test_merge_to_explicit_output(tmp_path: Path) -> None:
    layout = build_run(tmp_path / "run")
    target = tmp_path / "out" / "all.jsonl"
    target.parent.mkdir()
    manifest = merge_run(layout, target, False)
    assert manifest["output"] == str(target)
    assert merged_ids(target) == list(range(5))
    assert [p.name for p in target.parent.iterdir()] == ["all.jsonl"]  # no temp left behind
    assert (layout.merged / "manifest.json").is_file()


def test_merge_refuses_missing_shards(tmp_path: Path) -> None:
    layout = build_run(tmp_path / "run", records=6, count=4, winners={0: 1, 2: 1})
    with pytest.raises(Conflict) as info:
        merge_run(layout, None, False)
    message = info.value.message
    assert "shards without a winner: 1, 3" in message
    assert "r-20240101-000000-abcdef" in message
    assert info.value.hint and "--allow-partial" in info.value.hint
    assert info.value.exit_code == 4
    assert not layout.merged.exists() or not any(layout.merged.iterdir())


def test_merge_lists_many_missing_shards_briefly(tmp_path: Path) -> None:
    layout = build_run(tmp_path / "run", records=30, count=25, winners={})
    with pytest.raises(Conflict) as info:
        merge_run(layout, None, False)
    assert "0, 1, 2" in info.value.message and "19 and 5 more" in info.value.message


def test_merge_allow_partial(tmp_path: Path) -> None:
    layout = build_run(tmp_path / "run", records=6, count=3, winners={0: 1, 2: 1})
    manifest = merge_run(layout, None, allow_partial=True)
    assert manifest["complete"] is False
    assert manifest["missing_shards"] == [1]
    assert manifest["records"] == 4
    assert merged_ids(layout.merged / "records.jsonl") == [0, 1, 4, 5]


def test_merge_tampered_winner_file(tmp_path: Path) -> None:
    layout = build_run(tmp_path / "run")
    path = layout.attempt(1, 1).output / "part-1.jsonl"
    path.write_bytes(path.read_bytes().replace(b'"i": 3', b'"i": 9'))
    with pytest.raises(Conflict) as info:
        merge_run(layout, None, False)
    assert info.value.message.startswith("shard 1: ")
    assert "part-1.jsonl" in info.value.message
    assert not (layout.merged / "records.jsonl").exists()


def test_merge_deleted_winner_file(tmp_path: Path) -> None:
    layout = build_run(tmp_path / "run")
    (layout.attempt(2, 1).output / "part-1.jsonl").unlink()
    with pytest.raises(Conflict, match="shard 2: .*part-1.jsonl: No such file"):
        merge_run(layout, None, False)
    # --allow-partial leaves the shard out and says why (it used to abort here: issue 13)
    manifest = merge_run(layout, None, True)
    assert manifest["missing_shards"] == [2] and manifest["complete"] is False
    assert manifest["bad_shards"][0]["shard"] == 2
    assert "part-1.jsonl: No such file" in manifest["bad_shards"][0]["reason"]
    assert merged_ids(layout.merged / "records.jsonl") == [0, 1, 2, 3]


def test_merge_without_plan(tmp_path: Path) -> None:
    from synthbatch.control.errors import NotFound

    layout = RunLayout(ensure_dir(tmp_path / "run"))
    with pytest.raises(NotFound, match="plan.json"):
        merge_run(layout, None, False)


def test_merge_corrupt_winner_record_is_a_conflict(tmp_path: Path) -> None:
    layout = build_run(tmp_path / "run")
    winner = layout.winner_json(1)
    winner.chmod(0o600)
    winner.write_text('{"schema_version": 1, "shard"')
    with pytest.raises(Conflict, match="winner.json"):
        merge_run(layout, None, False)


def test_winner_record_carries_manifest(tmp_path: Path) -> None:
    layout = build_run(tmp_path / "run")
    data = json.loads(layout.winner_json(0).read_text())
    winner = WinnerRecord.from_dict(data)
    result = layout.attempt(0, 1).result_json.read_bytes()
    assert winner.result_sha256 == sha256_bytes(result)
    assert replace(winner, created_at=0.0).files == winner.files


# ----------------------------------------------------------------------------- merge (issue 8)


def test_merge_manifest_is_deterministic_and_names_plan_and_files(tmp_path: Path) -> None:
    layout = build_run(tmp_path / "run", records=7, count=3)
    first = merge_run(layout, None, False)
    manifest_bytes = (layout.merged / "manifest.json").read_bytes()
    second = merge_run(layout, None, False)
    assert first == second
    assert (layout.merged / "manifest.json").read_bytes() == manifest_bytes
    assert first["plan_sha256"] == hashlib.sha256(layout.plan_json.read_bytes()).hexdigest()
    assert first["format"] == "jsonl"
    shard0 = first["shards"][0]
    assert [f["path"] for f in shard0["files"]] == ["part-0.jsonl", "part-1.jsonl"]
    on_disk = layout.attempt(0, 1).output / "part-0.jsonl"
    assert shard0["files"][0]["sha256"] == hashlib.sha256(on_disk.read_bytes()).hexdigest()


def test_merge_adds_a_missing_final_newline(tmp_path: Path) -> None:
    layout = build_run(tmp_path / "run", records=4, count=2)
    out = layout.attempt(0, 1).output
    # rewrite shard 0 as one file without a final newline, with a winner that says so
    for path in out.iterdir():
        path.unlink()
    (out / "x.jsonl").write_bytes(b'{"i": 0}\n{"i": 1}')
    manifest = build_manifest(out, 0, 1, 2)
    winner = WinnerRecord(shard=0, attempt=1, records=2, result_sha256="0" * 64,
                          files=manifest.files, created_at=1.0)
    path = layout.winner_json(0)
    path.chmod(0o600)
    path.write_text(winner.to_json())
    merged = merge_run(layout, None, False)
    target = layout.merged / "records.jsonl"
    assert merged_ids(target) == [0, 1, 2, 3]
    assert verify_jsonl(target, merged) is None  # the added newline is part of the format
    data = target.read_bytes()
    for bad, why in ((data.replace(b'{"i": 0}\n{"i": 1}\n', b'{"i": 0}\n{"i": 1} '),
                      "file 0: not followed by the newline"),
                     (data.replace(b'"i": 2', b'"i": 7'), "file 1: its bytes do not match"),
                     (data + b"\n", "goes on after the last file"),
                     (data[:-3], "the output ends early")):
        target.write_bytes(bad)
        assert why in (verify_jsonl(target, merged) or ""), why
    target.write_bytes(data)
    assert "not the digest" in verify_jsonl(target, {**merged, "files_sha256": "0" * 64})


def test_merge_checks_sizes_before_reading_anything(tmp_path: Path) -> None:
    layout = build_run(tmp_path / "run", records=6, count=3)
    path = layout.attempt(2, 1).output / "part-1.jsonl"
    path.write_bytes(path.read_bytes() + b'{"i": 99}\n')
    with pytest.raises(Conflict, match=r"shard 2: .*part-1.jsonl: not the \d+-byte regular"):
        merge_run(layout, None, False)
    assert not layout.merged.exists()  # refused before the merge folder was even made


def test_merge_rejects_an_output_in_a_missing_directory(tmp_path: Path) -> None:
    from synthbatch.control.errors import InvalidInput

    layout = build_run(tmp_path / "run")
    with pytest.raises(InvalidInput, match="is not a directory"):
        merge_run(layout, tmp_path / "nope" / "out.jsonl", False)


def test_concurrent_merges_give_the_same_bytes(tmp_path: Path) -> None:
    import threading

    layout = build_run(tmp_path / "run", records=400, count=8)
    target = tmp_path / "out.jsonl"
    errors: List[BaseException] = []

    def one() -> None:
        try:
            merge_run(layout, target, False)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert merged_ids(target) == list(range(400))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_merge_of_many_blocks_streams_and_verifies(tmp_path: Path, monkeypatch) -> None:
    from synthbatch.control.runs import merge as merging

    monkeypatch.setattr(merging, "CHUNK", 64)  # many blocks per file, every buffer reused
    layout = build_run(tmp_path / "run", records=300, count=3)
    manifest = merge_run(layout, None, False)
    data = (layout.merged / "records.jsonl").read_bytes()
    assert merged_ids(layout.merged / "records.jsonl") == list(range(300))
    assert verify_jsonl(layout.merged / "records.jsonl", manifest) is None
    path = layout.attempt(1, 1).output / "part-1.jsonl"
    path.write_bytes(path.read_bytes().replace(b'"i": 150', b'"i": 951'))  # same size
    with pytest.raises(Conflict, match="shard 1: .*does not match its winner's digest"):
        merge_run(layout, None, False)
    assert (layout.merged / "records.jsonl").read_bytes() == data  # the old merge stays


def test_merge_parquet_without_pyarrow_says_how_to_install(tmp_path: Path,
                                                           monkeypatch) -> None:
    import sys

    from synthbatch.control.errors import InvalidInput

    layout = build_run(tmp_path / "run")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(InvalidInput, match="needs pyarrow") as info:
        merge_run(layout, None, False, fmt="parquet")
    assert "pip install 'pyarrow>=14'" in (info.value.hint or "")
    with pytest.raises(InvalidInput, match="--format 'csv'"):
        merge_run(layout, None, False, fmt="csv")


def test_merge_parquet(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    layout = build_run(tmp_path / "run", records=9, count=3, winners={0: 1, 2: 1})
    manifest = merge_run(layout, None, True, fmt="parquet")
    target = layout.merged / "data"
    assert manifest["output"] == str(target) and manifest["format"] == "parquet"
    assert pq.read_table(target).column("i").to_pylist() == [0, 1, 2, 6, 7, 8]
    [part] = manifest["parquet_files"]
    assert part["path"] == "train-00000-of-00001.parquet" and part["records"] == 6
    data = (target / part["path"]).read_bytes()
    assert part["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["files_sha256"] == files_sha256([(part["sha256"], len(data))])
    merge_run(layout, None, True, fmt="parquet")  # a rerun replaces the folder: same bytes
    assert sorted(p.name for p in target.iterdir()) == [part["path"]]
    assert (target / part["path"]).read_bytes() == data


def test_the_copy_is_made_in_the_kernel_and_hashed_in_the_output(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """copy_file_range moves the bytes; a chunk larger than one map granule and files that
    do not start on a page boundary of the output are hashed where they landed."""
    from synthbatch.control.runs import merge

    monkeypatch.setattr(merge, "COPY_CHUNK", 5000)  # many chunks, unaligned offsets
    layout = build_run(tmp_path / "run", records=400, count=3)
    calls: List[int] = []
    real = os.copy_file_range
    monkeypatch.setattr(os, "copy_file_range",
                        lambda *a: calls.append(1) or real(*a))
    manifest = merge_run(layout, None, allow_partial=False)
    assert merged_ids(layout.merged / "records.jsonl") == list(range(400))
    assert verify_jsonl(layout.merged / "records.jsonl", manifest) is None and len(calls) > 6


@pytest.mark.parametrize("code", [errno.EXDEV, errno.ENOSYS, errno.EINVAL])
def test_without_copy_file_range_the_bytes_stream_through_buffers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    layout = build_run(tmp_path / "run", records=40, count=3)
    expected = merge_run(layout, None, allow_partial=False)
    data = (layout.merged / "records.jsonl").read_bytes()

    def refuse(*args: object) -> int:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "copy_file_range", refuse)
    again = merge_run(layout, None, allow_partial=False)
    assert again == expected and (layout.merged / "records.jsonl").read_bytes() == data


def test_a_file_changed_during_the_copy_fails_its_digest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The output's bytes are what is hashed: a source rewritten after the copy began
    (between two copy_file_range calls) is caught, and nothing is published."""
    from synthbatch.control.errors import Conflict
    from synthbatch.control.runs import merge

    monkeypatch.setattr(merge, "COPY_CHUNK", 64)
    layout = build_run(tmp_path / "run", records=80, count=2)
    source = layout.attempt(0, 1).output / "part-1.jsonl"
    assert source.stat().st_size > 64
    real, seen = os.copy_file_range, []

    def tamper(src: int, dst: int, count: int) -> int:
        seen.append(1)
        if len(seen) == 2:  # after the first chunk: same size, other bytes
            size = source.stat().st_size
            with open(source, "r+b") as handle:
                handle.seek(size - 8)
                handle.write(b"X" * 8)
        return real(src, dst, count)

    monkeypatch.setattr(os, "copy_file_range", tamper)
    with pytest.raises(Conflict, match="does not match its winner's digest"):
        merge_run(layout, None, allow_partial=False)
    assert not (layout.merged / "records.jsonl").exists()
