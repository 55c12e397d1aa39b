"""Records of a reused run taken whole (issue 31's fast path, ``client.wholereuse``): the
same bytes as the per-cell path, and every case it cannot prove goes the per-cell way.
On the fake server, which logs every request it answers."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest

from fixtures.fake_openai_server import serve_in_thread
from synthbatch.agent_stdlib.client.generate import Shard, reused_cells, run_shard
from synthbatch.agent_stdlib.client.output import Output
from synthbatch.agent_stdlib.client.progress import Progress
from synthbatch.agent_stdlib.client.reuse import Cells
from synthbatch.agent_stdlib.client.wholereuse import (
    UNKNOWN,
    inputs_path,
    read_tag,
    same_recipe,
    seed_tag,
    write_inputs,
)
from synthbatch.agent_stdlib.contracts import ColumnSpec, Plan, SeedDataSpec
from synthbatch.agent_stdlib.resume import KeptRecords
from tests.agent_runs import recipe_plan, run_folder

RECORDS = 24
COLUMNS = (
    ColumnSpec("topic", "category", {"values": ["tides", "moons", "stars"]}),
    ColumnSpec("n", "uniform", {"low": 1, "high": 9, "skip_when": "index % 3 == 0"}),
    ColumnSpec("hidden", "category", {"values": ["x", "y"]}, drop=True),
    ColumnSpec("a", "llm-text", {"model": "gen", "max_tokens": 4,
                                 "prompt": "Ask {name} about {topic} {hidden}."}),
    ColumnSpec("label", "expression", {"template": "{topic}-{n}"}),
    ColumnSpec("b", "llm-text", {"model": "judge", "prompt": "Judge {a}.", "max_tokens": 4}),
)


def seed_file(folder: Path, names: Sequence[str]) -> SeedDataSpec:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "people.jsonl"
    path.write_text("".join(json.dumps({"name": n, "age": i}) + "\n"
                            for i, n in enumerate(names)))
    return SeedDataSpec(str(path), order="shuffle", fields=("name",))


def plan_of(tmp: Path, columns: Sequence[ColumnSpec] = COLUMNS,
            names: Sequence[str] = ("ann", "bob", "cy", "dee", "eve")) -> Plan:
    return recipe_plan(tuple(columns), records=RECORDS, on_error="keep",
                       seed_data=seed_file(tmp, names))


def run(plan: Plan, url: str, folder: Path, shards: int, reuse: Optional[Cells] = None,
        only: Optional[int] = None) -> None:
    """The records in ``shards`` shards, in a run directory's layout at ``folder``
    (``only``: the first ``only`` shards, a run not finished)."""
    layout, specs = run_folder(plan, folder, RECORDS, shards)
    for spec in specs[:only]:
        first, count = spec.record_offset, spec.num_records
        out = layout.attempt(spec.index, 1).output
        out.mkdir(parents=True)
        run_shard(plan, {"gen": url, "judge": url},
                  Shard(first, count, Output(out, first),
                        Progress(folder / f"progress-{first}.json", count), KeptRecords()),
                  reuse=reuse)


def files(folder: Path) -> List[Path]:
    return sorted(folder.glob("shards/*/attempts/*/output/records-*.jsonl"))


def cells_of(folder: Path, plan: Optional[Plan]) -> Cells:
    """As ``generate --reuse run-1=FOLDER`` reads them (``plan``: this run's, records
    taken whole where proven; None: the per-cell path only)."""
    cells = reused_cells([f"run-1={folder}"], 0, RECORDS, plan)
    assert cells is not None
    return cells


def output(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in files(folder))


def requests(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def both_paths(tmp: Path, first_plan: Plan, again_plan: Plan,
               damage: Any = None, only: Optional[int] = None
               ) -> Tuple[Cells, Cells, int, int, Path]:
    """The first run, then the rerun twice (records taken whole allowed, and not): the
    cells of each, the requests of each rerun, and the folder."""
    log = tmp / "requests.log"
    with serve_in_thread(model="fake-model", request_log=str(log)) as server:
        run(first_plan, server.url, tmp / "one", 4, only=only)
        if damage is not None:
            damage(tmp / "one")
        sent = requests(log)
        fast = cells_of(tmp / "one", again_plan)
        run(again_plan, server.url, tmp / "fast", 5, fast)
        fast_sent = requests(log) - sent
        slow = cells_of(tmp / "one", None)
        run(again_plan, server.url, tmp / "slow", 5, slow)
        slow_sent = requests(log) - sent - fast_sent
    return fast, slow, fast_sent, slow_sent, tmp


def without_latency(data: bytes) -> List[Dict[str, Any]]:
    """Records with the generated cells' timing left out (it differs between runs)."""
    rows = [json.loads(line) for line in data.splitlines()]
    for row in rows:
        for cell in row["_meta"]["columns"].values():
            cell.pop("latency_ms", None)
    return rows


