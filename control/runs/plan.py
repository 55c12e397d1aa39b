"""``synthbatch plan``: validate and resolve a run, render its script, write nothing.

``dry_run`` is what ``control.api.plan`` returns: the plan, its sha256, the batch script,
the human summary and the login-node checks. ``resolve`` is the shared first half of
``plan`` and ``submit``; ``login_checks`` is what both check before anything is queued
(``submit`` refuses an error, keeps the warnings in ``run.json``). A seed file visible here
is read through (``check_seed_data``) and a Data Designer config is checked by the agent's
own validator when its client environment is here (``check_on_login_node``).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from synthbatch.agent_stdlib.contracts import Plan, ShardSpec, sha256_bytes, split_dd_config
from synthbatch.agent_stdlib.layout import bundle_cache, job_name, run_dir
from synthbatch.agent_stdlib.recipe.budget import budget_problem
from synthbatch.agent_stdlib.recipe.columns import ColumnError
from synthbatch.agent_stdlib.recipe.seeds import SeedError, peek_fields, scan
from synthbatch.control import bundle
from synthbatch.control.config.client import DataDesignerClient, GenerateClient
from synthbatch.control.config.loader import load_model
from synthbatch.control.config.overrides import Overrides
from synthbatch.control.config.profile import Profile, load_profile
from synthbatch.control.config.run import RunConfig
from synthbatch.control.errors import InvalidInput, SchedulerUnavailable
from synthbatch.control.images import registry
from synthbatch.control.planning.arrays import array_chunks
from synthbatch.control.planning.planner import config_path, make_plan
from synthbatch.control.planning.summary import plan_summary
from synthbatch.control.runs.checks import (
    ERROR,
    OK,
    WARNING,
    DeploymentInputs,
    Finding,
    Sight,
    check_plan_paths,
    check_ports,
    port_offsets,
)
from synthbatch.control.runs.fit import Origins, check_request
from synthbatch.control.runs.layout import Choice, PilotReader, apply_layout, layout_memory
from synthbatch.control.runs.store import new_run_id, run_id_pattern
from synthbatch.control.slurm.renderer import BatchScript, render_batch_script
from synthbatch.control.slurm.runner import Runner, run_command
from synthbatch.control.slurm.scheduler import Scheduler

DD_CHECK_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Resolved:
    """A run resolved against its profile: the plan and where it came from."""

    plan: Plan
    plan_bytes: bytes  # plan.json exactly as it is staged
    plan_sha256: str  # of plan_bytes: computed here once, named by run.json and the script
    profile: Profile  # with the overrides in effect
    profile_path: Path
    run_file: Path
    config: Optional[RunConfig] = None  # with the overrides in effect
    overrides: Overrides = field(default_factory=Overrides)
    client_config: Optional[Path] = None  # a Data Designer config file the run pinned
    layout: Sequence[Choice] = ()  # what the automatic layout chose (control/runs/layout.py)

    @property
    def reuse(self) -> List[str]:
        """The run file's ``reuse = [...]`` run ids (issue 31; none without a run file)."""
        return list(self.config.reuse) if self.config is not None else []


def at_first_task(resolved: Resolved, first_task: int,
                  max_array_size: Optional[int]) -> Resolved:
    """``resolved`` with its tasks from ``first_task`` on (``ArraySpec.first_task``: the
    run shares one array with other runs), the plan's bytes and digest made again."""
    if not first_task:
        return resolved
    plan = resolved.plan.replace(arrays=array_chunks(len(resolved.plan.shards),
                                                     max_array_size, first_task))
    payload = plan.to_json().encode("utf-8")
    return dataclasses.replace(resolved, plan=plan, plan_bytes=payload,
                               plan_sha256=sha256_bytes(payload))


