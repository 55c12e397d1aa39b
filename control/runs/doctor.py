"""``synthbatch profile validate``: does this profile match the cluster it names?

Each check returns ``ok``, ``warn`` or ``fail`` with what was found. What ``plan`` also
checks is not decided here: the controller python (``checks.check_controller_python``) and
the profile's own request against the cluster, its partition, time limit, account, QOS,
reservation and node features (``fit.check_request`` for one node with
``gpus_per_node`` GPUs and the profile's defaults) come from the functions ``plan`` runs,
their levels mapped by ``STATUS``: the two commands agree. Slurm commands go through the
one runner (``control.slurm.runner``); ``runner`` and ``which`` are injected so tests can
play a cluster.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from synthbatch.control.config.profile import Profile
from synthbatch.control.errors import SchedulerUnavailable, SynthbatchError
from synthbatch.control.planning.planner import profile_resources
from synthbatch.control.runs.checks import (
    ERROR,
    NODE,
    OK,
    SHARED_FS,
    WARNING,
    Finding,
    Sight,
    check_controller_python,
    check_ports,
    fs_type,
)
from synthbatch.control.runs.fit import Origins, check_request
from synthbatch.control.slurm.runner import Runner, binary, run_command
from synthbatch.control.slurm.scheduler import Scheduler

BINARIES = ("sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo", "srun")
Which = Callable[[str], Optional[str]]
# A finding's level (``control.runs.checks``) as ``validate`` says it.
STATUS = {ERROR: "fail", WARNING: "warn", NODE: "warn", OK: "ok"}


@dataclass(frozen=True)
class Check:
    """One finding: ``status`` is ``ok``, ``warn`` or ``fail``.

    ``unreachable`` is the error of a check that could not reach Slurm at all (validate
    then exits 5, like every command that needs an unreachable scheduler).
    """

    name: str
    status: str
    detail: str
    unreachable: Optional[SchedulerUnavailable] = field(default=None, compare=False,
                                                        repr=False)

    def to_dict(self) -> Dict[str, str]:
        """Plain data for ``--json``."""
        return {"name": self.name, "status": self.status, "detail": self.detail}


def check_workspace(workspace: Path, mounts_file: Path = Path("/proc/mounts"),
                    shared: bool = True) -> Check:
    """Writable, 0700 run directories possible, and (``shared``) on a shared filesystem."""
    if not workspace.exists():
        parent = next((p for p in workspace.parents if p.exists()), Path("/"))
        if os.access(parent, os.W_OK | os.X_OK):
            return Check("workspace", "warn", f"{workspace} does not exist yet; submit will "
                                              f"create it under {parent}")
        return Check("workspace", "fail", f"{workspace} does not exist and {parent} is not "
                                          f"writable")
    if not workspace.is_dir() or not os.access(workspace, os.W_OK | os.X_OK):
        return Check("workspace", "fail", f"{workspace} is not a writable directory")
    try:
        probe = Path(tempfile.mkdtemp(prefix=".synthbatch-probe-", dir=workspace))
        mode = probe.stat().st_mode & 0o777
        probe.rmdir()
    except OSError as err:
        return Check("workspace", "fail", f"{workspace}: cannot create a directory "
                                          f"({err.strerror})")
    if mode != 0o700:
        return Check("workspace", "fail", f"{workspace}: new directories get mode "
                                          f"{mode:o}, not 700")
    fs = fs_type(workspace, mounts_file)
    if not shared:
        return Check("workspace", "ok", f"{workspace}: writable, 0700 run dirs ({fs or 'unknown'}"
                                        f"; the local backend needs no shared filesystem)")
    if fs in SHARED_FS:
        return Check("workspace", "ok", f"{workspace}: writable, 0700 run dirs, shared ({fs})")
    return Check("workspace", "warn", f"{workspace}: writable, 0700 run dirs, but on a "
                                      f"{fs or 'unknown'} filesystem: compute nodes must see "
                                      f"the same path")


def check_binaries(profile: Profile, which: Which = shutil.which) -> Check:
    """Every Slurm command synthbatch uses is there."""
    missing = [name for name in BINARIES
               if not (os.access(binary(name, profile.slurm_bin), os.X_OK)
                       if profile.slurm_bin else which(name))]
    where = profile.slurm_bin or "PATH"
    if missing:
        return Check("slurm", "fail", f"not found in {where}: {', '.join(missing)}")
    return Check("slurm", "ok", f"{', '.join(BINARIES)} found in {where}")


def _run(runner: Runner, argv: Sequence[str], timeout: float) -> Tuple[bool, str]:
    try:
        result = runner(argv, timeout)
    except SynthbatchError as err:
        return False, err.message
    if result.returncode != 0:
        return False, result.error_line()
    return True, result.stdout


def _scheduler(profile: Profile, runner: Runner) -> Scheduler:
    return Scheduler(slurm_bin=profile.slurm_bin, timeout_s=profile.scheduler_timeout_s,
                     runner=runner)


def profile_origins() -> Origins:
    """The profile's fields, named as ``validate`` names its checks."""
    return Origins(partition="partition", account="account", qos="qos",
                   reservation="reservation", constraint="sbatch_options.constraint",
                   time_limit="default_time_limit", cpus="cpus_per_task", mem_mb="mem_mb",
                   gpus="gpus_per_node", nodes="partition")


def as_checks(findings: Sequence[Finding]) -> List[Check]:
    """``plan``'s findings as ``validate``'s checks (``STATUS`` maps the levels)."""
    return [Check(f.field, STATUS[f.level], f.message) for f in findings]