def test_records_taken_whole_are_the_bytes_the_per_cell_path_writes(tmp_path: Path) -> None:
    plan = plan_of(tmp_path)
    fast, slow, fast_sent, slow_sent, _ = both_paths(tmp_path, plan, plan)
    assert (fast_sent, slow_sent) == (0, 0)
    assert fast.copied == RECORDS and slow.copied == 0
    assert output(tmp_path / "fast") == output(tmp_path / "slow")
    assert fast.reused == slow.reused == 2 * RECORDS
    rows = [json.loads(line) for line in output(tmp_path / "fast").splitlines()]
    assert [r["index"] for r in rows] == list(range(RECORDS))
    assert all(m["reused_from"] == "run-1" for r in rows for m in r["_meta"]["columns"].values())
    assert [r["n"] is None for r in rows[:4]] == [True, False, False, True]
    for name in ("fast", "slow"):
        progress = [json.loads(p.read_text()) for p in (tmp_path / name).glob("progress-*.json")]
        assert sum(p["records_reused"] for p in progress) == RECORDS
        assert sum(p["cells_reused"] for p in progress) == 2 * RECORDS
        assert sum(p["cells_generated"] for p in progress) == 0


def test_a_changed_seed_file_is_never_taken_whole(tmp_path: Path) -> None:
    """The same rows count and layout, one name changed: the per-cell digests decide."""
    def change(_: Path) -> None:
        seed_file(tmp_path, ("ann", "bob", "cy", "dee", "EVE"))
    plan = plan_of(tmp_path)
    fast, slow, fast_sent, slow_sent, _ = both_paths(tmp_path, plan, plan, change)
    assert fast.copied == 0
    assert fast_sent == slow_sent > 0  # the records of "EVE" are asked again
    assert fast.reused == slow.reused
    assert without_latency(output(tmp_path / "fast")) == \
        without_latency(output(tmp_path / "slow"))


def test_a_changed_model_identity_is_never_taken_whole(tmp_path: Path) -> None:
    plan = plan_of(tmp_path)
    other = dataclasses.replace(plan, deployments=tuple(
        dataclasses.replace(d, command=("true", "--seed", "2")) if d.alias == "judge" else d
        for d in plan.deployments))
    fast, _, fast_sent, slow_sent, _ = both_paths(tmp_path, plan, other)
    assert fast.copied == 0
    assert fast_sent == slow_sent == RECORDS  # column b of every record, a reused
    assert fast.reused == RECORDS


def test_one_changed_column_is_never_taken_whole(tmp_path: Path) -> None:
    changed = list(COLUMNS)
    changed[4] = ColumnSpec("label", "expression", {"template": "{topic}/{n}"})
    fast, _, fast_sent, _, _ = both_paths(tmp_path, plan_of(tmp_path),
                                         plan_of(tmp_path, changed))
    assert fast.copied == 0 and fast_sent == 0  # every LLM cell reused, no record whole
    rows = [json.loads(line) for line in output(tmp_path / "fast").splitlines()]
    assert all("/" in r["label"] for r in rows)


def test_a_partly_finished_reused_run_gives_what_it_has(tmp_path: Path) -> None:
    plan = plan_of(tmp_path)
    fast, slow, fast_sent, slow_sent, _ = both_paths(tmp_path, plan, plan, only=3)
    assert fast.copied == 18 and slow.copied == 0  # shards of 6: 3 of 4 finished
    assert fast_sent == slow_sent == 2 * 6
    assert without_latency(output(tmp_path / "fast")) == \
        without_latency(output(tmp_path / "slow"))


def test_a_damaged_line_is_generated_never_copied(tmp_path: Path) -> None:
    def damage(folder: Path) -> None:
        path = files(folder)[1]
        lines = path.read_bytes().splitlines(keepends=True)
        lines[2] = lines[2][:40] + b"\n"  # record 8 cut short: no record
        path.write_bytes(b"".join(lines))
    plan = plan_of(tmp_path)
    fast, slow, fast_sent, slow_sent, _ = both_paths(tmp_path, plan, plan, damage)
    assert fast.copied == RECORDS - 1 and fast.damaged == 1
    assert fast_sent == slow_sent == 2
    rows = without_latency(output(tmp_path / "fast"))
    assert [r["index"] for r in rows] == list(range(RECORDS))
    assert all("reused_from" not in m for m in rows[8]["_meta"]["columns"].values())
    assert rows == without_latency(output(tmp_path / "slow"))


def test_a_reused_run_without_the_seed_record_is_never_taken_whole(tmp_path: Path) -> None:
    """A run made before the ``.inputs-*`` sidecar: the per-cell path."""
    def forget(folder: Path) -> None:
        for path in files(folder):
            inputs_path(path).unlink()
    plan = plan_of(tmp_path)
    fast, _, fast_sent, _, _ = both_paths(tmp_path, plan, plan, forget)
    assert fast.copied == 0 and fast_sent == 0
    assert output(tmp_path / "fast") == output(tmp_path / "slow")


