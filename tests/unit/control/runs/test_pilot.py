"""The automatic layout's pilot (``--pilot``: a finished ``synthbatch benchmark``'s
measured work instead of the estimate) and the deadline (``--deadline``: shards from the
pilot's throughput, or a refusal saying how many GPUs it would need)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from synthbatch.control.benchmark import store
from synthbatch.control.benchmark.pilot import read_pilot
from synthbatch.control.config.loader import load_model
from synthbatch.control.config.overrides import Overrides
from synthbatch.control.config.run import RunConfig
from synthbatch.control.errors import InvalidInput
from synthbatch.control.planning.layout import Gpu, LayoutError, resolve_layout
from synthbatch.control.planning.pilot import PilotError, measure, shards_for_deadline
from synthbatch.control.planning.planner import config_path
from synthbatch.control.runs.modelinfo import read_facts
from synthbatch.control.runs.plan import resolve as resolve_plan
from tests.conftest import REPO
from tests.fakes import QUICKSTART, RUN_ID, Shard, fill, make_run, template_line


def resolve(*args: Any, **kwargs: Any) -> Any:
    """``resolve`` as the API calls it: with the benchmark layer's pilot reader."""
    return resolve_plan(*args, read_pilot=read_pilot, **kwargs)


def cells(alias: str, tokens: int, seconds: List[float]) -> List[Dict[str, Any]]:
    return [{"model": alias, "usage": {"completion_tokens": tokens}, "latency_ms": s * 1000}
            for s in seconds]


ROW = {"case": "w1", "concurrency": 8, "records": 10, "records_per_s": 2.0, "boot_s": 3.0,
       "error_rate": 0.0}


def test_the_work_per_record_is_measured_per_alias() -> None:
    """writer: 100 tokens a record at 10 ms (its least queued requests) on 2-GPU replicas;
    judge: 10 tokens at 5 ms on 1 GPU: 2.0 and 0.05 GPU-s a record."""
    queued = [3.0] * 2  # two requests that waited behind the others: not the model's cost
    got = measure("b-1", ROW, {"writer": (2, 1), "judge": (1, 3)},
                  cells("writer", 100, [1.0] * 10 + queued) + cells("judge", 10, [0.05] * 10)
                  + [{"model": "judge", "usage": {}, "latency_ms": 1.0}])
    assert got.tokens == {"writer": 120.0, "judge": 10.0}  # 12 requests over 10 records
    assert got.seconds_per_token == {"writer": 0.01, "judge": 0.005}
    assert got.work("writer") == pytest.approx(2.4) and got.work("judge") == pytest.approx(0.05)
    assert got.gpus == {"writer": 2, "judge": 3}
    # the pilot's bottleneck is the writer (2 GPUs / 2.4); twice its GPUs: twice the rate
    assert got.rate({"writer": 4, "judge": 3}) == pytest.approx(4.0)
    assert got.rate({"writer": 2, "judge": 1}) == pytest.approx(2.0)
    assert "120 tokens a record x 10.0 ms a token" in got.describe("writer")


@pytest.mark.parametrize("row,found,message", [
    ({**ROW, "records_per_s": None}, cells("w", 1, [1.0]), "no records/s measured"),
    (ROW, cells("other", 1, [1.0]), "no request of 'w' with latency_ms and usage"),
    (ROW, cells("w", 1, [0.0]), "'w': no time measured per token"),
])
def test_a_pilot_without_the_numbers_says_which(row, found, message) -> None:
    with pytest.raises(PilotError, match=message):
        measure("b-1", row, {"w": (1, 1)}, found)


