"""Resume across attempts: scanning an earlier attempt's kept output, and generate using it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, List

import pytest

from agent_stdlib.candidate import CandidateError, build_manifest, count_records
from agent_stdlib.client.generate import Progress, Target, generate, kept_records
from agent_stdlib.contracts import AttemptRecord, GenerateSpec
from agent_stdlib.resume import KeptRecords, covered, record_index, scan_kept
from fixtures.fake_openai_server import serve_in_thread
from tests.conftest import REPO


def line(index: int, **extra: object) -> str:
    return json.dumps({"index": index, "completion": f"c{index}", **extra}, sort_keys=True)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


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
    assert covered(out, 10, 5) == [10, 11, 12]
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
    from agent_stdlib.resume import completion_tokens

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
    assert covered(out, 0, 3) == [2]


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


# ----------------------------------------------------------------------------- generate


def spec(concurrency: int = 2) -> GenerateSpec:
    return GenerateSpec(model="tiny", prompt_template="Item {index}.", system_prompt=None,
                        max_tokens=4, temperature=0.0, concurrency=concurrency, max_retries=0,
                        request_timeout_s=10.0)


@pytest.fixture
def server(tmp_path: Path):
    log = tmp_path / "requests.log"
    running = serve_in_thread(model="fake-model", request_log=str(log))
    yield running, log
    running.stop()


def requested(log: Path) -> List[int]:
    prompts = [json.loads(x)["prompt"] for x in log.read_text().splitlines()] \
        if log.exists() else []
    return sorted(int(str(p).split("Item ")[1].split(".")[0]) for p in prompts)


def test_generate_copies_kept_records_and_requests_only_the_rest(tmp_path: Path,
                                                                 server) -> None:
    running, log = server
    previous = tmp_path / "attempt-0001" / "output"
    # attempt 1 finished 20, 21, 22 and 24 (a gap at 23) and was torn writing 25
    write(previous / "records-000000000020.jsonl",
          "".join(line(i) + "\n" for i in (20, 21, 22, 24)) + line(25)[:10])
    before = (previous / "records-000000000020.jsonl").read_bytes()
    out_file = tmp_path / "attempt-0002" / "output" / "records-000000000020.jsonl"
    out_file.parent.mkdir(parents=True)
    kept = kept_records(str(previous), out_file.parent, 20, 8)
    progress = Progress(tmp_path / "progress.json", 8)
    done = generate(spec(), Target(running.url, "fake-model"), 20, 8, out_file, progress,
                    kept=kept)
    assert done == 8 and progress.done == 8
    assert requested(log) == [23, 25, 26, 27]
    records = [json.loads(x) for x in out_file.read_text().splitlines()]
    assert [r["index"] for r in records] == list(range(20, 28))
    lines = out_file.read_text().splitlines(keepends=True)
    assert lines[0] == line(20) + "\n"  # copied byte for byte
    assert (previous / "records-000000000020.jsonl").read_bytes() == before  # untouched
    assert build_manifest(out_file.parent, 0, 2, 8).records == 8


def test_generate_requeued_after_resume_keeps_its_own_prefix(tmp_path: Path, server) -> None:
    running, log = server
    previous = tmp_path / "prev"
    write(previous / "r.jsonl", "".join(line(i) + "\n" for i in range(0, 6)))
    out_file = tmp_path / "out" / "records.jsonl"
    write(out_file, "".join(line(i) + "\n" for i in range(0, 3)))  # this attempt's 1st run
    kept = scan_kept(previous, 0, 8)
    assert generate(spec(), Target(running.url, "fake-model"), 0, 8, out_file,
                    Progress(None, 8), kept=kept) == 8
    assert requested(log) == [6, 7]
    assert [json.loads(x)["index"] for x in out_file.read_text().splitlines()] == \
        list(range(8))


def test_generate_stopped_while_resuming_keeps_a_contiguous_prefix(tmp_path: Path,
                                                                   server) -> None:
    running, _ = server
    previous = tmp_path / "prev"
    write(previous / "r.jsonl", "".join(line(i) + "\n" for i in range(0, 4)))
    out_file = tmp_path / "out" / "records.jsonl"
    out_file.parent.mkdir()
    stop = threading.Event()
    stop.set()
    done = generate(spec(), Target(running.url, "fake-model"), 0, 10, out_file,
                    Progress(None, 10), stop=stop, kept=scan_kept(previous, 0, 10))
    indices = [json.loads(x)["index"] for x in out_file.read_text().splitlines()]
    assert indices == list(range(done)) and done >= 4


def test_kept_records_ignores_unset_and_own_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write(out / "a.jsonl", line(0) + "\n")
    assert len(kept_records(None, out, 0, 1)) == 0
    assert len(kept_records("", out, 0, 1)) == 0
    assert len(kept_records(str(out), out, 0, 1)) == 0
    assert isinstance(kept_records(str(out.parent / "none"), out, 0, 1), KeptRecords)


def test_generate_main_reads_synthbatch_resume_dir(tmp_path: Path, server) -> None:
    """The client contract end to end: the ``generate`` role as a process, env only."""
    from tests.agent_runs import local_plan

    running, log = server
    plan = local_plan(sys.executable, ["true"], records=6)
    plan_json = tmp_path / "plan.json"
    plan_json.write_text(plan.to_json())
    previous = tmp_path / "attempt-0001" / "output"
    write(previous / "records-000000000000.jsonl",
          "".join(line(i, prompt=f"Tell me about {i}.") + "\n" for i in range(4)))
    output = tmp_path / "attempt-0002" / "output"
    output.mkdir(parents=True)
    env: Dict[str, str] = {
        "PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO),
        "SYNTHBATCH_ENDPOINTS": json.dumps({"tiny": running.url}),
        "SYNTHBATCH_RECORD_OFFSET": "0", "SYNTHBATCH_NUM_RECORDS": "6",
        "SYNTHBATCH_OUTPUT_DIR": str(output),
        "SYNTHBATCH_PROGRESS_FILE": str(tmp_path / "progress.json"),
        "SYNTHBATCH_RESUME_DIR": str(previous),
    }
    done = subprocess.run([sys.executable, "-m", "agent_stdlib", "generate", "--plan",
                           str(plan_json)], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "4 of 6 records kept there" in done.stderr
    prompts = [json.loads(x)["prompt"] for x in log.read_text().splitlines()]
    assert sorted(prompts) == ["Tell me about 4.", "Tell me about 5."]
    records = (output / "records-000000000000.jsonl").read_text().splitlines()
    assert [json.loads(x)["index"] for x in records] == list(range(6))


# ----------------------------------------------------------------------------- tokens


class StopAfter(Progress):
    """Progress that sets ``stop`` once ``after`` records were generated (a SIGUSR1)."""

    def __init__(self, path: Path, total: int, stop: threading.Event, after: int) -> None:
        super().__init__(path, total)
        self.stop, self.after = stop, after

    def add(self, record: Dict[str, object]) -> None:
        super().add(record)
        if self.done >= self.after:
            self.stop.set()


def file_tokens(path: Path) -> int:
    """The completion tokens of every record in ``path``."""
    return sum(json.loads(x)["usage"]["completion_tokens"]
               for x in path.read_text().splitlines())


@pytest.fixture
def slow_server():
    """0.2 s per record (4 tokens): a record submitted after the stop is never ready
    within the 0.1 s generate waits once stopped, so a stopped run really stops early."""
    running = serve_in_thread(model="fake-model", token_latency=0.05)
    yield running
    running.stop()


def stopped_run(running, out_file: Path, progress_json: Path, count: int) -> int:
    """Generate ``count`` records into ``out_file`` but stop after 3; the records kept."""
    stop = threading.Event()
    done = generate(spec(), Target(running.url, "fake-model"), 0, count, out_file,
                    StopAfter(progress_json, count, stop, after=3), stop=stop)
    assert 3 <= done < count
    return done


def test_tokens_after_a_requeue_count_the_records_kept_in_the_file(tmp_path: Path, server,
                                                                   slow_server) -> None:
    running, _ = server
    out_file = tmp_path / "output" / "records-000000000000.jsonl"
    out_file.parent.mkdir()
    kept = stopped_run(slow_server, out_file, tmp_path / "progress.json", 12)
    progress = Progress(tmp_path / "progress.json", 12)  # the next execution
    assert generate(spec(), Target(running.url, "fake-model"), 0, 12, out_file,
                    progress) == 12
    assert file_tokens(out_file) == 12 * 4  # max_tokens 4 per record
    assert progress.tokens == 48  # was 4 * (12 - kept): the kept records' tokens were lost
    written = json.loads((tmp_path / "progress.json").read_text())
    assert written["tokens"] == 48 and written["records_done"] == 12 and kept > 0


def test_tokens_after_a_resume_count_the_records_copied_from_an_earlier_attempt(
        tmp_path: Path, server, slow_server) -> None:
    running, _ = server
    first = tmp_path / "attempt-0001" / "output" / "records-000000000000.jsonl"
    first.parent.mkdir(parents=True)
    kept = stopped_run(slow_server, first, tmp_path / "progress-1.json", 12)
    out_file = tmp_path / "attempt-0002" / "output" / "records-000000000000.jsonl"
    out_file.parent.mkdir(parents=True)
    progress = Progress(tmp_path / "progress.json", 12)
    assert generate(spec(), Target(running.url, "fake-model"), 0, 12, out_file, progress,
                    kept=kept_records(str(first.parent), out_file.parent, 0, 12)) == 12
    assert progress.tokens == file_tokens(out_file) == 48  # was 4 * (12 - kept)
    assert json.loads((tmp_path / "progress.json").read_text())["tokens"] == 48 and kept > 0


def test_kept_records_without_usage_count_no_tokens(tmp_path: Path, server) -> None:
    running, _ = server
    previous = tmp_path / "prev"
    write(previous / "r.jsonl", line(0) + "\n" + line(1, usage={"completion_tokens": "x"})
          + "\n" + line(2, usage={"completion_tokens": 5}) + "\n")
    out_file = tmp_path / "out" / "records.jsonl"
    write(out_file, line(0, usage={"completion_tokens": 7}) + "\n")
    progress = Progress(None, 4)
    assert generate(spec(), Target(running.url, "fake-model"), 0, 4, out_file, progress,
                    kept=scan_kept(previous, 0, 4)) == 4
    assert progress.tokens == 7 + 0 + 5 + 4  # own line, malformed, kept, generated


def test_records_carry_the_alias_and_the_served_model(tmp_path: Path, server) -> None:
    running, log = server
    out_file = tmp_path / "records.jsonl"
    generate(spec(), Target(running.url, "fake-model"), 0, 2, out_file, Progress(None, 2))
    records = [json.loads(x) for x in out_file.read_text().splitlines()]
    assert [(r["model"], r["served_model"]) for r in records] == [("tiny", "fake-model")] * 2
    assert {json.loads(x)["model"] for x in log.read_text().splitlines()} == {"fake-model"}