def test_a_rerun_stopped_midway_resumes_to_the_same_bytes(tmp_path: Path) -> None:
    plan = plan_of(tmp_path)
    both_paths(tmp_path, plan, plan)
    resumed = tmp_path / "resumed"
    nowhere = {"gen": "http://127.0.0.1:9", "judge": "http://127.0.0.1:9"}
    for path in files(tmp_path / "fast"):
        first = int(path.stem.split("-")[1])
        whole = path.read_bytes().splitlines(keepends=True)
        count = len(whole)
        out = resumed / path.parent.relative_to(tmp_path / "fast")
        out.mkdir(parents=True)
        stop = threading.Event()
        stop.set()  # stopped before its first record: the seed record is written
        assert run_shard(plan, nowhere, Shard(first, count, Output(out, first),
                                              Progress(None, count), KeptRecords()),
                         stop, reuse=cells_of(tmp_path / "one", plan)) == 0
        (out / path.name).write_bytes(b"".join(whole[:count // 2])  # a torn last line
                                      + whole[count // 2][:10])
        assert run_shard(plan, nowhere, Shard(first, count, Output(out, first),
                                              Progress(None, count), KeptRecords()),
                         reuse=cells_of(tmp_path / "one", plan)) == count
        assert read_tag(inputs_path(out / path.name)) == seed_tag(
            plan.client.seed_data if plan.client else None)
    assert output(resumed) == output(tmp_path / "fast")


def test_the_seed_record_says_unknown_when_the_records_come_from_other_seed_data(
        tmp_path: Path) -> None:
    records = tmp_path / "new" / "records-000000000000.jsonl"
    kept = tmp_path / "old" / "records-000000000000.jsonl"
    records.parent.mkdir()
    kept.parent.mkdir()
    write_inputs(kept, "sha256:1", False)
    write_inputs(records, "sha256:1", False, [kept])
    assert read_tag(inputs_path(records)) == "sha256:1"
    write_inputs(records, "sha256:2", True)  # an earlier execution read other seed data
    assert read_tag(inputs_path(records)) == UNKNOWN
    write_inputs(records, "sha256:1", False, [kept, tmp_path / "x" / "records-1.jsonl"])
    assert read_tag(inputs_path(records)) == UNKNOWN  # a kept file that cannot say
    write_inputs(records, "sha256:2", False, [kept])
    assert read_tag(inputs_path(records)) == UNKNOWN


@pytest.mark.parametrize("change", ["seed", "order", "fields", "drop", "position",
                                    "context"])
def test_what_makes_a_recipe_not_the_same(tmp_path: Path, change: str) -> None:
    plan = plan_of(tmp_path)
    assert same_recipe(plan, plan_of(tmp_path))
    spec = plan.client
    assert spec is not None and spec.seed_data is not None
    columns = list(spec.columns)
    new = {"seed": dataclasses.replace(spec, seed=8),
           "order": dataclasses.replace(spec, seed_data=dataclasses.replace(
               spec.seed_data, order="in-order")),
           "fields": dataclasses.replace(spec, seed_data=dataclasses.replace(
               spec.seed_data, fields=("name", "age"))),
           "drop": dataclasses.replace(spec, columns=tuple(
               dataclasses.replace(c, drop=False) for c in columns)),
           "position": dataclasses.replace(spec, columns=tuple(columns[1:] + columns[:1])),
           "context": dataclasses.replace(spec, context="About {topic}.")}[change]
    assert not same_recipe(plan, plan.replace(client=new))


def test_an_earlier_reused_run_gives_its_cells_first(tmp_path: Path) -> None:
    """``--reuse R1 --reuse R2``: R1 (another judge) is not the same recipe but gives
    column a (and its b stands first, so b is generated); R2 is the same recipe, but its
    records are not taken whole where R1 gave a cell."""
    plan = plan_of(tmp_path)
    other = dataclasses.replace(plan, deployments=tuple(
        dataclasses.replace(d, command=("true", "--seed", "2")) if d.alias == "judge" else d
        for d in plan.deployments))
    log = tmp_path / "requests.log"
    with serve_in_thread(model="fake-model", request_log=str(log)) as server:
        run(other, server.url, tmp_path / "r1", 4)
        run(plan, server.url, tmp_path / "r2", 3)
        sent = requests(log)
        sources = [f"r1={tmp_path / 'r1'}", f"r2={tmp_path / 'r2'}"]
        fast = reused_cells(sources, 0, RECORDS, plan)
        run(plan, server.url, tmp_path / "fast", 5, fast)
        slow = reused_cells(sources, 0, RECORDS, None)
        run(plan, server.url, tmp_path / "slow", 5, slow)
    assert requests(log) == sent + 2 * RECORDS  # b: R1's cell of each record stands first
    assert fast is not None and slow is not None and fast.copied == 0
    rows = without_latency(output(tmp_path / "fast"))
    assert rows == without_latency(output(tmp_path / "slow"))
    assert [m.get("reused_from") for m in rows[0]["_meta"]["columns"].values()] == ["r1", None]


def test_a_dropped_llm_column_is_never_taken_whole(tmp_path: Path) -> None:
    """Its value is not in the record, so the per-cell path generates it."""
    columns = list(COLUMNS)
    columns[3] = dataclasses.replace(columns[3], drop=True)
    plan = plan_of(tmp_path, columns)
    fast, _, fast_sent, slow_sent, _ = both_paths(tmp_path, plan, plan)
    assert fast.copied == 0 and fast_sent == slow_sent == RECORDS