def resolve(run_file: Path, profile: Optional[str] = None, run_id: Optional[str] = None,
            max_array_size: Optional[int] = None, agent_sha256: str = "",
            overrides: Optional[Overrides] = None,
            shards: Optional[Sequence[ShardSpec]] = None, dry: bool = False,
            read_pilot: Optional[PilotReader] = None) -> Resolved:
    """Load the profile, the run config and the image registry; apply the command line's
    overrides and the automatic layout (``read_pilot``: how a pilot is read); make the plan
    (with ``shards`` in place of the planner's split: a benchmark's sized points). A
    ``dry`` plan has the run id's pattern for its id."""
    prof, profile_path = load_profile(profile)
    config = load_model(run_file, RunConfig)
    overrides = overrides or Overrides()
    prof, config = overrides.apply(prof, config)
    config, layout = apply_layout(config, prof, run_file, profile_path, read_pilot)
    images = registry.load(Path(prof.workspace))
    run_id = run_id or (run_id_pattern if dry else new_run_id)(config.name)
    folder = run_file.resolve().parent
    plan = make_plan(config, prof, run_id, folder, images=images, run_file=run_file,
                     profile_file=profile_path, max_array_size=max_array_size,
                     agent_sha256=agent_sha256)
    if shards is not None:
        plan = plan.replace(shards=tuple(shards))
    if isinstance(config.client, GenerateClient):
        plan = check_seed_data(plan, config.client, run_file)
    client_config = client_config_file(config, folder)
    spec = plan.client_data_designer
    if spec is not None and client_config is not None:
        # the Data Designer config's sha256 pinned: every shard then runs the config as
        # submitted, and one edited mid-run fails its shard instead of changing the data
        # silently (``agent_stdlib/client/data_designer.py``)
        plan = plan.replace(client_data_designer=dataclasses.replace(
            spec, config_sha256=sha256_bytes(client_config.read_bytes())))
    payload = plan.to_json().encode("utf-8")
    return Resolved(plan, payload, sha256_bytes(payload), prof, profile_path, run_file,
                    config=config, overrides=overrides, client_config=client_config,
                    layout=tuple(layout))


def client_config_file(config: RunConfig, config_dir: Path) -> Optional[Path]:
    """The host path of a Data Designer client's config file, when the login node sees it."""
    client = config.client
    if not isinstance(client, DataDesignerClient):
        return None
    path = Path(config_path(split_dd_config(client.data_designer)[0], config_dir))
    return path if path.is_file() else None


def origins(resolved: Resolved) -> Origins:
    """Which field each requested resource came from, named as the user wrote it."""
    run, prof = str(resolved.run_file), str(resolved.profile_path)
    cfg, over, profile = resolved.config, resolved.overrides, resolved.profile
    gpus = resolved.plan.resources.gpus
    assert cfg is not None
    res = cfg.resources
    per_gpu_cpus = bool(profile.cpus_per_gpu and gpus)
    per_gpu_mem = bool(profile.mem_per_gpu_mb and gpus)
    return Origins(
        partition="--partition" if over.partition else f"{prof}: partition",
        account="--account" if over.account else f"{prof}: account",
        qos="--qos" if over.qos else f"{prof}: qos",
        reservation="--reservation" if over.reservation else f"{prof}: reservation",
        constraint=f"{prof}: sbatch_options.constraint",
        time_limit="--time" if over.time_limit else f"{run}: resources.time_limit"
        if res.time_limit else f"{prof}: default_time_limit",
        cpus=f"{run}: resources.cpus" if res.cpus else
        f"{prof}: cpus_per_gpu" if per_gpu_cpus else f"{prof}: cpus_per_task",
        mem_mb=f"{run}: resources.mem_mb" if res.mem_mb else
        f"{prof}: mem_per_gpu_mb" if per_gpu_mem else f"{prof}: mem_mb",
        gpus=f"{run}: deployments (GPUs per node; the profile's gpus_per_node is "
             f"{profile.gpus_per_node})",
        nodes=f"{run}: deployments (nodes)")


def deployment_inputs(resolved: Resolved) -> List[DeploymentInputs]:
    """What the run file said of each deployment, paths resolved like the planner's."""
    assert resolved.config is not None
    folder = resolved.run_file.resolve().parent
    return [DeploymentInputs(engine=d.engine,
                             python=config_path(d.python, folder) if d.python else None,
                             executable=d.executable)
            for d in resolved.config.deployments]


def login_checks(resolved: Resolved, scheduler: Scheduler,
                 unavailable: Optional[SchedulerUnavailable] = None,
                 environ: Optional[Mapping[str, str]] = None,
                 runner: Runner = run_command) -> List[Finding]:
    """Everything this login node can check before the queue: the paths, programs,
    images and secrets the plan names, its ports against the ephemeral range, whether the
    request fits its partition, and its account, QOS, reservation and node features."""
    prof = resolved.profile
    sight = Sight(Path(prof.workspace))
    found = check_plan_paths(resolved.plan, deployment_inputs(resolved), sight,
                             os.environ if environ is None else environ, runner,
                             files=(str(resolved.run_file), str(resolved.profile_path)))
    plan = resolved.plan
    found += round_python(resolved, sight)
    found += token_budget(plan, str(resolved.run_file))
    found.append(check_ports(f"{resolved.profile_path}: port_base", plan.runtime.port_base,
                             port_offsets(plan), "exclusive" in plan.resources.options))
    if prof.backend == "local":
        return found + local_fit(resolved)
    if resolved.layout and unavailable is None:
        found += layout_memory(prof, resolved.profile_path, scheduler)
    return found + check_request(resolved.plan.resources, scheduler, origins(resolved),
                                 unavailable)


