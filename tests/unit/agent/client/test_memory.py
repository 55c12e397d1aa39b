"""Bounded memory: the generator streams a shard, it never holds it.

200,000 records against an instant fake server (a separate process) with the default
adaptive concurrency; the generator's resident set is sampled from /proc while it runs.
A per-record leak of even 50 bytes would add ~10 MB between the first sample taken after
a fifth of the shard and the end. Marked slow: ~2.5 minutes on two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from synthbatch.agent_stdlib.contracts import ColumnSpec, SeedDataSpec
from tests.agent_runs import recipe_plan
from tests.conftest import FAKE_SERVER, REPO

RECORDS = 200_000
pytestmark = pytest.mark.slow


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_rss_of_a_200000_record_shard_stays_flat(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    server = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--port", "0", "--port-file",
                               str(port_file), "--model", "fake-model"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port_file.read_text().strip()}"
        seeds = tmp_path / "seeds.csv"
        seeds.write_text("topic\n" + "".join(f"t{i}\n" for i in range(1000)))
        columns = (ColumnSpec("n", "integer", {"low": 0, "high": 9}),
                   ColumnSpec("text", "llm-text", {"model": "gen", "max_tokens": 2,
                                                   "prompt": "{topic} {n} #{index}"}))
        plan = recipe_plan(columns, records=RECORDS,
                           seed_data=SeedDataSpec(str(seeds), "shuffle", ("topic",)))
        (tmp_path / "plan.json").write_text(plan.to_json())
        out = tmp_path / "out"
        out.mkdir()
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO),
               "SYNTHBATCH_ENDPOINTS": json.dumps({"gen": url}),
               "SYNTHBATCH_RECORD_OFFSET": "0", "SYNTHBATCH_NUM_RECORDS": str(RECORDS),
               "SYNTHBATCH_OUTPUT_DIR": str(out),
               "SYNTHBATCH_PROGRESS_FILE": str(tmp_path / "progress.json")}
        proc = subprocess.Popen([sys.executable, "-m", "synthbatch.agent_stdlib",
                                 "generate", "--plan",
                                 str(tmp_path / "plan.json")], env=env,
                                stderr=subprocess.DEVNULL)
        samples: List[tuple] = []  # (records done, rss kB)
        while proc.poll() is None:
            try:
                done = json.loads((tmp_path / "progress.json").read_text())["records_done"]
                samples.append((done, rss_kb(proc.pid)))
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.5)
        assert proc.returncode == 0
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert (out / "records-000000000000.jsonl").read_bytes().count(b"\n") == RECORDS
    after_warmup = [rss for done, rss in samples if done >= RECORDS // 5 and rss]
    assert len(after_warmup) >= 10, samples
    growth_mb = (max(after_warmup) - after_warmup[0]) / 1024
    assert growth_mb < 5, (growth_mb, after_warmup[0] / 1024, samples[::10])
