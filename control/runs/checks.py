"""Login-node checks of a resolved run: the mistakes ``plan`` can see before the queue.

A missing model, serving environment or image otherwise fails preflight on the compute
node, after the queue wait. Each finding has a level:

* ``error``: ``plan`` exits 2 and ``submit`` refuses;
* ``warning``: shown by ``plan`` and ``submit``, and kept in ``run.json``;
* ``node``: this login node cannot tell; preflight checks it on the compute node, before
  any server starts;
* ``ok``: checked here.

A path that is missing here is an error only where the compute nodes would miss it too:
when the nearest directory above it that exists is on the workspace's filesystem (which
the profile says the nodes share) or on a network filesystem; otherwise (``/scratch`` that
only nodes have) it is ``node``. Whether the request fits the partition is
``control.runs.fit``.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

from synthbatch.agent_stdlib.contracts import DIST_PORTS, MIN_PYTHON, ContainerSpec, Plan, port_span
from synthbatch.control.errors import SynthbatchError
from synthbatch.control.slurm.renderer import PATH_DIRS
from synthbatch.control.slurm.runner import Runner, run_command

ERROR, WARNING, NODE, OK = "error", "warning", "node", "ok"
LEVELS = (ERROR, WARNING, NODE, OK)
# What only the compute node can say, whatever the run: shown under every plan.
NODE_ONLY = ("the GPUs the job is given, free ports, node-local paths, the servers' "
             "start-up and readiness")
# The module a serving environment's python must have, per engine.
ENGINE_MODULE = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "xllamacpp"}
HUB_ENGINES = ("vllm", "sglang")  # engines that load a hub id themselves
HF_TRUE = ("1", "true", "yes", "on")
MODULE_CHECK_S = 30.0
SHARED_FS = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "glusterfs",
             "fuse.glusterfs", "wekafs", "pvfs2", "orangefs", "panfs", "fuse.sshfs", "virtiofs")
# The kernel's ephemeral (outgoing) port range, and Linux's default when unreadable.
EPHEMERAL_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
EPHEMERAL_DEFAULT = (32768, 60999)


def fs_type(path: Path, mounts_file: Path = Path("/proc/mounts")) -> Optional[str]:
    """The filesystem type of the mount holding ``path`` (Linux), or None."""
    try:
        lines = mounts_file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    best: Tuple[int, Optional[str]] = (-1, None)
    target = str(path.resolve())
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (target == point or target.startswith(point.rstrip("/") + "/")) and \
                len(point) > best[0]:
            best = (len(point), fields[2])
    return best[1]


@dataclass(frozen=True)
class Finding:
    """One check's result: ``field`` names where the value came from."""

    level: str
    field: str
    message: str

    def to_dict(self) -> Dict[str, str]:
        """Plain data for ``--json``."""
        return {"level": self.level, "field": self.field, "message": self.message}

    def line(self) -> str:
        """``field: message``."""
        return f"{self.field}: {self.message}"


def errors(findings: Sequence[Finding]) -> List[Finding]:
    """The findings that stop a submit."""
    return [f for f in findings if f.level == ERROR]


def warnings(findings: Sequence[Finding]) -> List[Finding]:
    """The findings kept in ``run.json``."""
    return [f for f in findings if f.level == WARNING]


@dataclass
class Sight:
    """What this login node can see: a missing path on a shared filesystem is missing on
    the compute nodes too."""

    workspace: Path
    mounts_file: Path = Path("/proc/mounts")
    _devices: Optional[Set[int]] = field(default=None, repr=False)

    def shared(self, path: Path) -> bool:
        """True when the nearest existing directory above ``path`` is shared with the
        compute nodes (the workspace's filesystem, or a network filesystem)."""
        if self._devices is None:
            self._devices = {os.stat(_existing(self.workspace)).st_dev}
        above = _existing(path)
        return os.stat(above).st_dev in self._devices or \
            fs_type(above, self.mounts_file) in SHARED_FS


