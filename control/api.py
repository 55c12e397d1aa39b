"""The Python API behind every CLI command: what notebooks and scripts call.

``plan``, ``submit``, ``status``, ``wait``, ``merge`` and ``runs`` return typed results
(``control.runs.results``; ``submit`` and ``run`` a :class:`Run` handle) whose
``to_dict()`` is what ``--json`` prints; ``cancel``, ``retry``, ``logs`` and ``preview``
return that data as plain dicts. Every path and profile argument takes a ``str`` or a ``Path``; a
profile is a name (``~/.config/synthbatch/profiles/<name>.toml``) or a file.

Imports of the planner, bundle builder and renderer happen inside the functions that need
them, so that ``status``, ``runs``, ``logs`` and ``cancel`` start quickly. Those commands
(and ``merge``) read the profile with ``control.config.workspace`` (the three fields they
use, no pydantic); ``plan``, ``submit`` and ``retry`` validate the whole profile.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    List,
    Optional,
    Sequence,
    Union,
)

from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.control.config.workspace import WorkspaceProfile, load_workspace_profile
from synthbatch.control.errors import InvalidInput, SchedulerUnavailable, SynthbatchError
from synthbatch.control.runs.results import MergeResult, PlanResult, RunStatus, RunSummary
from synthbatch.control.runs.store import latest_run_id, run_backend, run_layout
from synthbatch.control.slurm.scheduler import Scheduler

if TYPE_CHECKING:
    from synthbatch.agent_stdlib.contracts import ShardSpec
    from synthbatch.control.backends.local.scheduler import LocalScheduler
    from synthbatch.control.config.overrides import Overrides
    from synthbatch.control.config.profile import Profile
    from synthbatch.control.runs.status.refresh import Refresh

PathLike = Union[str, "os.PathLike[str]"]
ProfileRef = Union[str, "os.PathLike[str]", None]  # a name, a file, or None (the default)
Show = Callable[[Dict[str, Any]], None]
AnyProfile = Union["Profile", WorkspaceProfile]


def profile_ref(profile: ProfileRef) -> Optional[str]:
    """A profile argument as the loaders take it: a ``Path`` is always a file."""
    if profile is None or isinstance(profile, str):
        return profile
    text = os.fspath(profile)
    return text if "/" in text or text.endswith((".toml", ".json")) else f"./{text}"


def scheduler_for(profile: AnyProfile) -> Union[Scheduler, LocalScheduler]:
    """The scheduler a profile names: the Slurm client, or the local backend's table."""
    if profile.backend == "local":
        from synthbatch.control.backends.local.scheduler import LocalScheduler, Settings

        local = getattr(profile, "local", None)  # None: a read-only command's profile
        settings = None if local is None else Settings(
            gpus_per_node=profile.gpus_per_node,  # type: ignore[union-attr]
            gpus=tuple(local.gpus) if local.gpus is not None else None,
            max_concurrent=local.max_concurrent, kill_wait_s=local.kill_wait_s)
        return LocalScheduler(profile.workspace, settings=settings)
    return Scheduler(slurm_bin=profile.slurm_bin, timeout_s=profile.scheduler_timeout_s)


def _of_run(profile: AnyProfile, layout: RunLayout) -> AnyProfile:
    """``profile`` with the backend the run was submitted to (the profile may have changed
    since), so that its jobs are asked where they are."""
    backend = run_backend(layout)
    if backend is None or backend == profile.backend:
        return profile
    if isinstance(profile, WorkspaceProfile):
        return profile._replace(backend=backend)
    return profile.model_copy(update={"backend": backend})


def _profile(profile: ProfileRef) -> Profile:
    from synthbatch.control.config.profile import load_profile

    return load_profile(profile_ref(profile))[0]


def _workspace(profile: ProfileRef) -> tuple[WorkspaceProfile, Path]:
    prof = load_workspace_profile(profile_ref(profile))
    return prof, Path(prof.workspace)


