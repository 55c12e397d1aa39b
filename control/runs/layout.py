"""The automatic layout at the edge: read the models the layout needs, then let the pure
rule (``control/planning/layout.py``) fill in the run (shared by ``plan`` and ``submit``)."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Tuple

from control.config.profile import Profile
from control.config.run import RunConfig
from control.errors import InvalidInput, SchedulerUnavailable
from control.planning.layout import (
    Choice,
    Gpu,
    LayoutError,
    automatic,
    memory_conflict,
    resolve_layout,
    wants_parallel,
)
from control.planning.modelfacts import ModelFacts
from control.planning.planner import config_path
from control.runs.checks import WARNING, Finding
from control.runs.modelinfo import ModelUnreadable, read_facts
from control.slurm.scheduler import Scheduler


def apply_layout(run: RunConfig, profile: Profile, run_file: Path,
                 profile_path: Path) -> Tuple[RunConfig, List[Choice]]:
    """``run`` with its automatic fields chosen, and the choices (InvalidInput naming the
    file and field when a model cannot be read or nothing fits)."""
    budget = run.resources.gpus
    wanted = automatic(run, budget)
    if not wanted and budget is None:
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
    try:
        return resolve_layout(run, Gpu(profile.gpu_memory_gb, profile.gpus_per_node),
                              budget, facts)
    except LayoutError as err:
        source = profile_path if err.source == "profile" else run_file
        raise InvalidInput(f"{source}: {err.where}: {err}") from err


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