def _existing(path: Path) -> Path:
    return next((p for p in (path, *path.parents) if p.exists()), Path("/"))


def check_path(where: str, path: str, what: str, sight: Sight, executable: bool = False,
               directory: Optional[bool] = None) -> Finding:
    """A file (``executable``: one that can run) or directory the nodes will use."""
    target = Path(path)
    if not target.exists():
        if sight.shared(target):
            return Finding(ERROR, where, f"{what} {path} does not exist (its parent "
                                         f"{_existing(target)} is on the shared filesystem: "
                                         f"the compute nodes will not find it either)")
        return Finding(NODE, where, f"{what} {path} is not visible on this login node "
                                    f"(not on a shared filesystem): checked on the compute "
                                    f"node")
    if directory is True and not target.is_dir():
        return Finding(ERROR, where, f"{what} {path} is not a directory")
    if directory is False and target.is_dir():
        return Finding(ERROR, where, f"{what} {path} is a directory, not a file")
    mode = os.X_OK if executable else os.R_OK
    if not os.access(target, mode):
        return Finding(ERROR, where, f"{what} {path} is not "
                                     f"{'executable' if executable else 'readable'} here")
    return Finding(OK, where, f"{what} {path} found")


def check_controller_python(where: str, python: str, sight: Sight,
                            runner: Runner = run_command) -> Finding:
    """The profile's python, which runs the agent: there, executable, and Python 3.9+ where
    it runs on this node (one that does not run here is left to the node)."""
    found = check_path(where, python, "controller python", sight, executable=True)
    if found.level != OK:
        return found
    code = "import sys; print('%d.%d.%d' % sys.version_info[:3])"
    try:
        result = runner([python, "-c", code], 10.0)
    except SynthbatchError as err:
        return Finding(NODE, where, f"{python} does not run on this node ({err.message}): "
                                    f"checked on the compute node")
    version = result.stdout.strip()
    match = re.match(r"(\d+)\.(\d+)", version) if result.returncode == 0 else None
    if match is None:
        why = result.error_line() if result.returncode else f"printed {version[:40]!r}"
        return Finding(NODE, where, f"{python} does not run on this node ({why}): checked on "
                                    f"the compute node")
    needs = ".".join(map(str, MIN_PYTHON))
    if (int(match.group(1)), int(match.group(2))) < MIN_PYTHON:
        return Finding(ERROR, where, f"{python} is Python {version} here (needs {needs}+)")
    return Finding(OK, where, f"{python} is Python {version} here (needs {needs}+)")


def ephemeral_range(path: Path = EPHEMERAL_FILE) -> Tuple[Tuple[int, int], str]:
    """The kernel's ephemeral port range and where it came from (``path``, else Linux's
    default)."""
    try:
        low, high = (int(v) for v in path.read_text(encoding="ascii").split())
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT, "the Linux default"
    return (low, high), str(path)


def port_offsets(plan: Plan) -> int:
    """How many ports above ``port_base`` an allocation of ``plan`` uses (server ports,
    then each replica across nodes' rank ports)."""
    base, top = plan.runtime.port_base, 0
    for dep in plan.deployments:
        for spec in dep.placement:
            top = max(top, spec.port - base + 1,
                      spec.dist_port - base + DIST_PORTS if spec.dist_port else 0)
        top = max(top, dep.replicas)
    return max(top, 1)


