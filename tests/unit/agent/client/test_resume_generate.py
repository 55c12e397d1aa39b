"""The generator resuming: an earlier execution's own output, an earlier attempt's kept
records (``SYNTHBATCH_RESUME_DIR``), and the tokens counted across both (the prompt-template
form; moved here from test_resume.py with the generator's new entry point)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from fixtures.fake_openai_server import serve_in_thread
from synthbatch.agent_stdlib.candidate import build_manifest
from synthbatch.agent_stdlib.client.generate import Shard, kept_records, run_shard
from synthbatch.agent_stdlib.client.output import Output
from synthbatch.agent_stdlib.client.progress import Progress
from synthbatch.agent_stdlib.contracts import GenerateSpec, Plan
from synthbatch.agent_stdlib.resume import KeptRecords, scan_kept
from tests.agent_runs import kept_line as line
from tests.agent_runs import local_plan
from tests.agent_runs import write_text as write
from tests.conftest import REPO


def plan(concurrency: int = 2) -> Plan:
    return replace(local_plan(sys.executable, ["true"]), client=GenerateSpec(
        model="tiny", prompt_template="Item {index}.", system_prompt=None, max_tokens=4,
        temperature=0.0, concurrency=concurrency, max_retries=0, request_timeout_s=10.0))


def generate(url: str, offset: int, count: int, folder: Path,
             progress: Optional[Progress] = None, stop: Optional[threading.Event] = None,
             kept: Optional[KeptRecords] = None) -> int:
    """One shard of the prompt-template plan into ``folder``; the records it holds."""
    folder.mkdir(parents=True, exist_ok=True)
    shard = Shard(offset, count, Output(folder, offset), progress or Progress(None, count),
                  kept if kept is not None else KeptRecords())
    return run_shard(plan(), {"tiny": url}, shard, stop)


def out_file(folder: Path, offset: int = 0) -> Path:
    return folder / f"records-{offset:012d}.jsonl"


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
    output = tmp_path / "attempt-0002" / "output"
    output.mkdir(parents=True)
    kept = kept_records(str(previous), output, 20, 8)
    progress = Progress(tmp_path / "progress.json", 8)
    done = generate(running.url, 20, 8, output, progress, kept=kept)
    assert done == 8 and progress.done == 8
    assert requested(log) == [23, 25, 26, 27]
    records = [json.loads(x) for x in out_file(output, 20).read_text().splitlines()]
    assert [r["index"] for r in records] == list(range(20, 28))
    lines = out_file(output, 20).read_text().splitlines(keepends=True)
    assert lines[0] == line(20) + "\n"  # copied byte for byte
    assert (previous / "records-000000000020.jsonl").read_bytes() == before  # untouched
    assert build_manifest(output, 0, 2, 8).records == 8


def test_generate_requeued_after_resume_keeps_its_own_prefix(tmp_path: Path, server) -> None:
    running, log = server
    previous = tmp_path / "prev"
    write(previous / "r.jsonl", "".join(line(i) + "\n" for i in range(0, 6)))
    output = tmp_path / "out"
    write(out_file(output), "".join(line(i) + "\n" for i in range(0, 3)))  # its 1st run
    kept = scan_kept(previous, 0, 8)
    assert generate(running.url, 0, 8, output, kept=kept) == 8
    assert requested(log) == [6, 7]
    assert [json.loads(x)["index"] for x in out_file(output).read_text().splitlines()] == \
        list(range(8))


def test_generate_stopped_while_resuming_keeps_a_contiguous_prefix(tmp_path: Path,
                                                                   server) -> None:
    running, _ = server
    previous = tmp_path / "prev"
    write(previous / "r.jsonl", "".join(line(i) + "\n" for i in range(0, 4)))
    output = tmp_path / "out"
    stop = threading.Event()
    stop.set()
    done = generate(running.url, 0, 10, output, stop=stop, kept=scan_kept(previous, 0, 10))
    indices = [json.loads(x)["index"] for x in out_file(output).read_text().splitlines()]
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
    running, log = server
    plan_json = tmp_path / "plan.json"
    plan_json.write_text(local_plan(sys.executable, ["true"], records=6).to_json())
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
    done = subprocess.run([sys.executable, "-m", "synthbatch.agent_stdlib", "generate", "--plan",
                           str(plan_json)], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "4 of 6 records kept there" in done.stderr
    prompts = [json.loads(x)["prompt"] for x in log.read_text().splitlines()]
    assert sorted(prompts) == ["Tell me about 4.", "Tell me about 5."]
    records = out_file(output).read_text().splitlines()
    assert [json.loads(x)["index"] for x in records] == list(range(6))


# ----------------------------------------------------------------------------- tokens


class StopAfter(Progress):
    """Progress that sets ``stop`` once ``after`` records were generated (a SIGUSR1)."""

    def __init__(self, path: Path, total: int, stop: threading.Event, after: int) -> None:
        super().__init__(path, total)
        self.stop, self.after = stop, after

    def settled(self, tokens: int = 0, dropped: bool = False, count: int = 1) -> None:
        super().settled(tokens, dropped, count)
        if self.done >= self.after:
            self.stop.set()


def file_tokens(path: Path) -> int:
    """The completion tokens of every record in ``path``."""
    return sum(json.loads(x)["usage"]["completion_tokens"]
               for x in path.read_text().splitlines())


@pytest.fixture
def slow_server():
    """0.2 s per record (4 tokens): a record submitted after the stop is never ready
    before generate looks at the stop, so a stopped run really stops early."""
    running = serve_in_thread(model="fake-model", token_latency=0.05)
    yield running
    running.stop()


def stopped_run(running, output: Path, progress_json: Path, count: int) -> int:
    """Generate ``count`` records into ``output`` but stop after 3; the records kept."""
    stop = threading.Event()
    done = generate(running.url, 0, count, output,
                    StopAfter(progress_json, count, stop, after=3), stop=stop)
    assert 3 <= done < count
    return done


def test_tokens_after_a_requeue_count_the_records_kept_in_the_file(tmp_path: Path, server,
                                                                   slow_server) -> None:
    running, _ = server
    output = tmp_path / "output"
    kept = stopped_run(slow_server, output, tmp_path / "progress.json", 12)
    progress = Progress(tmp_path / "progress.json", 12)  # the next execution
    assert generate(running.url, 0, 12, output, progress) == 12
    assert file_tokens(out_file(output)) == 12 * 4  # max_tokens 4 per record
    assert progress.tokens == 48  # was 4 * (12 - kept): the kept records' tokens were lost
    written = json.loads((tmp_path / "progress.json").read_text())
    assert written["tokens"] == 48 and written["records_done"] == 12 and kept > 0


def test_tokens_after_a_resume_count_the_records_copied_from_an_earlier_attempt(
        tmp_path: Path, server, slow_server) -> None:
    running, _ = server
    first = tmp_path / "attempt-0001" / "output"
    kept = stopped_run(slow_server, first, tmp_path / "progress-1.json", 12)
    output = tmp_path / "attempt-0002" / "output"
    output.mkdir(parents=True)
    progress = Progress(tmp_path / "progress.json", 12)
    assert generate(running.url, 0, 12, output, progress,
                    kept=kept_records(str(first), output, 0, 12)) == 12
    assert progress.tokens == file_tokens(out_file(output)) == 48  # was 4 * (12 - kept)
    assert json.loads((tmp_path / "progress.json").read_text())["tokens"] == 48 and kept > 0


def test_kept_records_without_usage_count_no_tokens(tmp_path: Path, server) -> None:
    running, _ = server
    previous = tmp_path / "prev"
    write(previous / "r.jsonl", line(0) + "\n" + line(1, usage={"completion_tokens": "x"})
          + "\n" + line(2, usage={"completion_tokens": 5}) + "\n")
    output = tmp_path / "out"
    write(out_file(output), line(0, usage={"completion_tokens": 7}) + "\n")
    progress = Progress(None, 4)
    assert generate(running.url, 0, 4, output, progress,
                    kept=scan_kept(previous, 0, 4)) == 4
    assert progress.tokens == 7 + 0 + 5 + 4  # own line, malformed, kept, generated


def test_records_carry_the_alias_and_the_served_model(tmp_path: Path, server) -> None:
    running, log = server
    generate(running.url, 0, 2, tmp_path / "out")
    records = [json.loads(x) for x in out_file(tmp_path / "out").read_text().splitlines()]
    assert [(r["model"], r["served_model"]) for r in records] == [("tiny", "fake-model")] * 2
    assert {json.loads(x)["model"] for x in log.read_text().splitlines()} == {"fake-model"}
    assert set(records[0]) == {"index", "prompt", "completion", "finish_reason", "model",
                               "served_model", "usage", "latency_ms"}  # the form's shape
    assert all(isinstance(r["latency_ms"], float) for r in records)  # for benchmark analyze