def test_the_deadline_gives_the_shards_and_refuses_with_the_gpus_needed() -> None:
    # 36,000 records at 1 record/s a job of 4 GPUs, 0.5 s boot, in 2 h: 6 jobs
    got = shards_for_deadline(36_000, 2.0, 1.0, 4, 0.5, 0.0, 3, None, "pilot b-1")
    assert got.count == 6 and "need 6 job(s) of 4 GPU(s) at once (24 GPUs)" in got.reason
    assert "shards 3 -> 6" in got.reason
    assert shards_for_deadline(36_000, 2.0, 1.0, 4, 0.5, 0.0, 10, None, "p").count == 10
    with pytest.raises(LayoutError, match=r"need 6 job\(s\) of 4 GPU\(s\) at once \(24 GPUs\)"
                       r".*at most 2 at once"):
        shards_for_deadline(36_000, 2.0, 1.0, 4, 0.5, 0.0, 3, 2, "p")
    # jobs of 30 minutes: each shard must fit one, 20 of them (the deadline needs only 6)
    assert shards_for_deadline(36_000, 2.0, 1.0, 4, 0.5, 0.0, 3, None, "p", 1800).count == 21
    with pytest.raises(LayoutError, match="time limit .60 s. is not longer than the boot"):
        shards_for_deadline(36_000, 2.0, 1.0, 4, 60.0, 0.0, 3, None, "p", 60)
    with pytest.raises(LayoutError, match="boot .* exceeds the deadline"):
        shards_for_deadline(10, 0.001, 1.0, 4, 60.0, 0.0, 1, None, "p")
    with pytest.raises(LayoutError, match="more jobs than records"):
        shards_for_deadline(3, 0.001, 0.0001, 4, 0.0, 0.0, 1, None, "p")


def test_a_measured_pilot_replaces_the_estimated_split(tmp_path: Path) -> None:
    """The example's writer does ~30x the judge's work by the estimate; a pilot that
    measured them equal gives them equal GPUs."""
    run = load_model(REPO / "examples" / "auto-layout.toml", RunConfig)
    folder = (REPO / "examples").resolve()
    facts = {i: read_facts(config_path(d.model, folder)) for i, d in enumerate(run.deployments)}
    gpu = Gpu(80, 8)

    def gpus(measured) -> Dict[str, int]:
        filled, choices = resolve_layout(run, gpu, 64, facts, measured)
        return {d.alias: d.gpus_per_replica * d.replicas for d in filled.deployments}

    estimated = gpus(None)
    assert estimated["writer"] > 5 * estimated["judge"]
    equal = gpus({"writer": (1.0, "measured"), "judge": (1.0, "measured")})
    assert abs(equal["writer"] - equal["judge"]) <= 4  # a writer replica is 4 GPUs
    _, choices = resolve_layout(run, gpu, 64, facts, {"writer": (1.0, "measured by X"),
                                                      "judge": (1.0, "measured by X")})
    assert "work share 0.50, measured by X" in choices[0].reason


# ---- through plan: the benchmark in the workspace -----------------------------------------

def workspace(tmp_path: Path, done: bool = True) -> Path:
    """A profile whose workspace holds benchmark b-1: one case (fake-server.toml's 'tiny'
    on 1 GPU), one point of 10 records in 10 s (1 record/s), 3 tokens at 100 ms each."""
    ws = tmp_path / "ws"
    layout = make_run(ws, [Shard("winner")])
    fill(layout, 0, 10, 10.0, [300.0] * 10, done=done, shape=template_line)
    store.save(ws, {"benchmark_id": "b-1", "name": "b", "targets": None, "cases": [
        {"case": "tiny", "run_id": RUN_ID,
         "points": [{"shard": 0, "concurrency": 4, "records": 10}]}]})
    profile = tmp_path / "profile.toml"
    profile.write_text((REPO / "examples" / "profiles" / "testbed.toml").read_text()
                       .replace('workspace = "', f'workspace = "{ws}" #'))
    return profile