def check_ports(where: str, base: int, offsets: int, exclusive: bool,
                range_file: Path = EPHEMERAL_FILE) -> Finding:
    """The servers' ports stay out of the kernel's ephemeral range: a port there can be
    taken by any outgoing connection after preflight found it free."""
    low, high = port_span(base, offsets, exclusive)
    (e_low, e_high), source = ephemeral_range(range_file)
    span = f"ports {low}-{high}" if high > low else f"port {low}"
    if high < e_low or low > e_high:
        return Finding(OK, where, f"{base}: servers listen on {span}, outside the ephemeral "
                                  f"port range {e_low}-{e_high} ({source})")
    below = e_low - 1 - (high - low)
    hint = f" (port_base {below} or lower keeps them below it)" if below >= 1024 else ""
    return Finding(WARNING, where, f"{base}: servers may listen on {span}, inside the "
                                   f"kernel's ephemeral port range {e_low}-{e_high} "
                                   f"({source}): an outgoing connection can take a port "
                                   f"after preflight found it free (\"Address already in "
                                   f"use\"){hint}")


def check_on_path(where: str, name: str, what: str, path_dirs: Sequence[str]) -> Finding:
    """A bare command name: it runs from the batch script's fixed PATH on the node."""
    found = shutil.which(name, path=os.pathsep.join(path_dirs))
    if found:
        return Finding(OK, where, f"{what} {name!r} is {found} here")
    return Finding(NODE, where, f"{what} {name!r} is not on the job's PATH on this node "
                                f"({':'.join(path_dirs)}); it must be on the compute node's")


def check_module(where: str, python: str, module: str, runner: Runner) -> Finding:
    """Whether a serving environment's python can import the engine's module (without
    importing it: ``importlib.util.find_spec``)."""
    code = f"import importlib.util,sys; sys.exit(0 if importlib.util.find_spec({module!r}) " \
           f"else 3)"
    try:
        result = runner([python, "-c", code], MODULE_CHECK_S)
    except SynthbatchError as err:
        return Finding(NODE, where, f"{python} did not answer here ({err.message}): checked "
                                    f"on the compute node")
    if result.returncode == 0:
        return Finding(OK, where, f"{python} has the {module} module")
    if result.returncode == 3:
        return Finding(ERROR, where, f"{python} has no {module} module: not a serving "
                                     f"environment for this engine")
    return Finding(NODE, where, f"{python} does not run on this login node "
                                f"({result.error_line() or f'exit {result.returncode}'}): "
                                f"checked on the compute node")


def _command(where: str, argv: Sequence[str], sight: Sight,
             path_dirs: Sequence[str]) -> List[Finding]:
    """A command's program (and the script a python runs)."""
    if not argv:
        return []
    program = argv[0]
    found = [check_path(f"{where}[0]", program, "program", sight, executable=True)
             if program.startswith("/") else
             check_on_path(f"{where}[0]", program, "program", path_dirs)]
    script = argv[1] if len(argv) > 1 else ""
    if os.path.basename(program).startswith("python") and script.startswith("/"):
        found.append(check_path(f"{where}[1]", script, "script", sight))
    return found


def _image(where: str, container: Optional[ContainerSpec], sight: Sight) -> List[Finding]:
    if container is None:
        return []
    return [check_path(where, container.path, f"image {container.image!r}", sight,
                       directory=None)]