def round_python(resolved: Resolved, sight: Sight) -> List[Finding]:
    """The automatic round job runs this Python on a compute node (docs/retry.md
    "Automatic retries"): a warning when the nodes may not see it."""
    import sys

    from synthbatch.control.runs.autoretry import python_visible

    cfg = resolved.config
    if resolved.profile.backend == "local" or cfg is None or not (
            (cfg.auto_retry and resolved.plan.max_attempts > 1) or cfg.output.merge_to):
        return []
    why = python_visible(sys.executable, sight.shared)
    return [Finding(WARNING, f"{resolved.run_file}: auto_retry",
                    f"{why}; install synthbatch on a shared filesystem or set "
                    f"auto_retry = false")] if why else []


def token_budget(plan: Plan, run_file: str) -> List[Finding]:
    """One warning per structured or judge column whose ``max_tokens`` cannot hold its
    shortest valid answer (:mod:`agent_stdlib.recipe.budget`), naming
    ``client.columns[i].max_tokens``: every such cell would be cut and retried."""
    found = []
    columns = plan.client.columns if plan.client is not None else ()
    for i, column in enumerate(columns):
        problem = budget_problem(column.type, dict(column.params))
        if problem is not None:
            found.append(Finding(WARNING, f"{run_file}: client.columns[{i}].max_tokens "
                                          f"({column.name})", problem[0]))
    return found


def local_fit(resolved: Resolved) -> List[Finding]:
    """The local backend's "partition" is this machine: an allocation needs its GPUs (the
    backend enforces no CPU or memory limits, so those cannot fail to fit)."""
    from synthbatch.control.backends.local.gpus import detect, gpu_pool

    prof, res = resolved.profile, resolved.plan.resources
    local = prof.local
    try:
        pool = gpu_pool(tuple(local.gpus) if local.gpus is not None else None,
                        prof.gpus_per_node, detect())
    except ValueError as err:
        return [Finding(ERROR, f"{resolved.profile_path}: local.gpus", str(err))]
    if res.gpus > len(pool):
        return [Finding(ERROR, origins(resolved).gpus,
                        f"{res.gpus} GPUs per allocation, but this machine's local backend "
                        f"has {len(pool)} ({','.join(pool) or 'none'})")]
    if res.nodes > 1:
        return [Finding(ERROR, origins(resolved).nodes,
                        f"{res.nodes} nodes per allocation, but the local backend runs on "
                        "this machine only")]
    return [Finding(OK, "local backend", f"fits this machine: {res.gpus} of {len(pool)} "
                                         "GPUs per allocation")]


def preview_script(resolved: Resolved) -> str:
    """The batch script of the first submission, with placeholder agent digests."""
    prof, plan = resolved.profile, resolved.plan
    return render_batch_script(BatchScript(
        job_name=job_name(plan.run_id), run_dir=str(run_dir(prof.workspace, plan.run_id)),
        agent_pyz="agent-<sha256>.pyz", agent_sha256=plan.agent_sha256 or "<sha256>",
        plan_sha256=resolved.plan_sha256, submission=1, python=prof.python,
        resources=plan.resources, signal_lead_s=prof.signal_lead_s,
        slurm_bin=prof.slurm_bin, export=plan.job_env()))


def _with_lines(summary: str, lines: Sequence[str]) -> str:
    """``summary`` with ``lines`` after its last line."""
    return summary.rstrip("\n") + "\n" + "".join(f"{line}\n" for line in lines)


def dry_run(run_file: Path, profile: Optional[str] = None,
            max_array_size: Optional[int] = None, overrides: Optional[Overrides] = None,
            scheduler: Optional[Scheduler] = None,
            unavailable: Optional[SchedulerUnavailable] = None,
            read_pilot: Optional[PilotReader] = None) -> Dict[str, Any]:
    """Everything ``synthbatch plan`` prints; no state is written anywhere.

    ``checks`` are the login-node checks (``login_checks``), run when a ``scheduler`` is
    given.
    """
    resolved = resolve(run_file, profile, max_array_size=max_array_size, overrides=overrides,
                       dry=True, read_pilot=read_pilot)
    plan = resolved.plan
    checks = login_checks(resolved, scheduler, unavailable) if scheduler is not None else []
    summary = plan_summary(plan, resolved.plan_sha256, resolved.profile.gpus_per_node)
    if resolved.layout:
        summary = _with_lines(summary, [f"layout: {c.alias}: {c.reason}"
                                        for c in resolved.layout])
    out = {
        "plan": plan.to_dict(),
        "plan_sha256": resolved.plan_sha256,
        "script": preview_script(resolved),
        "shards": len(plan.shards),
        "records": plan.total_records,
        "checks": [c.to_dict() for c in checks],
        "overrides": resolved.overrides.to_dict(),
        "layout": [c.to_dict() for c in resolved.layout],
        "reuse": resolved.reuse,  # the run file's reuse list (issue 31)
    }
    if plan.client_data_designer is not None:
        check = check_on_login_node(plan, resolved.plan_bytes, run_file,
                                    Path(resolved.profile.workspace))
        out["data_designer"] = check
        lines = [f"data designer: config checked with {check['python']}"] \
            if check["checked"] else []
        summary = _with_lines(summary, lines + [f"data designer: {n}" for n in check["notes"]])
    return {**out, "summary": summary}