def _run(run_id: Optional[str], profile: ProfileRef) -> tuple[WorkspaceProfile, RunLayout]:
    prof, workspace = _workspace(profile)
    return prof, run_layout(workspace, run_id or latest_run_id(workspace))


def _existing(workspace: Path, run_id: str) -> Optional[RunLayout]:
    """The layout of a run that exists (None: not submitted, or no longer there)."""
    try:
        return run_layout(workspace, run_id)
    except SynthbatchError:
        return None


def latest_run(profile: ProfileRef = None) -> str:
    """The id of the workspace's latest run (the one committed last); NotFound if none."""
    return latest_run_id(_workspace(profile)[1])


def run_dir(run_id: Optional[str] = None, profile: ProfileRef = None) -> RunLayout:
    """The directory layout of an existing run of the profile's workspace (None: the
    latest run)."""
    return _run(run_id, profile)[1]


def _overrides(partition: Optional[str], account: Optional[str], qos: Optional[str],
               time_limit: Optional[str], reservation: Optional[str],
               gpus: Optional[int] = None, deadline_hours: Optional[float] = None,
               pilot: Optional[str] = None) -> Overrides:
    from synthbatch.control.config.overrides import Overrides

    return Overrides(partition=partition, account=account, qos=qos, time_limit=time_limit,
                     reservation=reservation, gpus=gpus, deadline_hours=deadline_hours,
                     pilot=pilot)


def plan(run_file: PathLike, profile: ProfileRef = None, scheduler: Optional[Scheduler] = None,
         *, partition: Optional[str] = None, account: Optional[str] = None,
         qos: Optional[str] = None, time_limit: Optional[str] = None,
         reservation: Optional[str] = None, gpus: Optional[int] = None,
         deadline_hours: Optional[float] = None, pilot: Optional[str] = None,
         reuse: Sequence[str] = ()) -> PlanResult:
    """Dry run: validate and resolve the run, check what this login node can see (paths,
    programs, images, secrets, the partition's nodes), render the batch script; submit
    nothing. ``partition`` ... ``reservation`` override the profile (``time_limit`` the
    run's too), as ``-p/-A/-q/-t/--reservation`` do; ``gpus`` is the automatic layout's
    budget (``--gpus``, the run's ``resources.gpus``), ``deadline_hours`` and ``pilot`` its
    deadline and measured pilot (``--deadline``, ``--pilot``); ``reuse``: earlier runs
    whose matching columns the summary names, after the run file's ``reuse`` list
    (issue 31)."""
    from synthbatch.control.benchmark.pilot import read_pilot
    from synthbatch.control.runs.plan import dry_run
    from synthbatch.control.runs.reuse import merged, summary_lines

    sched = scheduler or scheduler_for(_profile(profile))
    try:
        size, unavailable = sched.max_array_size(), None
    except SchedulerUnavailable as err:  # plan without the cluster: one array, the whole run
        size, unavailable = None, err
    over = _overrides(partition, account, qos, time_limit, reservation, gpus,
                      deadline_hours, pilot)
    data = dry_run(Path(run_file), profile_ref(profile), size, over, sched, unavailable,
                   read_pilot)
    run_ids = merged(data.pop("reuse", []), reuse)  # the run file's list, then --reuse
    if run_ids:
        from synthbatch.agent_stdlib.contracts import Plan

        lines = summary_lines(Plan.from_dict(data["plan"]),
                              Path(_profile(profile).workspace), run_ids)
        data["summary"] = data["summary"].rstrip("\n") + "\n" + "".join(
            f"{x}\n" for x in lines)
    return PlanResult.from_dict(data)


