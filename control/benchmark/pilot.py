"""Read a pilot for the automatic layout: a finished ``synthbatch benchmark`` of the same
models, from the workspace's durable state (``control/benchmark/analyze.py`` gives its
points; the best point's records give each alias's measured work, ``control/planning/
pilot.py``). Every problem is one ``InvalidInput`` line naming the field and benchmark."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from synthbatch.agent_stdlib.contracts import Plan
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import StateError, load_record
from synthbatch.control.benchmark import store
from synthbatch.control.benchmark.analyze import analyze, attempt_dir, record_cells
from synthbatch.control.errors import InvalidInput, SynthbatchError
from synthbatch.control.planning.pilot import Pilot, PilotError, measure
from synthbatch.control.runs.store import run_layout


def read_pilot(workspace: Path, bench_id: str, models: Mapping[str, str],
               where: str) -> Pilot:
    """The pilot of benchmark ``bench_id`` for deployments ``models`` (alias -> model as
    the plan resolves it); InvalidInput naming ``where`` when it is missing, unfinished,
    of other models or without the numbers."""
    head = f"{where}: benchmark {bench_id}"
    try:
        manifest = store.load(workspace, bench_id)
    except SynthbatchError as err:
        raise InvalidInput(f"{where}: {err}") from err
    layouts: Dict[str, Optional[RunLayout]] = {}
    for case in manifest["cases"]:
        try:
            layouts[case["run_id"]] = run_layout(workspace, case["run_id"])
        except (SynthbatchError, KeyError, TypeError):
            layouts[case["run_id"]] = None
    try:
        data = analyze(manifest, layouts)
    except (KeyError, TypeError, ValueError) as err:
        raise InvalidInput(f"{head}: a damaged benchmark record ({err})") from err
    if not data["complete"]:
        raise InvalidInput(f"{head} is not finished: {data['missing'][0]} (wait for it, "
                           "or `synthbatch benchmark analyze` it)")
    done = [r for r in data["points"] if r.get("records_per_s")]
    if not done:
        raise InvalidInput(f"{head}: no point measured records/s")
    row = max(done, key=lambda r: r["records_per_s"])
    layout = layouts[row["run_id"]]
    assert layout is not None  # a point with records/s has a layout
    deployments = _deployments(layout, models, head)
    folder = attempt_dir(layout, row["shard"])
    cells: List[Dict[str, Any]] = list(record_cells(folder / "output")) if folder else []
    try:
        return measure(bench_id, row, deployments, cells)
    except PilotError as err:
        raise InvalidInput(f"{head}: {err}") from err


def _deployments(layout: RunLayout, models: Mapping[str, str],
                 head: str) -> Dict[str, Tuple[int, int]]:
    """alias -> (GPUs a replica, replicas) of the pilot's run, checked to serve the same
    models under the same aliases."""
    try:
        plan = load_record(layout.plan_json, Plan)
    except StateError as err:
        raise InvalidInput(f"{head}: unreadable: {err}") from None
    if plan is None:
        raise InvalidInput(f"{head}: {layout.plan_json}: missing")
    found = {d.alias: d for d in plan.deployments}
    out = {}
    for alias, model in models.items():
        dep = found.get(alias)
        if dep is None:
            raise InvalidInput(f"{head} has no deployment {alias!r} (it has: "
                               f"{', '.join(sorted(found))}): pilot this run's models")
        if dep.model != model:
            raise InvalidInput(f"{head}: {alias!r} served {dep.model!r}, this run "
                               f"{model!r}: pilot this run's models")
        out[alias] = (dep.gpus_per_replica, dep.replicas)
    return out