def check_cluster(profile: Profile, runner: Runner = run_command,
                  user: Optional[str] = None) -> List[Check]:
    """The profile's own request (one node, ``gpus_per_node`` GPUs, its default time limit,
    CPUs, memory, account, QOS, reservation, constraint) against the cluster: the checks
    ``plan`` runs on every run (``fit.check_request``)."""
    scheduler = _scheduler(profile, runner)
    try:
        scheduler.partitions()  # Slurm answers at all? (else validate exits 5)
    except SchedulerUnavailable as err:
        return [Check("partition", "fail", err.message, unreachable=err)]
    request = profile_resources(profile, profile.gpus_per_node)
    return as_checks(check_request(request, scheduler, profile_origins(), user=user))


def check_arrays(profile: Profile, runner: Runner = run_command) -> Check:
    """``MaxArraySize``: runs with more shards are split into several arrays."""
    try:
        size = _scheduler(profile, runner).max_array_size()
    except SchedulerUnavailable as err:
        return Check("arrays", "warn", f"MaxArraySize unknown ({err.message})")
    if size is None:
        return Check("arrays", "warn", "MaxArraySize unknown (absent)")
    return Check("arrays", "ok", f"MaxArraySize {size}: up to {size} shards per array")


def check_python(profile: Profile, runner: Runner = run_command) -> Check:
    """The controller Python (``checks.check_controller_python``, as ``plan`` checks it),
    and how to check it on a compute node."""
    how = (f"check on a compute node: srun{' -p ' + profile.partition if profile.partition else ''}"
           f" -N1 -n1 -t 1 {profile.python} -c 'import sys; print(sys.version)'")
    if profile.backend == "local":
        how = "the local backend runs it on this machine"
    found = check_controller_python("python", profile.python, Sight(Path(profile.workspace)),
                                    runner)
    return Check("python", STATUS[found.level], f"{found.message}; {how}")


def check_container(profile: Profile, runner: Runner = run_command,
                    which: Which = shutil.which) -> Check:
    """The container runtime is usable from here (pyxis: srun knows --container-image)."""
    runtime = profile.container.runtime
    if runtime == "none":
        return Check("container", "ok", "no container runtime (steps run on the host)")
    if runtime == "pyxis":
        ok, out = _run(runner, [binary("srun", profile.slurm_bin), "--help"], 10.0)
        if ok and "--container-image" in out:
            return Check("container", "ok", "pyxis: srun knows --container-image")
        return Check("container", "fail", "pyxis: srun does not know --container-image "
                                          "(plugin not loaded?)")
    exe = profile.container.executable or {"apptainer": "apptainer",
                                           "charliecloud": "ch-run"}[runtime]
    ok, out = _run(runner, [exe, "--version"], 10.0)
    if ok:
        return Check("container", "ok", f"{runtime}: {exe} {out.strip()}")
    return Check("container", "warn", f"{runtime}: {exe} does not run here ({out}); it must "
                                      f"on compute nodes")


def check_secrets(profile: Profile, env: Optional[Dict[str, str]] = None) -> Check:
    """Which secret variables are set in this shell (names only, never values)."""
    env = dict(os.environ) if env is None else env
    if not profile.secrets:
        return Check("secrets", "ok", "no secrets declared")
    missing = [name for name in profile.secrets if not env.get(name)]
    if missing:
        return Check("secrets", "warn", f"not set in this shell: {', '.join(missing)} (submit "
                                        f"passes the job its environment)")
    return Check("secrets", "ok", f"set: {', '.join(profile.secrets)}")


def check_local_gpus(profile: Profile, runner: Runner = run_command) -> Check:
    """The local backend: the GPUs shards get (nvidia-smi -L, or the profile's indices)."""
    from synthbatch.control.backends.local.gpus import detect, gpu_pool

    detected = detect(runner)
    try:
        pool = gpu_pool(profile.local.gpus, profile.gpus_per_node, detected)
    except ValueError as err:
        return Check("gpus", "fail", str(err))
    source = "nvidia-smi -L" if detected is not None and profile.local.gpus is None else \
        "local.gpus" if profile.local.gpus is not None else "no nvidia-smi: gpus_per_node"
    detail = f"{', '.join(pool) or 'none'} ({source})"
    if profile.gpus_per_node > len(pool):
        return Check("gpus", "fail", f"gpus_per_node = {profile.gpus_per_node}, but this "
                                     f"machine has {len(pool)} GPU(s): {detail}")
    if profile.local.max_concurrent:
        limit = f"at most {profile.local.max_concurrent} shard(s) at once"
    elif pool:
        limit = "as many shards at once as their GPUs fit (1 at a time without GPUs)"
    else:
        limit = "1 shard at a time"
    return Check("gpus", "ok", f"{detail}; {limit}")


def check_profile(profile: Profile, runner: Optional[Runner] = None,
                  which: Optional[Which] = None) -> List[Check]:
    """Every check, in the order a user fixes them."""
    runner = runner or run_command
    which = which or shutil.which
    ports = as_checks([check_ports("port_base", profile.port_base, 1,
                                   "exclusive" in profile.sbatch_options)])
    if profile.backend == "local":  # no Slurm to ask
        checks = [check_workspace(Path(profile.workspace), shared=False),
                  Check("backend", "ok", "local: no Slurm needed; shards run on this machine"),
                  check_local_gpus(profile, runner)]
    else:
        checks = [check_workspace(Path(profile.workspace)), check_binaries(profile, which),
                  *check_cluster(profile, runner), check_arrays(profile, runner)]
    return checks + [check_python(profile, runner), check_container(profile, runner, which),
                     check_secrets(profile), *ports]