def preview(run_file: PathLike, profile: ProfileRef = None, count: int = 5,
            endpoints: Sequence[str] = (), api_key_env: Optional[str] = None,
            timeout_s: float = 600.0, models: Sequence[str] = (),
            on_record: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
    """The first ``count`` records of the run's recipe, made here by the agent bundle's
    generator against ``endpoints`` (``ALIAS=URL``; ``models``: ``ALIAS=NAME`` when an
    endpoint serves another model name); nothing is submitted. ``on_record`` is called
    with each record as it is written. Without any profile (no ``--profile``,
    ``$SYNTHBATCH_PROFILE`` or default profile) the run is planned with a stand-in."""
    import tempfile

    from synthbatch.control.runs import preview as room
    from synthbatch.control.runs.submit.flow import agent_bundle

    urls, names = room.parse_endpoints(endpoints), room.parse_models(models)
    with tempfile.TemporaryDirectory(prefix="synthbatch-preview-profile-") as tmp:
        ref = profile_ref(profile)
        if not room.profile_given(ref):  # no profile at all: plan with a stand-in
            ref = str(room.write_standin(Path(tmp)))
        pyz = agent_bundle(_profile(ref))
        return room.run_preview(Path(run_file), ref, count, urls, pyz, api_key_env,
                                timeout_s, names, on_record)


def submit(run_file: PathLike, profile: ProfileRef = None,
           scheduler: Optional[Scheduler] = None, *, partition: Optional[str] = None,
           account: Optional[str] = None, qos: Optional[str] = None,
           time_limit: Optional[str] = None, reservation: Optional[str] = None,
           gpus: Optional[int] = None, deadline_hours: Optional[float] = None,
           pilot: Optional[str] = None, checks: bool = True, run_id: Optional[str] = None,
           shards: Optional[Sequence[ShardSpec]] = None, reuse: Sequence[str] = (),
           merge_to: Optional[PathLike] = None, merge_format: Optional[str] = None,
           allow_partial: bool = False) -> Run:
    """Plan, check, stage, commit and submit a run; return its :class:`Run` handle.

    Refuses (InvalidInput, nothing written) what ``plan``'s checks call an error; their
    warnings are kept in ``run.json`` and on the handle. ``checks=False`` skips the
    login-node checks (submits what Slurm accepts, e.g. for a partition about to grow).
    ``run_id`` and ``shards``: a benchmark case's deterministic id and sized points.
    ``reuse``: earlier runs of the workspace whose LLM cells the run takes (issue 31).
    ``merge_to`` (relative: to the working directory; else the run file's ``[output]``):
    the merge job writes the dataset there once the run is over (issue 34).
    A run Slurm refuses (SchedulerRejected, exit 2) is not kept: no run is left behind.
    """
    from synthbatch.control.benchmark.pilot import read_pilot
    from synthbatch.control.runs.submit.flow import submit_run

    prof = _profile(profile)
    sched = scheduler or scheduler_for(prof)
    over = _overrides(partition, account, qos, time_limit, reservation, gpus,
                      deadline_hours, pilot)
    ref = profile_ref(profile)
    submission = submit_run(Path(run_file), ref, prof, sched, over, checks=checks,
                            run_id=run_id, shards=shards, reuse=reuse, merge_to=merge_to,
                            merge_format=merge_format, allow_partial=allow_partial,
                            read_pilot=read_pilot)
    return Run(submission["run_id"], profile, scheduler, submission=submission)


def status(run_id: Optional[str] = None, profile: ProfileRef = None,
           scheduler: Optional[Scheduler] = None, auto_retry: bool = False) -> RunStatus:
    """The run's (None: the latest run's) state: shards by state, records done, tokens,
    rate, ETA, failures with reasons and logs.

    ``auto_retry`` also submits the next attempt of failed shards below the run's
    ``max_attempts`` (as ``retry --auto``; skipped while another retry holds the lock) and
    adds what it submitted as ``retried``.
    """

    return RunStatus.from_dict(status_refresh(run_id, profile, scheduler, auto_retry).data())


def status_refresh(run_id: Optional[str] = None, profile: ProfileRef = None,
                   scheduler: Optional[Scheduler] = None, auto_retry: bool = False) -> Refresh:
    """``status`` before it is plain data: ``data()`` is what ``status`` returns, and
    ``status --json`` prints ``json_bytes()``, which writes the settled rows as the index
    keeps their text instead of building and encoding them (100,000 rows: ~0.3 s)."""
    from synthbatch.control.runs.observed import observed

    prof, layout = _run(run_id, profile)
    sched = scheduler or scheduler_for(_of_run(prof, layout))

    def retry() -> Any:  # submitting needs the whole profile
        from synthbatch.control.runs.retry import retry_run

        full = _of_run(_profile(profile), layout)
        return retry_run(layout, full, scheduler or scheduler_for(full), auto=True,
                         lock_wait_s=0.0)

    return observed(layout, sched, prof.path, retry if auto_retry else None)


def wait(run_id: Optional[str] = None, profile: ProfileRef = None,
         timeout_s: Optional[float] = None, interval_s: float = 5.0,
         show: Optional[Show] = None, scheduler: Optional[Scheduler] = None) -> RunStatus:
    """Refresh the run's status until it ends, can never end (``watch.stuck``), or
    ``timeout_s`` passes; return the last.

    Each refresh is one ``status`` (backing off from ``interval_s`` to 30 s while nothing
    changes, never stopping on a Slurm outage); ``show`` is called with each refresh's
    data. Whether the run succeeded is the result's ``state`` (``succeeded``); the CLI's
    exit status comes from it (``control.runs.status.watch.outcome``).
    """
    from synthbatch.control.runs.status.watch import Backoff
    from synthbatch.control.runs.status.watch import watch as watch_loop

    prof, layout = _run(run_id, profile)
    sched = scheduler or scheduler_for(_of_run(prof, layout))
    name = layout.root.name
    last = watch_loop(lambda: status_refresh(name, profile, sched).data(),
                      show or (lambda data: None), Backoff(base_s=interval_s),
                      max_s=timeout_s)
    return RunStatus.from_dict(last)


def cancel(run_id: str, shards: Sequence[int] = (), profile: ProfileRef = None,
           scheduler: Optional[Scheduler] = None, wait_s: float = 60.0) -> Dict[str, Any]:
    """scancel the recorded jobs of the run (or of ``shards``); states become cancelled."""
    from synthbatch.control.runs.cancel import cancel_run

    prof, layout = _run(run_id, profile)
    return cancel_run(layout, scheduler or scheduler_for(_of_run(prof, layout)), list(shards),
                      wait_s)


def logs(run_id: Optional[str] = None, shard: Optional[int] = None,
         step: Optional[str] = None, profile: ProfileRef = None) -> Dict[str, Any]:
    """Which log file of the latest execution to show, and the other steps that have one."""
    from synthbatch.control.runs.logs import locate

    _, layout = _run(run_id, profile)
    target = locate(layout, shard, step)
    return {"run_id": layout.root.name, **dataclasses.asdict(target), "path": str(target.path)}


def shard_status(run_id: Optional[str] = None, shard: int = 0, profile: ProfileRef = None,
                 lines: int = 20) -> Dict[str, Any]:
    """One shard as ``status`` sees it, its whole reason, and the last ``lines`` lines of
    the log to read (the one its failure names, else its latest client or Slurm log):
    ``{"run_id", "shard": row, "log": path or None, "max_attempts", "log_tail": [lines],
    "restarts": {"client": 1, "server gen/0": 1}}`` (restarts inside its latest
    allocation)."""
    from synthbatch.control.errors import NotFound
    from synthbatch.control.runs.logs import locate, tail_lines
    from synthbatch.control.runs.telemetry import restart_counts, shard_serving  # issue 32

    data = status(run_id, profile).to_dict()
    rows = data.get("shards", [])
    if not 0 <= shard < len(rows):
        raise NotFound(f"shard {shard}: the run has {len(rows)} shards (0-{len(rows) - 1})")
    row = rows[shard]
    layout = run_dir(data["run_id"], profile)
    log = row.get("log")
    if log is None:
        try:
            log = str(locate(layout, shard).path)
        except NotFound:
            log = None
    return {"run_id": data["run_id"], "shard": row, "log": log,
            "max_attempts": data.get("max_attempts"),  # "attempt 2 of 3" (issue 34)
            "log_tail": tail_lines(Path(log), lines) if log else [],
            "serving": shard_serving(layout, shard, row.get("attempt"), time.time()),
            "restarts": restart_counts(layout, shard, row.get("attempt"))}


def merge(run_id: str, output: Optional[PathLike] = None, allow_partial: bool = False,
          profile: ProfileRef = None, fmt: str = "jsonl", stats: bool = True) -> MergeResult:
    """Verify and concatenate the winners of a run in shard order; return the manifest.
    ``stats=False`` leaves the column statistics out of the dataset card."""
    from synthbatch.control.runs.merge import merge_run

    _, layout = _run(run_id, profile)
    target = Path(output).resolve() if output is not None else None
    return MergeResult.from_dict(merge_run(layout, target, allow_partial, fmt, stats))


def retry(run_id: str, shards: Sequence[int] = (), resume: Optional[str] = None,
          dry_run: bool = False, auto: bool = False, profile: ProfileRef = None,
          scheduler: Optional[Scheduler] = None, lock_wait_s: float = 60.0) -> Dict[str, Any]:
    """Submit attempt N+1 for shards that ended without a winner (or the named ``shards``).

    Reconciles first (the same refresh as ``status``: an attempt whose job is gone from
    Slurm is recorded ``failed``/``cancelled``, a missing winner is completed), then selects
    under the run's retry lock; a named shard that has not ended is refused in the words
    status uses for it. ``auto`` takes only failed shards below the plan's
    ``max_attempts``; ``resume`` overrides the plan's resume policy. Shards whose records
    are damaged are left out and listed as ``skipped``, the others still submitted.
    Returns what was (with ``dry_run``: would be) submitted.
    """
    from synthbatch.control.runs.retry import retry_reconciled

    prof = _profile(profile)
    layout = run_layout(Path(prof.workspace), run_id)
    prof = _of_run(prof, layout)  # type: ignore[assignment]
    return retry_reconciled(layout, prof, scheduler or scheduler_for(prof), shards, resume,
                            dry_run, auto, lock_wait_s)


def runs(profile: ProfileRef = None) -> List[RunSummary]:
    """The runs of the workspace, newest first, from their directories alone (no Slurm):
    state, records done, shards, when submitted, how long they ran."""
    from synthbatch.control.runs.cost import kept_cost  # issue 32: GPU-hours, cost
    from synthbatch.control.runs.status.listing import list_runs

    prof, workspace = _workspace(profile)
    return [RunSummary.from_dict({**r, **kept_cost(run_layout(workspace, r["run_id"]),
                                                   prof.path)})
            for r in list_runs(workspace)]


def run(run_id: Optional[str] = None, profile: ProfileRef = None,
        scheduler: Optional[Scheduler] = None) -> Run:
    """The handle of an existing run (None: the latest run of the workspace)."""
    return Run(_run(run_id, profile)[1].root.name, profile, scheduler)


class Run:
    """A handle on one run, like submitit's job objects: ask it, wait for it, merge it.

    ``api.submit(...)`` returns one; ``api.run(run_id)`` makes one for an existing run.
    Every method reads the run's durable state afresh (and asks Slurm where status does),
    so a handle can be kept, pickled or rebuilt from its ``run_id`` in another process.
    """

    def __init__(self, run_id: str, profile: ProfileRef = None,
                 scheduler: Optional[Scheduler] = None,
                 submission: Optional[Dict[str, Any]] = None) -> None:
        self.run_id = run_id
        self.profile = profile
        self.scheduler = scheduler
        self.submission = dict(submission or {})

    def __repr__(self) -> str:
        return f"Run({self.run_id!r})"

    @property
    def dir(self) -> Path:
        """The run's directory on the shared filesystem."""
        return run_dir(self.run_id, self.profile).root

    @property
    def job_ids(self) -> List[str]:
        """The Slurm job ids submit got (empty for a handle made by ``api.run``)."""
        return list(self.submission.get("job_ids", []))

    @property
    def warnings(self) -> List[str]:
        """What the login-node checks warned about at submit (kept in ``run.json``)."""
        if "warnings" in self.submission:
            return list(self.submission["warnings"])
        from synthbatch.control.runs.store import load_run

        record = load_run(run_dir(self.run_id, self.profile))
        return list(record.warnings) if record is not None else []

    def to_dict(self) -> Dict[str, Any]:
        """What ``submit --json`` prints (``{"run_id": ...}`` for an existing run)."""
        return dict(self.submission) or {"run_id": self.run_id}

    def status(self) -> RunStatus:
        """The run's state now (``api.status``)."""
        return status(self.run_id, self.profile, self.scheduler)

    def wait(self, timeout_s: Optional[float] = None, interval_s: float = 5.0,
             show: Optional[Show] = None) -> RunStatus:
        """Block until the run ends (or ``timeout_s``); the last status (``api.wait``)."""
        return wait(self.run_id, self.profile, timeout_s, interval_s, show, self.scheduler)

    def cancel(self, shards: Sequence[int] = ()) -> Dict[str, Any]:
        """scancel the run, or some of its shards (``api.cancel``)."""
        return cancel(self.run_id, shards, self.profile, self.scheduler)

    def retry(self, shards: Sequence[int] = (), resume: Optional[str] = None,
              dry_run: bool = False) -> Dict[str, Any]:
        """Submit the next attempt of the shards that ended without a winner."""
        return retry(self.run_id, shards, resume, dry_run, profile=self.profile,
                     scheduler=self.scheduler)

    def merge(self, output: Optional[PathLike] = None, allow_partial: bool = False,
              fmt: str = "jsonl", stats: bool = True) -> MergeResult:
        """Verify and concatenate the winners into ``output`` (``api.merge``)."""
        return merge(self.run_id, output, allow_partial, self.profile, fmt, stats)

    def logs(self, shard: Optional[int] = None, step: Optional[str] = None) -> str:
        """The text of a shard's log (as ``synthbatch logs``; the last 64 KiB)."""
        from synthbatch.control.runs.logs import read_tail

        return read_tail(Path(logs(self.run_id, shard, step, self.profile)["path"]))


def benchmark_run(bench_file: PathLike, profile: ProfileRef = None,
                  scheduler: Optional[Scheduler] = None) -> Dict[str, Any]:
    """Compile a benchmark file and submit each case's run that does not exist yet (a case
    already submitted is left alone: resubmitting is idempotent)."""
    from synthbatch.control.benchmark import store
    from synthbatch.control.benchmark.sweep import compile_sweep
    from synthbatch.control.config.benchmark import BenchmarkConfig
    from synthbatch.control.config.loader import load_model, read_document

    bench_file = Path(bench_file)
    config = load_model(bench_file, BenchmarkConfig)
    base_file = (bench_file.resolve().parent / config.run).resolve()
    if not base_file.is_file():
        raise InvalidInput(f"{bench_file}: run: {config.run}: no such file")
    try:
        bench_id, case_runs = compile_sweep(config, read_document(base_file))
    except InvalidInput as err:
        raise InvalidInput(f"{bench_file}: {err.message}") from err
    workspace = _workspace(profile)[1]
    store.save(workspace, store.manifest(bench_id, config, case_runs))
    new = [case for case in case_runs if _existing(workspace, case.run_id) is None]
    from synthbatch.control.benchmark.pilot import read_pilot
    from synthbatch.control.runs.submit.flow import submit_cases

    full = _profile(profile)
    cases = [(c, store.case_file(base_file, c.run_id, c.run)) for c in new]
    submitted = submit_cases(bench_file, cases, profile_ref(profile), full,
                             scheduler or scheduler_for(full),
                             _overrides(None, None, None, None, None), read_pilot)
    return {"benchmark_id": bench_id, "cases": [
        {"case": c.case, "run_id": c.run_id, "submitted": c.run_id in submitted,
         **submitted.get(c.run_id, {})} for c in case_runs]}


def benchmark_analyze(bench_id: str, profile: ProfileRef = None) -> Dict[str, Any]:
    """Every point's figures, the Pareto front and the recommendation, from durable state."""
    from synthbatch.control.benchmark import store
    from synthbatch.control.benchmark.accounting import job_times
    from synthbatch.control.benchmark.analyze import analyze

    prof, workspace = _workspace(profile)
    manifest = store.load(workspace, bench_id)
    layouts = {case["run_id"]: _existing(workspace, case["run_id"]) for case in manifest["cases"]}
    sched = scheduler_for(prof)
    from synthbatch.control.runs.cost import run_price  # issue 32: cost per 1,000

    prices = {run_id: run_price(layout, prof.path)
              for run_id, layout in layouts.items() if layout is not None}
    return analyze(manifest, layouts, lambda ids: job_times(sched, ids), prices)


def benchmark_report(bench_id: str, output: Optional[PathLike] = None,
                     profile: ProfileRef = None) -> Dict[str, Any]:
    """Write the report directory (default ``<workspace>/benchmarks/<id>/report``)."""
    from synthbatch.control.benchmark import report, store

    data = benchmark_analyze(bench_id, profile)
    folder = Path(output) if output is not None else store.bench_dir(
        _workspace(profile)[1], bench_id) / "report"
    return {"benchmark_id": bench_id, "report_dir": str(folder),
            "files": report.write(data, folder), "complete": data["complete"],
            "missing": data["missing"]}


# What the CLI's writing commands use besides the functions above (imported when first
# asked for; the read-only ones are in ``control.readapi``): the CLI imports nothing of
# ``control`` but ``api``, ``readapi`` and ``errors``.
_CLI = "synthbatch.control."
CLI_LAZY = {
    "load_profile": (_CLI + "config.profile", "load_profile"),
    "default_profile_path": (_CLI + "config.profile", "default_profile_path"),
    "Profile": (_CLI + "config.profile", "Profile"),
    "load_model": (_CLI + "config.loader", "load_model"),
    "starter_toml": (_CLI + "config.starter", "starter_toml"),
    "write_starter": (_CLI + "config.starter", "write_starter"),
    "local_starter_toml": (_CLI + "config.starter", "local_starter_toml"),
    "toml_text": (_CLI + "config.tomltext", "toml_text"),
    "detect_gpus": (_CLI + "backends.local.gpus", "detect"),
    "ROUND_JOB_ENV": (_CLI + "backends.local.rounds", "ROUND_JOB_ENV"),
    "check_profile": (_CLI + "runs.doctor", "check_profile"),
    "autoround": (_CLI + "runs.autoround", ""),
    "due_locally": (_CLI + "runs.autoretry", "due_locally"),
    "image_registry": (_CLI + "images.registry", ""),
    "inspect_image": (_CLI + "images.inspect", "inspect_image"),
    "locate_agent_bundle": (_CLI + "bundle", "locate_agent_bundle"),
    "BundleError": (_CLI + "bundle", "BundleError"),
}


def __getattr__(name: str) -> Any:
    from synthbatch.control.readapi import lazy

    return lazy(CLI_LAZY, name, __name__)