def check_seed_data(plan: Plan, client: GenerateClient, run_file: Path) -> Plan:
    """``plan`` with its seed data's row count; InvalidInput naming file and line.

    A seed file that exists here is read once, completely (``agent_stdlib.recipe.seeds``):
    missing fields, malformed rows and an empty file fail the plan, the recipe's names are
    checked against the file's fields, and the plan records the row count (the generator
    notices a file that changed since). A path that does not exist here is judged by the
    login-node checks' one path rule (``control.runs.checks.check_path``).
    """
    spec = plan.client
    if spec is None or spec.seed_data is None or not os.path.exists(spec.seed_data.path):
        return plan
    seed = spec.seed_data
    try:
        fields = peek_fields(seed.path)
    except SeedError as err:
        raise InvalidInput(f"{run_file}: client.seed_data.path: {err}") from err
    try:
        client.graph(fields)
    except ColumnError as err:
        raise InvalidInput(f"{run_file}: client.{err}") from err
    try:
        index = scan(seed.path, validate=True, required=seed.fields)
    except SeedError as err:
        raise InvalidInput(f"{run_file}: client.seed_data.path: {err}") from err
    return plan.replace(client=dataclasses.replace(spec, seed_data=dataclasses.replace(
        seed, rows=index.rows)))


def check_on_login_node(plan: Plan, plan_bytes: bytes, run_file: Path, workspace: Path,
                        ambient: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """A Data Designer config checked here: ``{"checked": bool, "python": ..., "notes":
    [...]}``; InvalidInput (one detail line per problem) when Data Designer or the adapter
    rejects the run.

    The check is the agent's own (``python -I agent.pyz dd --validate --plan -``), run as a
    subprocess under the client environment's Python with the plan on stdin: the control
    plane never imports ``data_designer`` or the agent's ``dd`` role. It runs when that
    Python exists here and the client runs on the host (not in an image); otherwise
    preflight runs the same check before any server starts, and the notes say so.
    """
    from synthbatch.agent_stdlib.contracts import dd_check_report

    spec = plan.client_data_designer
    assert spec is not None
    ambient = os.environ if ambient is None else ambient

    def unchecked(why: str) -> Dict[str, Any]:
        return {"checked": False, "python": spec.python,
                "notes": [f"not checked here: {why}; preflight checks it before any server "
                          "starts"]}

    if spec.container is not None:
        return unchecked(f"the client runs in image {spec.container.image}")
    if not (os.path.isfile(spec.python) and os.access(spec.python, os.X_OK)):
        return unchecked(f"{spec.python} is not on this node")
    with tempfile.TemporaryDirectory(prefix="synthbatch-plan-") as scratch:
        cache = bundle_cache(workspace)  # a dry run creates no workspace
        try:
            pyz = bundle.locate_agent_bundle(cache if cache.is_dir() else Path(scratch))
        except bundle.BundleError as err:
            return unchecked(f"no agent bundle ({err})")
        env = dict(ambient, SHIV_ROOT=scratch)  # the bundle unpacks here, not in ~/.shiv
        env.update(spec.env)
        env.update({var: ambient[job] for var, job in spec.secret_env.items()
                    if job in ambient})
        try:
            done = subprocess.run([spec.python, "-I", str(pyz), "dd", "--plan", "-",
                                   "--validate"], input=plan_bytes.decode("utf-8"), env=env,
                                  capture_output=True, text=True, timeout=DD_CHECK_TIMEOUT_S,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            return unchecked(f"{spec.python} did not run the check ({err})")
    problems, notes = dd_check_report(done.stdout, done.stderr, done.returncode)
    if problems:
        count = f"{len(problems)} problem" + ("s" if len(problems) != 1 else "")
        raise InvalidInput(f"{run_file}: client.data_designer: {spec.config}: "
                           f"{count} (checked with {spec.python})", details=problems)
    return {"checked": True, "python": spec.python, "notes": notes}
