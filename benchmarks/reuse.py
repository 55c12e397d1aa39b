"""Lookup overhead of reusing an earlier run's cells (issue 31).

The built-in generator runs in this process (``client.generate.run_shard``, no Slurm,
no proxy) against the fake server in its own process, which costs ``--latency`` seconds
per request (``max_tokens`` 1 x ``--token-latency``) and logs every request it answers.
First a run of ``--records`` records with one LLM column; then a rerun of the same
recipe that takes every cell from the first (``Cells`` read from its record files, as
``generate --reuse`` does). Side by side in one run of this script:

- wall time of the rerun (reading the reused records included) over the first run's
  (goal: <= 0.05 at 100,000 records, the engine at 1 s per request);
- requests the fake server answered for each (the rerun: 0);
- file opens of the first run's record files and record lines read by the rerun
  (goal: each reused record read once: lines read == records, one open per file).

Usage: ``python benchmarks/reuse.py [--records N] [--latency S] [--shards K]``. The
first run is bounded by the engine: ``records x latency / concurrency`` (the generator's
adaptive limit) plus the generator's own per-request cost on this machine.
"""

from __future__ import annotations

import argparse
import builtins
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from synthbatch.agent_stdlib.client import reuse as reuse_module  # noqa: E402
from synthbatch.agent_stdlib.client.generate import Shard, add_reused, run_shard  # noqa: E402
from synthbatch.agent_stdlib.client.output import Output  # noqa: E402
from synthbatch.agent_stdlib.client.progress import Progress  # noqa: E402
from synthbatch.agent_stdlib.client.reuse import Cells  # noqa: E402
from synthbatch.agent_stdlib.contracts import ColumnSpec, Plan  # noqa: E402
from synthbatch.agent_stdlib.resume import KeptRecords  # noqa: E402
from tests.agent_runs import recipe_plan, run_folder  # noqa: E402

FAKE_SERVER = REPO / "fixtures" / "fake_openai_server.py"
GOAL = 0.05
COLUMNS = (ColumnSpec("topic", "category", {"values": ["tides", "moons", "stars"]}),
           ColumnSpec("text", "llm-text", {"model": "gen", "max_tokens": 1,
                                           "prompt": "Write about {topic}, #{index}."}))


class Counted(Cells):
    """Cells that count the record lines they read."""

    def __init__(self) -> None:
        super().__init__()
        self.lines = 0

    def _add_line(self, run_id: str, line: bytes, low: int, high: int) -> Optional[int]:
        self.lines += 1
        return super()._add_line(run_id, line, low, high)


def _server(workdir: Path, latency: float) -> subprocess.Popen:
    port_file = workdir / "engine.port"
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_SERVER), "--host", "127.0.0.1", "--port", "0",
         "--port-file", str(port_file), "--model", "fake-model", "--token-latency",
         str(latency), "--request-log", str(workdir / "requests.jsonl")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not port_file.exists():
        if proc.poll() is not None:
            raise SystemExit("benchmark: the fake server did not start")
        time.sleep(0.05)
    return proc


def _requests(workdir: Path) -> int:
    try:
        return len((workdir / "requests.jsonl").read_bytes().splitlines())
    except OSError:
        return 0


def _shards(plan: Plan, url: str, folder: Path, records: int, shards: int,
            first_run: Optional[Path], whole: bool = True) -> Dict[str, Any]:
    """Produce ``records`` in ``shards`` shards one after another into a run directory's
    layout at ``folder`` (reusing ``first_run``'s records when given, as ``generate
    --reuse`` reads them: records taken whole unless ``whole`` is False); wall time, and
    the reuse reader's counts."""
    layout, specs = run_folder(plan, folder, records, shards)
    opened: List[str] = []
    real_open = builtins.open

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    reuse_module.open = counting_open  # type: ignore[attr-defined]  # the reader's opens only
    lines = reused = copied = 0
    started = time.monotonic()
    try:
        for spec in specs:
            first, count = spec.record_offset, spec.num_records
            out = layout.attempt(spec.index, 1).output
            out.mkdir(parents=True)
            cells = None
            if first_run is not None:
                cells = Counted()
                add_reused(cells, "first", first_run, first, count, plan if whole else None)
            run_shard(plan, {"gen": url}, Shard(first, count, Output(out, first),
                                                 Progress(None, count), KeptRecords()),
                      reuse=cells)
            if cells is not None:
                lines, reused = lines + cells.lines, reused + cells.reused
                copied += cells.copied
    finally:
        del reuse_module.open  # type: ignore[attr-defined]
    return {"wall_s": time.monotonic() - started, "opens": len(opened), "lines": lines,
            "reused": reused, "copied": copied}


def main(argv: Optional[List[str]] = None) -> int:
    """Run the first run and the rerun; print the ratio against the goal."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per request")
    parser.add_argument("--shards", type=int, default=4,
                        help="shards of the first run (the rerun: one more)")
    args = parser.parse_args(argv)
    plan = recipe_plan(COLUMNS, records=args.records, gen_queue=1024, max_retries=5,
                       request_timeout_s=120.0)
    with tempfile.TemporaryDirectory(prefix="bench-reuse-") as tmp:
        workdir = Path(tmp)
        server = _server(workdir, args.latency)
        try:
            url = f"http://127.0.0.1:{int((workdir / 'engine.port').read_text())}"
            first = _shards(plan, url, workdir / "first", args.records, args.shards, None)
            sent_first = _requests(workdir)
            again = _shards(plan, url, workdir / "again", args.records, args.shards + 1,
                            workdir / "first")
            sent_again = _requests(workdir) - sent_first
            cells = _shards(plan, url, workdir / "cells", args.records, args.shards + 1,
                            workdir / "first", whole=False)
            sent_cells = _requests(workdir) - sent_first - sent_again
        finally:
            server.terminate()
            server.wait(timeout=10)
    files = args.shards  # one record file per shard of the first run
    ratio = again["wall_s"] / first["wall_s"]
    ratio_cells = cells["wall_s"] / first["wall_s"]
    print(f"reuse: {args.records:,} records, fake engine at {args.latency:g} s per request, "
          f"first run {args.shards} shards, rerun {args.shards + 1}")
    print(f"first run: {first['wall_s']:.1f} s, {sent_first:,} requests "
          f"({args.records / first['wall_s']:.0f} records/s)")
    for name, rerun, sent in (("records taken whole", again, sent_again),
                              ("per-cell path only", cells, sent_cells)):
        print(f"rerun, {name}: {rerun['wall_s']:.2f} s "
              f"({rerun['wall_s'] / args.records * 1e3:.3f} ms a record), {sent:,} requests, "
              f"{rerun['reused']:,} cells reused, {rerun['copied']:,} records taken whole")
    print(f"rerun reads: {again['lines']:,} record lines for {args.records:,} records, "
          f"{again['opens']} opens of {files} record files over {args.shards + 1} shards")
    print(json.dumps({"ratio": round(ratio, 4), "ratio_per_cell": round(ratio_cells, 4),
                      "goal": GOAL, "requests_first": sent_first,
                      "requests_rerun": sent_again + sent_cells, "lines_read": again["lines"],
                      "opens": again["opens"], "records_whole": again["copied"]}))
    verdict = "ok" if ratio <= GOAL and sent_again == 0 else "MISS"
    print(f"rerun / first run wall time ratio {ratio:.4f} (goal <= {GOAL}) {verdict}; "
          f"the per-cell path {ratio_cells:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
