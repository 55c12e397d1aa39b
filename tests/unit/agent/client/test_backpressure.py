"""The ``generate`` role as a process, through the client contract only: a 429 from a busy
engine slows the client down and never spends a record's retry.

Kept free of the generator's own modules so that the same test runs against any agent
(the issue's regression: the old client counted a 429 as a failed attempt).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fixtures.fake_openai_server import serve_in_thread
from tests.agent_runs import local_plan
from tests.conftest import REPO

NEW_FIELDS = ("columns", "on_error", "seed", "seed_data")  # absent from older plans


def test_the_generate_role_spends_no_retry_on_backpressure(tmp_path: Path) -> None:
    """The engine runs 4 requests at once and answers 429 to any that would wait; the
    client keeps 12 in flight and has no retry to spend (max_retries = 0)."""
    plan = local_plan(sys.executable, ["true"], records=24).to_dict()
    for key in NEW_FIELDS:
        plan["client"].pop(key, None)
    plan["client"].update(concurrency=12, max_retries=0)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    output = tmp_path / "output"
    output.mkdir()
    with serve_in_thread(model="fake-model", max_concurrency=4, reject_when_waiting=0,
                         token_latency=0.01) as server:
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO),
               "SYNTHBATCH_ENDPOINTS": json.dumps({"tiny": server.url}),
               "SYNTHBATCH_RECORD_OFFSET": "0", "SYNTHBATCH_NUM_RECORDS": "24",
               "SYNTHBATCH_OUTPUT_DIR": str(output)}
        done = subprocess.run([sys.executable, "-m", "synthbatch.agent_stdlib",
                               "generate", "--plan",
                               str(tmp_path / "plan.json")], env=env, capture_output=True,
                              text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-500:]
    records = [json.loads(line) for line in
               (output / "records-000000000000.jsonl").read_text().splitlines()]
    assert [r["index"] for r in records] == list(range(24))
