"""The automatic layout at the edge: read the models the layout needs, then let the pure
rule (``control/planning/layout.py``) fill in the run (shared by ``plan`` and ``submit``)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from synthbatch.control.config.profile import Profile
from synthbatch.control.config.run import RunConfig
from synthbatch.control.errors import InvalidInput, SchedulerUnavailable
from synthbatch.control.planning.layout import (
    Choice,
    Gpu,
    LayoutError,
    automatic,
    memory_conflict,
    resolve_layout,
    wants_parallel,
)
from synthbatch.control.planning.modelfacts import ModelFacts
from synthbatch.control.planning.pilot import Pilot, shard_count, shards_for_deadline
from synthbatch.control.planning.planner import config_path
from synthbatch.control.runs.checks import WARNING, Finding
from synthbatch.control.runs.modelinfo import ModelUnreadable, read_facts
from synthbatch.control.slurm.directives import time_limit_seconds
from synthbatch.control.slurm.scheduler import Scheduler

# reads a pilot: (workspace, benchmark id, alias -> model, field for errors) -> Pilot.
# The benchmark's state is read a layer up (control/benchmark/pilot.py: read_pilot); the
# API hands the reader in, so that this layer never imports the benchmark's.
PilotReader = Callable[[Path, str, Mapping[str, str], str], Pilot]


def apply_layout(run: RunConfig, profile: Profile, run_file: Path, profile_path: Path,
                 read_pilot: Optional[PilotReader] = None) -> Tuple[RunConfig, List[Choice]]:
    """``run`` with its automatic fields chosen (and, with a deadline, its shards), and the
    choices (InvalidInput naming the file and field when a model or the pilot cannot be
    read, nothing fits or the deadline cannot be met). ``read_pilot`` reads
    ``resources.pilot`` (None: a caller that cannot read benchmarks refuses one)."""
    budget = run.resources.gpus
    wanted = automatic(run, budget)
    res = run.resources
    if not wanted and budget is None and res.deadline_hours is None and res.pilot is None:
        return run, []
    folder = run_file.resolve().parent
    facts: Dict[int, ModelFacts] = {}
    for index in wanted:
        dep = run.deployments[index]
        try:
            facts[index] = read_facts(config_path(dep.model, folder))
        except ModelUnreadable as err:
            if wants_parallel(dep, budget) or len(run.deployments) > 1:
                raise InvalidInput(
                    f"{run_file}: deployments[{index}].model: {dep.alias}: {err}; the "
                    "automatic layout reads config.json and the safetensors index there: "
                    "give a readable model folder, or write gpus/tensor_parallel/"
                    "pipeline_parallel and replicas by hand") from err
    pilot = None
    if res.pilot is not None:
        if read_pilot is None:
            raise InvalidInput(f"{run_file}: resources.pilot: a pilot is read by plan and "
                               "submit only; leave it out here")
        models = {d.alias: config_path(d.model, folder) for d in run.deployments}
        pilot = read_pilot(Path(profile.workspace), res.pilot, models,
                           f"{run_file}: resources.pilot")
    measured = {a: (pilot.work(a), pilot.describe(a)) for a in pilot.tokens} if pilot else {}
    try:
        run, choices = resolve_layout(run, Gpu(profile.gpu_memory_gb, profile.gpus_per_node),
                                      budget, facts, measured)
        if res.deadline_hours is not None:
            run, choice = _deadline(run, profile, pilot)
            choices.append(choice)
        return run, choices
    except LayoutError as err:
        source = profile_path if err.source == "profile" else run_file
        raise InvalidInput(f"{source}: {err.where}: {err}") from err


def _deadline(run: RunConfig, profile: Profile, pilot: Optional[Pilot]
              ) -> Tuple[RunConfig, Choice]:
    """The run with the shards its deadline needs at the pilot's measured throughput."""
    if pilot is None:
        raise LayoutError("resources.deadline_hours", "a deadline needs a measured "
                          "throughput: run `synthbatch benchmark` on this run's models and "
                          "plan with --pilot BENCHMARK_ID (records/s are not guessed from "
                          "GPU specifications)")
    gpus = {d.alias: d.gpus_per_replica * d.replicas for d in run.deployments}
    shards = run.shards
    current = shard_count(run.records, shards.count, shards.records_per_shard)
    throttle = shards.throttle if shards.throttle is not None else profile.array_throttle
    got = shards_for_deadline(run.records, float(run.resources.deadline_hours or 0),
                              pilot.rate(gpus), sum(gpus.values()), pilot.boot_s,
                              pilot.error_rate, current, throttle,
                              f"pilot {pilot.benchmark_id}: {pilot.records_per_s:.3g} "
                              f"records/s on {sum(pilot.gpus.values())} GPUs, scaled to this "
                              "layout", time_limit_seconds(run.resources.time_limit
                                                           or profile.default_time_limit))
    if got.count != current:
        shards = shards.model_copy(update={"count": got.count, "records_per_shard": None})
    return (run.model_copy(update={"shards": shards}),
            Choice("shards", {"count": got.count}, got.reason))


def layout_memory(profile: Profile, profile_path: Path, scheduler: Scheduler) -> List[Finding]:
    """A warning when the profile's ``gpu_memory_gb`` is more than the partition's GRES
    type names allow (``gpu:a100_40g:8`` and 80 GB); nothing when Slurm cannot say."""
    if profile.gpu_memory_gb is None or not profile.partition:
        return []
    try:
        nodes = scheduler.partition_nodes(profile.partition)
    except SchedulerUnavailable:
        return []
    why = memory_conflict(profile.gpu_memory_gb, [n.gres for n in nodes])
    return [Finding(WARNING, f"{profile_path}: gpu_memory_gb", why)] if why else []
