"""The Data Designer adapter's standard-library parts: its output file, environment,
version rule and Data Designer's file names (no data_designer needed)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from synthbatch.agent_stdlib.client import data_designer
from synthbatch.agent_stdlib.client.data_designer import (
    CL100K_URL,
    DDError,
    Progress,
    ShardFile,
    batch_number,
    changed_config,
    cl100k_cached,
    dd_environment,
    fill,
    version_problem,
)
from synthbatch.agent_stdlib.contracts import DataDesignerSpec, split_dd_config
from synthbatch.agent_stdlib.resume import scan_kept


def line(index: int, text: str = "") -> bytes:
    return (json.dumps({"index": index, "text": text or f"r{index}"}) + "\n").encode()


def indices(path: Path) -> list:
    return [json.loads(raw)["index"] for raw in path.read_bytes().splitlines()]


def test_a_torn_last_line_is_cut_and_complete_records_are_kept(tmp_path: Path) -> None:
    out = tmp_path / "output"
    out.mkdir()
    (out / "records-000000000010.jsonl").write_bytes(line(10) + line(12) + b'{"index": 11, "te')
    shard = ShardFile(out, 10, 4)
    assert shard.present == {10, 12} and shard.kept == 2
    assert shard.append([(11, line(11)), (12, line(12, "again")), (99, line(99))]) == 1
    assert shard.append([(13, line(13))]) == 1
    shard.finish()
    assert indices(shard.path) == [10, 11, 12, 13]  # sorted: row groups ended out of order
    assert json.loads(shard.path.read_bytes().splitlines()[2])["text"] == "r12"  # first kept
    assert [p.name for p in out.iterdir()] == ["records-000000000010.jsonl"]


def test_an_earlier_attempts_records_are_copied_not_generated(tmp_path: Path) -> None:
    old, out = tmp_path / "attempt-1", tmp_path / "attempt-2"
    old.mkdir()
    out.mkdir()
    (old / "records-000000000000.jsonl").write_bytes(line(0) + line(1) + line(3) + b"junk\n")
    (out / "records-000000000000.jsonl").write_bytes(line(1, "mine"))
    shard = ShardFile(out, 0, 5)
    assert shard.adopt(scan_kept(old, 0, 5)) == 2  # 0 and 3; 1 is here already
    assert shard.present == {0, 1, 3}
    shard.append([(2, line(2)), (4, line(4))])
    shard.finish()
    assert indices(shard.path) == [0, 1, 2, 3, 4]
    assert (old / "records-000000000000.jsonl").read_bytes().count(b"\n") == 4  # untouched


def test_finish_drops_lines_that_are_not_records_of_the_shard(tmp_path: Path) -> None:
    (tmp_path / "records-000000000000.jsonl").write_bytes(line(0) + b"[1]\n" + line(7))
    shard = ShardFile(tmp_path, 0, 2)
    shard.append([(1, line(1))])
    shard.finish()
    assert shard.path.read_bytes() == line(0) + line(1)


def test_finish_refuses_a_shard_with_records_missing(tmp_path: Path) -> None:
    shard = ShardFile(tmp_path, 0, 3)
    shard.append([(0, line(0)), (2, line(2))])
    with pytest.raises(DDError, match="holds 2 usable records of 3"):
        shard.finish()


def test_a_sort_cut_off_earlier_is_cleaned_up(tmp_path: Path) -> None:
    (tmp_path / ".records-000000000000.jsonl.sorting").write_bytes(line(1))
    ShardFile(tmp_path, 0, 2)
    assert not list(tmp_path.glob(".*"))


def test_the_environment_keeps_data_designer_private_and_quiet(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    assert dd_environment({"HOME": str(home)}, "/tmp/x/home") == {
        "NEMO_TELEMETRY_ENABLED": "false", "DATA_DESIGNER_HOME": "/tmp/x/home"}
    assert not (home / ".data-designer").exists()
    assets = home / ".data-designer" / "managed-assets"
    assets.mkdir(parents=True)  # the user keeps person datasets there: still found
    assert dd_environment({"HOME": str(home)}, "/t")["DATA_DESIGNER_MANAGED_ASSETS_PATH"] \
        == str(assets)
    mine = {"HOME": str(home), "NEMO_TELEMETRY_ENABLED": "true", "DATA_DESIGNER_HOME": "/dd"}
    assert dd_environment(mine, "/tmp/x/home") == {}
    given = {"HOME": str(home), "DATA_DESIGNER_MANAGED_ASSETS_PATH": "/assets"}
    assert dd_environment(given, "/t") == {"NEMO_TELEMETRY_ENABLED": "false",
                                           "DATA_DESIGNER_HOME": "/t"}


def test_cl100k_counts_as_cached_only_where_tiktoken_would_read_it(tmp_path: Path,
                                                                     monkeypatch) -> None:
    key = hashlib.sha1(CL100K_URL.encode()).hexdigest()  # tiktoken's cache file name
    body = b"Y2wxMDBr 0\n"
    monkeypatch.setattr(data_designer, "CL100K_SHA256", hashlib.sha256(body).hexdigest())
    cache, other = tmp_path / "cache", tmp_path / "gym"
    cache.mkdir()
    other.mkdir()
    assert not cl100k_cached({"TIKTOKEN_CACHE_DIR": str(cache)})  # absent: tiktoken downloads
    (cache / key).write_bytes(body + b"torn")
    assert not cl100k_cached({"TIKTOKEN_CACHE_DIR": str(cache)})  # hash differs: it downloads
    (cache / key).write_bytes(body)
    assert cl100k_cached({"TIKTOKEN_CACHE_DIR": str(cache)})
    assert not cl100k_cached({"TIKTOKEN_CACHE_DIR": ""})  # the cache turned off
    assert not cl100k_cached({"DATA_GYM_CACHE_DIR": str(other)})
    (other / key).write_bytes(body)
    assert cl100k_cached({"DATA_GYM_CACHE_DIR": str(other)})
    both = {"TIKTOKEN_CACHE_DIR": str(tmp_path), "DATA_GYM_CACHE_DIR": str(other)}
    assert not cl100k_cached(both)  # TIKTOKEN_CACHE_DIR first
    monkeypatch.setattr(data_designer.tempfile, "gettempdir", lambda: str(tmp_path))
    assert not cl100k_cached({})
    (tmp_path / "data-gym-cache").mkdir()
    (tmp_path / "data-gym-cache" / key).write_bytes(body)
    assert cl100k_cached({})


def test_versions() -> None:
    problem, note = version_problem(None, "/env/bin/python")
    assert problem == ("data-designer is not installed for /env/bin/python; install it "
                       "there: /env/bin/python -m pip install 'data-designer==0.9.7' "
                       "(scripts/client-env dd builds such an environment)") and note is None
    assert version_problem("0.9.7", "p") == (None, None)
    assert version_problem("0.9.2", "p") == (None, None)
    old, _ = version_problem("0.8.1", "p")
    assert old is not None and "synthbatch needs 0.9.x" in old
    new_problem, new_note = version_problem("1.0.0rc1", "p")
    assert new_problem is None and new_note is not None and "newer than the 0.9.x" in new_note


def test_config_references_and_batch_files() -> None:
    assert split_dd_config("/x/build.py:builder") == ("/x/build.py", "builder")
    assert split_dd_config("/x/config.yaml") == ("/x/config.yaml", "")
    assert batch_number("/a/parquet-files/batch_00003.parquet") == 3
    assert batch_number("/a/other.parquet") is None


def test_rows_dropped_in_one_pass_are_generated_in_the_next(tmp_path: Path) -> None:
    out = tmp_path / "output"
    out.mkdir()
    shard = ShardFile(out, 100, 6)
    progress = Progress(tmp_path / "progress.json", 6, 0)
    asked = []

    def one_pass(todo: list, number: int) -> int:
        asked.append(list(todo))
        keep = [i for i in todo if number > 1 or i % 3]  # pass 1 drops 102 and 105
        return shard.append([(i, line(i)) for i in keep])

    fill(shard, progress, 3, one_pass)
    assert asked == [[100, 101, 102, 103, 104, 105], [102, 105]]
    shard.finish()
    assert indices(shard.path) == [100, 101, 102, 103, 104, 105]
    record = json.loads((tmp_path / "progress.json").read_text())
    assert (record["records_done"], record["failures"]) == (6, 2)


def test_a_pass_that_adds_nothing_ends_the_shard_keeping_the_rest(tmp_path: Path) -> None:
    shard = ShardFile(tmp_path, 0, 4)
    progress = Progress(None, 4, 0)
    calls = []

    def one_pass(todo: list, number: int) -> int:
        calls.append(number)
        return shard.append([(i, line(i)) for i in todo if i < 2])

    with pytest.raises(DDError, match=r"2 of 4 records are still missing after 2 Data "
                                      r"Designer pass\(es\).*the 2 written are kept"):
        fill(shard, progress, 5, one_pass)
    assert calls == [1, 2] and progress.failures == 4  # 2 dropped, then 2 again


def test_a_data_designer_error_ends_the_shard_in_one_line(tmp_path: Path) -> None:
    shard = ShardFile(tmp_path, 0, 2)
    shard.append([(0, line(0))])

    def one_pass(todo: list, number: int) -> int:
        raise RuntimeError("🛑 Error generating dataset:\n  model 'x' not found")

    with pytest.raises(DDError) as info:
        fill(shard, Progress(None, 2, 1), 3, one_pass)
    assert str(info.value) == ("Data Designer failed in pass 1: 🛑 Error generating "
                               "dataset: model 'x' not found; the 1 records written are kept")


def test_a_complete_shard_runs_no_pass(tmp_path: Path) -> None:
    shard = ShardFile(tmp_path, 0, 1)
    shard.append([(0, line(0))])
    fill(shard, Progress(None, 1, 1), 3, lambda todo, number: pytest.fail("no pass needed"))


def test_a_config_edited_after_submit_fails_the_shard_naming_both_digests(tmp_path: Path) -> None:
    import hashlib

    config = tmp_path / "dd.yaml"
    config.write_text("columns: []\n")
    pinned = hashlib.sha256(config.read_bytes()).hexdigest()
    spec = DataDesignerSpec(config=str(config), python="/p", config_sha256=pinned)
    assert changed_config(spec) is None
    assert changed_config(DataDesignerSpec(config=str(config), python="/p")) is None  # unpinned
    builder = DataDesignerSpec(config=f"{config}:build", python="/p", config_sha256=pinned)
    assert changed_config(builder) is None  # "<file>:<function>" pins the file
    config.write_text("columns: [x]\n")
    problem = changed_config(spec)
    assert problem is not None and problem.startswith(f"{config}: changed since the run was "
                                                      "submitted")
    assert pinned in problem
    config.unlink()
    assert "cannot be read" in (changed_config(spec) or "")


class _Analysis:
    def __init__(self, records: int) -> None:
        self.records = records

    def model_dump(self, mode: str) -> dict:
        assert mode == "json"
        return {"num_records": self.records, "column_statistics": []}


class _Results:
    def __init__(self, records: int) -> None:
        self.records = records

    def load_analysis(self) -> _Analysis:
        if self.records < 0:
            raise RuntimeError("no analysis")
        return _Analysis(self.records)


def test_each_pass_s_profile_is_kept_beside_the_records(tmp_path: Path, capsys) -> None:
    from synthbatch.agent_stdlib.candidate import DD_PROFILE
    from synthbatch.agent_stdlib.client.data_designer import keep_profile

    out = tmp_path / "output"
    out.mkdir()
    shard = ShardFile(out, 10, 4)
    keep_profile(shard, 1, 3, _Results(3))
    keep_profile(shard, 2, 1, _Results(1))
    keep_profile(shard, 3, 0, _Results(-1))  # an unreadable profile: reported, records kept
    [name] = [p.name for p in out.iterdir() if p.name.startswith(".dd")]
    assert name == ".dd-profile-000000000010.json" and DD_PROFILE.fullmatch(name)
    kept = json.loads((out / name).read_text())
    assert [(p["pass"], p["records"], p["profile"]["num_records"]) for p in kept["passes"]] \
        == [(1, 3, 3), (2, 1, 1)]
    assert "profile was not kept (records kept): no analysis" in \
        capsys.readouterr().err