def run_file(tmp_path: Path, records: int = 36_000, extra: str = "",
             model: str = "fake-model") -> Path:
    text = QUICKSTART.read_text().replace("records = 30", f"records = {records}").replace(
        'model = "fake-model"', f'model = "{model}"').replace(
        "[resources]", "[resources]\n" + extra).replace(
        'time_limit = "00:10:00"', 'time_limit = "04:00:00"').replace(
        "{config_dir}/../fixtures", str(REPO / "fixtures"))
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_the_deadline_turns_into_shards_from_the_pilot(tmp_path: Path) -> None:
    profile = str(workspace(tmp_path))
    resolved = resolve(run_file(tmp_path), profile,
                       overrides=Overrides(deadline_hours=2.0, pilot="b-1"))
    # 36,000 records at 1 record/s a 1-GPU job in 2 h (boot 0.5 s): 6 shards, not 3
    assert len(resolved.plan.shards) == 6
    reason = resolved.layout[-1].reason
    assert resolved.layout[-1].alias == "shards" and resolved.layout[-1].chosen == {"count": 6}
    assert "36000 records in 2 h need 6 job(s) of 1 GPU(s) at once (6 GPUs) at 1 records/s " \
        "a job (pilot b-1: 1 records/s on 1 GPUs, scaled to this layout)" in reason


@pytest.mark.parametrize("extra,over,message", [
    ("deadline_hours = 2\n", {}, "run.toml: resources.deadline_hours: a deadline needs a "
     "measured throughput: run `synthbatch benchmark`"),
    ("", {"deadline_hours": 2.0, "pilot": "b-404"}, "run.toml: resources.pilot: benchmark "
     "b-404: no such benchmark"),
    ('deadline_hours = 2\npilot = "b-1"\n', {}, r"need 6 job\(s\) of 1 GPU\(s\) at once "
     r"\(6 GPUs\) at 1 records/s a job .*but the array runs at most 2 at once"),
])
def test_a_deadline_or_pilot_that_cannot_be_used_is_one_line(tmp_path: Path, extra: str,
                                                            over: Dict[str, Any],
                                                            message: str) -> None:
    profile = str(workspace(tmp_path))
    path = run_file(tmp_path, extra=extra)
    if "at most 2" in message:
        path.write_text(path.read_text().replace("count = 3", "count = 3\nthrottle = 2"))
    with pytest.raises(InvalidInput, match=message) as err:
        resolve(path, profile, overrides=Overrides(**over))
    assert "\n" not in str(err.value)


def test_an_unfinished_pilot_is_refused(tmp_path: Path) -> None:
    profile = str(workspace(tmp_path, done=False))
    with pytest.raises(InvalidInput, match="resources.pilot: benchmark b-1 is not finished: "
                       "tiny @ concurrency 4: partial"):
        resolve(run_file(tmp_path), profile, overrides=Overrides(pilot="b-1"))


def test_a_pilot_of_other_models_is_refused(tmp_path: Path) -> None:
    profile = str(workspace(tmp_path))
    with pytest.raises(InvalidInput, match="b-1: 'tiny' served 'fake-model', this run "
                       "'other-model': pilot this run's models"):
        resolve(run_file(tmp_path, model="other-model"), profile,
                overrides=Overrides(pilot="b-1"))


@pytest.mark.parametrize("over,message", [
    ({"deadline_hours": -1}, "--deadline: Input should be greater than 0"),
    ({"deadline_hours": "soon"}, "--deadline: Input should be a valid number"),
    ({"pilot": "../b-1"}, "--pilot: String should match pattern"),
])
def test_bad_options_name_the_option(over: Dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        Overrides(**over)


def test_a_bad_deadline_in_the_run_file_names_the_field(tmp_path: Path) -> None:
    profile = str(workspace(tmp_path))
    with pytest.raises(InvalidInput, match="resources.deadline_hours"):
        resolve(run_file(tmp_path, extra="deadline_hours = 0\n"), profile)


def test_a_caller_without_a_pilot_reader_refuses_a_pilot_in_one_line(tmp_path: Path) -> None:
    # preview resolves without the benchmark layer: a pilot there is named, never ignored
    profile = str(workspace(tmp_path))
    with pytest.raises(InvalidInput, match="resources.pilot: a pilot is read by plan and "
                       "submit only"):
        resolve_plan(run_file(tmp_path), profile, overrides=Overrides(pilot="b-1"))