def hub_cache(env: Mapping[str, str]) -> Path:
    """Where the Hugging Face hub keeps models for an environment."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    home = env.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def check_hub_model(where: str, model: str, env: Mapping[str, str], sight: Sight) -> Finding:
    """A hub id: in the cache the nodes use, or downloaded there (which needs internet)."""
    cache = hub_cache(env)
    offline = env.get("HF_HUB_OFFLINE", "").lower() in HF_TRUE
    entry = cache / ("models--" + model.replace("/", "--"))
    if (entry / "snapshots").is_dir():
        return Finding(OK, where, f"hub model {model} is in the Hugging Face cache {cache}")
    if offline and sight.shared(cache):
        return Finding(ERROR, where, f"hub model {model} is not in the Hugging Face cache "
                                     f"{cache} and HF_HUB_OFFLINE is set: the engine cannot "
                                     f"download it (download it first, e.g. `hf download "
                                     f"{model}` with HF_HOME set, or give a local path)")
    if offline:
        return Finding(NODE, where, f"hub model {model}: the cache {cache} is not visible "
                                    f"here; with HF_HUB_OFFLINE it must be there on the "
                                    f"compute node")
    return Finding(NODE, where, f"hub model {model} is not in the cache {cache}: the engine "
                                f"downloads it on the compute node (that needs internet "
                                f"there; nodes without it need HF_HUB_OFFLINE=1 and the "
                                f"model in HF_HOME)")


def check_secrets(plan: Plan, environ: Mapping[str, str], run: str = "run") -> List[Finding]:
    """Every secret the run refers to is set in this shell (the job inherits its
    environment at submit); names only, never values."""
    found = []
    owners = [(f"{run}: deployments[{i}].env", d.secret_env)
              for i, d in enumerate(plan.deployments)]
    if plan.client_command is not None:
        owners.append((f"{run}: client.env", plan.client_command.secret_env))
    for where, secret_env in owners:
        for var, name in sorted(secret_env.items()):
            if environ.get(name):
                found.append(Finding(OK, f"{where}.{var}", f"secret {name} is set"))
            else:
                found.append(Finding(ERROR, f"{where}.{var}", f"secret {name} is not set in "
                                                              f"this shell (the job inherits "
                                                              f"the environment of submit)"))
    return found


@dataclass(frozen=True)
class DeploymentInputs:
    """What the run file said of one deployment (the plan holds the resolved argv)."""

    engine: str
    python: Optional[str]  # the serving environment's interpreter, resolved
    executable: Optional[str]


def check_plan_paths(plan: Plan, inputs: Sequence[DeploymentInputs], sight: Sight,
                     environ: Mapping[str, str], runner: Runner = run_command,
                     files: Tuple[str, str] = ("run", "profile"),
                     path_dirs: Sequence[str] = PATH_DIRS) -> List[Finding]:
    """Every path the plan names that this node can see, and the secrets it needs.

    ``files`` are the run file's and the profile's names, which every field is named by.
    """
    run, profile = files
    found = [check_controller_python(f"{profile}: python", plan.runtime.python, sight,
                                     runner)]
    for index, (dep, given) in enumerate(zip(plan.deployments, inputs)):
        where = f"{run}: deployments[{index}]"
        found += _image(f"{where}.image", dep.container, sight)
        env = {**{k: environ[k] for k in plan.runtime.env_allow if k in environ}, **dep.env}
        if dep.model.startswith("/"):
            found.append(check_path(f"{where}.model", dep.model, "model", sight))
        elif given.engine in HUB_ENGINES:  # the openai engine's command owns its model
            found.append(check_hub_model(f"{where}.model", dep.model, env, sight))
        if dep.container is not None:
            continue  # programs inside an image are the image's business
        if given.python:
            found.append(check_path(f"{where}.python", given.python, "serving python",
                                    sight, executable=True))
            if found[-1].level == OK and given.engine in ENGINE_MODULE:
                found.append(check_module(f"{where}.python", given.python,
                                          ENGINE_MODULE[given.engine], runner))
        elif given.executable:
            found.append(check_path(f"{where}.executable", given.executable, "executable",
                                    sight, executable=True))
        elif given.engine in ENGINE_MODULE and dep.command:
            found.append(check_on_path(f"{where}.executable", dep.command[0],
                                       f"engine {given.engine}'s default program", path_dirs))
        else:
            found += _command(f"{where}.command", dep.command, sight, path_dirs)
    seed = plan.client.seed_data if plan.client is not None else None
    if seed is not None:  # one that exists here was read through by ``resolve``
        found.append(check_path(f"{run}: client.seed_data.path", seed.path, "seed file",
                                sight, directory=False))
    command = plan.client_command
    if command is not None:
        found += _image(f"{run}: client.image", command.container, sight)
        if command.container is None:
            found += _command(f"{run}: client.command", command.argv, sight, path_dirs)
    return found + check_secrets(plan, environ, run)

