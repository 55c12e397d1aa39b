"""What records cost (issue 32): GPU-hours, money and tokens per 1,000 records, per model
alias and per LLM column, with failed attempts and requeues counted once, apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synthbatch.agent_stdlib.contracts import AliasProgress, ColumnTokens, ProgressRecord
from synthbatch.agent_stdlib.statefile import write_json_atomic
from synthbatch.control.runs.cost import (
    AttemptUse,
    attempt_uses,
    cached,
    figures,
    lines,
    report,
    run_cost,
)
from synthbatch.control.slurm.parsers import JobUsage
from tests.fakes import Shard, make_run

# Two deployments of 2 GPUs each: every job holds 4 GPUs, so 900 s of a job is 1 GPU-hour.
GPUS = {"gen": 2, "judge": 2}


def retried_and_requeued() -> tuple:
    """Shard 0: attempt 1 (job 500_0) was requeued once by Slurm (900 s), then won
    (1,800 s). Shard 1: attempt 1 (job 500_1) failed after 900 s; its retry, attempt 2
    (job 600_1), won after 1,800 s. Each winner has 100 valid records."""
    uses = [
        AttemptUse(0, 1, "500_0", won=True, over=True, records=100,
                   aliases={"gen": (30000, 25000), "judge": (30000, 1000)},
                   columns={"gen": {"draft": (20000, 25000), "title": (10000, 0)},
                            "judge": {"score": (30000, 1000)}}),
        AttemptUse(1, 1, "500_1", won=False, over=True,
                   aliases={"gen": (5000, 5000)}, columns={"gen": {"draft": (5000, 5000)}}),
        AttemptUse(1, 2, "600_1", won=True, over=True, records=100,
                   aliases={"gen": (35000, 20000), "judge": (30000, 1000)},
                   columns={"gen": {"draft": (20000, 15000), "title": (15000, 5000)},
                            "judge": {"score": (30000, 1000)}}),
    ]
    rows = [JobUsage("500_0", 900, 4), JobUsage("500_0", 1800, 4),  # requeued, then won
            JobUsage("500_1", 900, 4), JobUsage("600_1", 1800, 4)]
    return uses, rows


def test_cost_per_1000_records_equals_the_hand_computed_figure() -> None:
    """By hand, at $2.50 a GPU-hour:
    GPU-hours: (900 + 1800 + 900 + 1800) s x 4 GPUs / 3600 = 6.0; records 200;
    per 1,000 records: 6.0 x 1000 / 200 = 30.0 GPU-hours, 30.0 x 2.5 = $75.00.
    Wasted: the requeued execution 1.0 + the failed attempt 1.0 = 2.0 GPU-hours ($5.00).
    gen and judge hold 2 of the 4 GPUs each: 3.0 GPU-hours, 15.0 per 1,000 records.
    gen's tokens: draft 45,000 + 45,000 = 90,000, title 25,000 + 5,000 = 30,000: draft
    gets 3/4 of gen's 3.0 = 2.25 GPU-hours (11.25 per 1,000, $28.125), title 0.75 (3.75,
    $9.375); score has judge alone: 3.0 (15.0, $37.50).
    Tokens per 1,000 records: in 130,000 x 5 = 650,000; out 52,000 x 5 = 260,000."""
    uses, rows = retried_and_requeued()
    cost = report(figures(uses, rows, GPUS), 2.5)
    assert (cost["gpu_hours"], cost["cost"], cost["records"]) == (6.0, 15.0, 200)
    assert cost["per_1000_records"] == {"gpu_hours": 30.0, "cost": 75.0,
                                        "tokens_in": 650000.0, "tokens_out": 260000.0}
    assert cost["wasted"] == {"gpu_hours": 2.0, "cost": 5.0, "requeued_gpu_hours": 1.0}
    assert {a: p["per_1000_records"]["gpu_hours"] for a, p in cost["aliases"].items()} == \
        {"gen": 15.0, "judge": 15.0}
    per_column = {c: (p["alias"], p["gpu_hours"], p["per_1000_records"]["gpu_hours"],
                      p["per_1000_records"]["cost"]) for c, p in cost["columns"].items()}
    assert per_column == {"draft": ("gen", 2.25, 11.25, 28.125),
                          "title": ("gen", 0.75, 3.75, 9.375),
                          "score": ("judge", 3.0, 15.0, 37.5)}
    shown = "\n".join(lines(cost))
    assert "per 1,000 records: 30 GPU-hours, $75.00" in shown
    assert "wasted on failed attempts and requeues: 2.0 GPU-hours ($5.00)" in shown


def test_without_a_price_money_is_unknown_never_zero() -> None:
    uses, rows = retried_and_requeued()
    cost = report(figures(uses, rows, GPUS), None)
    assert cost["gpu_hours"] == 6.0 and cost["cost"] is None and cost["currency"] is None
    assert cost["per_1000_records"]["cost"] is None and cost["wasted"]["cost"] is None
    assert cost["columns"]["draft"]["cost"] is None
    assert "cost —" in lines(cost)[0]


def test_without_accounting_gpu_hours_are_unknown_and_tokens_still_count() -> None:
    uses, _ = retried_and_requeued()
    cost = report(figures(uses, None, GPUS), 2.5, gpu_hours_from="no accounting")
    assert cost["gpu_hours"] is None and cost["cost"] is None
    assert cost["per_1000_records"]["tokens_out"] == 260000.0
    assert cost["wasted"]["gpu_hours"] is None


def test_a_running_attempt_wastes_nothing_yet() -> None:
    """Its time so far counts in the total (sacct's ElapsedRaw of a running job)."""
    uses = [AttemptUse(0, 1, "500_0", won=False, over=False)]
    found = figures(uses, [JobUsage("500_0", 1800, 2)], {"gen": 2})
    assert (found.gpu_hours, found.wasted_gpu_hours, found.records) == (1.0, 0.0, 0)
    assert report(found, 3.0)["per_1000_records"]["gpu_hours"] is None  # no record yet


def _progress(path: Path, columns: dict) -> None:
    aliases = {alias: AliasProgress(
        tokens_in=sum(t[0] for t in cols.values()), tokens_out=sum(t[1] for t in cols.values()),
        columns={c: ColumnTokens(1, *t) for c, t in cols.items()})
        for alias, cols in columns.items()}
    write_json_atomic(path, ProgressRecord(records_done=10, records_total=10, tokens=0,
                                           requests_per_s=0.0, updated_at=1.0,
                                           aliases=aliases).to_dict())


def test_the_run_is_read_from_its_records_and_kept_once_over(tmp_path: Path) -> None:
    layout = make_run(tmp_path / "ws", [Shard("winner"), Shard("failed")])
    _progress(layout.attempt(0, 1).progress_json, {"model": {"text": (300, 700)}})
    uses, notes = attempt_uses(layout, 2)
    assert notes == []
    assert [(u.shard, u.job_id, u.won, u.over, u.records) for u in uses] == \
        [(0, "500_0", True, True, 10), (1, "500_1", False, True, 0)]
    assert uses[0].columns == {"model": {"text": (300, 700)}}
    rows = [JobUsage("500_0", 3600, 1), JobUsage("500_1", 1800, 1)]
    cost = run_cost(layout, rows, ["500"], 2.0, keep=True, kept=cached(layout, ["500"]))
    assert (cost["gpu_hours"], cost["wasted"]["gpu_hours"], cost["records"]) == (1.5, 0.5, 10)
    assert cost["per_1000_records"]["cost"] == 300.0  # 1.5 x $2 x 1000 / 10
    kept = json.loads((layout.root / "cost.json").read_text())
    assert kept["job_ids"] == ["500"]
    kept_now = cached(layout, ["500"])
    assert run_cost(layout, None, ["500"], 4.0, kept=kept_now)["cost"] == 6.0  # priced now
    recount = cached(layout, ["500", "600"])  # a retry: the kept figures no longer hold
    assert run_cost(layout, None, ["500", "600"], 4.0, kept=recount)["cost"] is None


def test_a_progress_record_carries_each_columns_tokens() -> None:
    from synthbatch.agent_stdlib.client.concurrency import Limiter
    from synthbatch.agent_stdlib.client.progress import AliasCounters

    counters = AliasCounters(Limiter(4, 8))
    counters.answered({"prompt_tokens": 10, "completion_tokens": 3}, column="draft")
    counters.answered({"prompt_tokens": 5, "completion_tokens": 1}, column="title")
    counters.answered({"prompt_tokens": 7, "completion_tokens": 2}, column="draft")
    view = counters.view()
    assert view.columns == {"draft": ColumnTokens(2, 17, 5), "title": ColumnTokens(1, 5, 1)}
    record = ProgressRecord(records_done=1, records_total=1, tokens=0, requests_per_s=0.0,
                            updated_at=1.0, aliases={"gen": view})
    assert ProgressRecord.from_dict(record.to_dict()) == record
    old = record.to_dict()
    del old["aliases"]["gen"]["columns"]  # a generator from before: none
    assert ProgressRecord.from_dict(old).aliases["gen"].columns == {}


@pytest.mark.parametrize("pricing, field", [
    ("per_gpu_hour = -1", "pricing.per_gpu_hour"),
    ("per_gpu_hour = nan", "pricing.per_gpu_hour"),
    ("per_gpu_hour = 'cheap'", "pricing.per_gpu_hour"),
    ("per_gpu_hor = 2", "pricing.per_gpu_hor"),
    ("[pricing.partitions.gpu]\nper_gpu_hour = 0", "pricing.partitions.gpu.per_gpu_hour"),
    ("[pricing.partitions.gpu.gpu_types]\nh100 = 4.0", "pricing.partitions.gpu.gpu_types"),
    ("gpu_type = 'a100'\n[pricing.partitions.gpu.gpu_types]\nh100 = 4.0", "pricing.gpu_type"),
    ("currency = ''", "pricing.currency"),
])
def test_a_bad_price_is_one_line_naming_the_field(tmp_path: Path, pricing: str,
                                                   field: str) -> None:
    from synthbatch.control.config.profile import load_pricing, load_profile
    from synthbatch.control.errors import InvalidInput

    path = tmp_path / "p.toml"
    path.write_text(f"schema_version = 1\nworkspace = '{tmp_path}/ws'\n[pricing]\n{pricing}\n")
    for load in (load_pricing, load_profile):
        with pytest.raises(InvalidInput) as err:
            load(str(path))  # type: ignore[operator]
        assert "\n" not in err.value.message and f"{field}:" in err.value.message, \
            err.value.message


def test_the_price_of_a_partition_and_a_gpu_type(tmp_path: Path) -> None:
    from synthbatch.control.config.profile import load_pricing

    path = tmp_path / "p.toml"
    path.write_text("schema_version = 1\nworkspace = '/x'\n[pricing]\nper_gpu_hour = 2.5\n"
                    "gpu_type = 'h100'\n[pricing.partitions.gpu]\nper_gpu_hour = 3.1\n"
                    "[pricing.partitions.gpu.gpu_types]\nh100 = 4.0\n"
                    "[pricing.partitions.cpu]\nper_gpu_hour = 1.0\n")
    pricing = load_pricing(path)
    assert (pricing.price("gpu"), pricing.price("cpu"), pricing.price("other"),
            pricing.price(None)) == (4.0, 1.0, 2.5, 2.5)
    path.write_text("schema_version = 1\nworkspace = '/x'\n")
    assert load_pricing(path).price("gpu") is None


def test_runs_lists_gpu_hours_and_cost_of_a_counted_run(tmp_path: Path) -> None:
    """``runs`` asks no Slurm: a finished run's GPU-hours as status kept them, priced by
    the profile; a run not counted yet shows neither."""
    from synthbatch.control import api

    workspace = tmp_path / "ws"
    layout = make_run(workspace, [Shard("winner"), Shard("winner")])
    profile = tmp_path / "p.toml"
    profile.write_text(f"schema_version = 1\nworkspace = '{workspace}'\n"
                       "[pricing]\nper_gpu_hour = 2.0\ncurrency = 'EUR'\n")
    (listed,) = api.runs(str(profile))
    assert (listed.gpu_hours, listed.cost) == (None, None)
    write_json_atomic(layout.root / "totals.json", {"schema_version": 1, "job_ids": ["500"],
                                                    "totals": {"gpu_hours": 1.5}})
    (listed,) = api.runs(str(profile))
    assert (listed.gpu_hours, listed.cost, listed.data["currency"]) == (1.5, 3.0, "EUR")


def test_the_card_has_the_kept_figures_priced_as_the_run_was(tmp_path: Path) -> None:
    from synthbatch.control.runs.cost import card_cost

    layout = make_run(tmp_path / "ws", [Shard("winner")])
    assert card_cost(layout) is None  # status has not counted them yet
    run_cost(layout, [JobUsage("500_0", 3600, 2)], ["500"], None, keep=True,
             kept=cached(layout, ["500"]))
    (layout.inputs).mkdir(exist_ok=True)
    (layout.inputs / "profile.toml").write_text(
        "schema_version = 1\nworkspace = '/x'\n[pricing]\nper_gpu_hour = 1.5\n")
    cost = card_cost(layout)
    assert cost is not None and (cost["gpu_hours"], cost["cost"]) == (2.0, 3.0)
    assert cost["per_1000_records"]["cost"] == 300.0  # $3 over 10 records


def test_status_counts_a_run_counted_before_once_then_reads_what_it_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished run whose totals.json predates cost.json: one sacct call, then none;
    the kept figures are read once a refresh."""
    from synthbatch.control.runs import cost as cost_module
    from synthbatch.control.runs.cost import status_cost

    layout = make_run(tmp_path / "ws", [Shard("winner")])
    asked = []

    def ask() -> list:
        asked.append(1)
        return [JobUsage("500_0", 1800, 2)]

    summary = {"state": "succeeded", "totals": {"gpu_hours": 1.0,
                                                "gpu_hours_from": "accounting (sacct)"}}
    first = status_cost(layout, summary, {}, ["500"], None, ask)
    reads = []
    real_read = cost_module.read_json_or_none

    def counted(path: Path) -> object:
        reads.append(Path(path).name)
        return real_read(path)

    monkeypatch.setattr(cost_module, "read_json_or_none", counted)
    again = status_cost(layout, summary, {}, ["500"], None, ask)
    assert asked == [1] and first == again
    assert reads.count("cost.json") == 1, reads
    assert (first["gpu_hours"], first["cost"], first["gpu_hours_from"]) == \
        (1.0, None, "accounting (sacct)")


def test_a_damaged_plan_leaves_the_figures_out_and_says_why(tmp_path: Path) -> None:
    from synthbatch.control.runs.cost import status_cost

    layout = make_run(tmp_path / "ws", [Shard("running")])
    layout.plan_json.chmod(0o600)
    layout.plan_json.write_text("{not json")
    cost = status_cost(layout, {"state": "running", "totals": {}}, {"rows": []}, ["500"],
                       None, lambda: None)
    assert cost["gpu_hours"] is None and cost["notes"][0].startswith("cost: ")
    assert "\n" not in cost["notes"][0]


def test_a_large_running_run_is_priced_without_reading_every_attempt(
        tmp_path: Path, monkeypatch) -> None:
    """Above LIVE_SHARDS shards a refresh of a running run opens no attempt file: GPU-hours
    and cost so far from accounting, per-1,000 figures once the run is over."""
    from synthbatch.control.runs import cost

    layout = make_run(tmp_path / "ws", [Shard("winner"), Shard("failed")])
    monkeypatch.setattr(cost, "LIVE_SHARDS", 1)
    monkeypatch.setattr(cost, "attempt_uses", lambda *a: pytest.fail("read attempts"))
    rows = [JobUsage("500_0", 3600, 1), JobUsage("500_1", 1800, 1)]
    live = run_cost(layout, rows, ["500"], 2.0, kept=cached(layout, ["500"]))
    assert (live["gpu_hours"], live["cost"], live["per_1000_records"]["cost"]) == \
        (1.5, 3.0, None)
    assert "once the run is over" in live["notes"][0]
    monkeypatch.undo()
    over = run_cost(layout, rows, ["500"], 2.0, keep=True, kept=cached(layout, ["500"]))
    assert over["per_1000_records"]["cost"] == 300.0


def test_reused_cells_are_said_apart_and_cost_this_run_nothing(tmp_path: Path) -> None:
    """Cells taken from earlier runs (issue 31) made no request here: the run's GPU-hours
    and tokens leave them out, and the cost says how many there were, on its own line."""
    from synthbatch.control.runs.cost import status_cost

    layout = make_run(tmp_path / "ws", [Shard("winner")])
    used = {"rows": [JobUsage("500_0", 1800, 2)], "complete": False}
    summary = {"state": "running", "totals": {"gpu_hours_from": "accounting (sacct)"}}
    plain = status_cost(layout, summary, used, ["500"], None, lambda: None)
    reusing = status_cost(layout, {**summary, "reuse": {"cells_reused": 6000, "cells": 8000,
                                                         "records_reused": 10}},
                          used, ["500"], None, lambda: None)
    assert "reused_cells" not in plain and reusing["reused_cells"] == 6000
    assert {k: v for k, v in reusing.items() if k != "reused_cells"} == plain
    assert "  reused 6,000 cells: no GPU time or tokens here (counted once, by the runs " \
        "that made them)" in lines(reusing)
    assert not any("reused" in line for line in lines(plain))
