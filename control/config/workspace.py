"""The profile as the run-reading commands need it, without pydantic.

``status``, ``runs``, ``logs``, ``cancel`` and ``merge`` use four fields of the profile:
``backend``, ``workspace``, ``slurm_bin`` and ``scheduler_timeout_s``. Importing pydantic and
building the profile models costs ~70 ms, most of what a ``status`` process spends outside its
run's records, so these commands read the file here: the fields they use are checked with
the same rules and messages as ``control.config.profile.Profile`` (one line naming the file
and the field), ``schema_version``/``backend`` are checked, and an unknown top-level key is
rejected. The other fields are not validated here; ``profile validate``, ``plan``,
``submit`` and ``retry`` validate the whole profile.

The single source of truth stays ``Profile``: its field names must equal ``FIELDS`` and
its defaults and bounds are the constants below (asserted in
tests/unit/control/config/test_workspace.py).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from stat import S_ISDIR, S_ISVTX
from typing import Any, Dict, NamedTuple, Optional

from synthbatch.control.config.document import read_document
from synthbatch.control.config.rules import check_safe_path, check_version, unknown_field
from synthbatch.control.errors import InvalidInput, NotFound
from synthbatch.control.secrets import redact

# Every top-level field of Profile, in its order (tests assert they agree).
FIELDS = ("schema_version", "backend", "workspace", "partition", "account", "qos",
          "reservation", "default_time_limit", "gpus_per_node", "gpu_memory_gb",
          "gpu_request", "cpus_per_task",
          "mem_mb", "cpus_per_gpu", "mem_per_gpu_mb", "container", "python", "slurm_bin",
          "env_allow", "secrets", "port_base", "array_throttle", "signal_lead_s", "grace_s",
          "scheduler_timeout_s", "sbatch_options", "local", "pricing")
BACKENDS = ("slurm", "local")
SCHEDULER_TIMEOUT_S = 30.0  # default; Profile.scheduler_timeout_s uses these three
MAX_SCHEDULER_TIMEOUT_S = 600.0

PROFILE_DIR = Path("~/.config/synthbatch/profiles")
PROFILE_ENV = "SYNTHBATCH_PROFILE"  # the default profile, by name or path


class WorkspaceProfile(NamedTuple):
    """Where runs live and how Slurm is called: what the run-reading commands need.

    A second profile model on purpose: the read-only commands start without pydantic
    (importing it and ``Profile`` costs ~250 ms, this module ~40 ms). ``Profile`` stays
    the definition; the tests named in the module docstring hold the two together.
    """

    path: Path
    workspace: str
    slurm_bin: Optional[str]
    scheduler_timeout_s: float
    backend: str = BACKENDS[0]


def default_profile_path(name: str = "default") -> Path:
    """``~/.config/synthbatch/profiles/<name>.toml``."""
    return PROFILE_DIR.expanduser() / f"{name}.toml"


def resolve_profile_path(name_or_path: Optional[str]) -> Path:
    """``--profile`` (name or path) -> ``SYNTHBATCH_PROFILE`` -> ``default.toml``."""
    choice = name_or_path or os.environ.get(PROFILE_ENV) or "default"
    if "/" in choice or choice.endswith((".toml", ".json")):
        path = Path(choice).expanduser()
    else:
        path = default_profile_path(choice)
    if not path.is_file():
        raise NotFound(f"profile {path}: no such file",
                       hint="pass --profile PATH, set SYNTHBATCH_PROFILE, or run "
                            "'synthbatch profile init'")
    return path


class _Bad(ValueError):
    """A field's value is not valid: ``field`` and the model's message for it."""

    def __init__(self, field: str, message: str, value: Any = None) -> None:
        super().__init__(message)
        self.field, self.message, self.value = field, message, value


def _string(data: Dict[str, Any], name: str, required: bool) -> Optional[str]:
    if name not in data:
        if required:
            raise _Bad(name, "Field required")
        return None
    value = data[name]
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise _Bad(name, "Input should be a valid string", value)
    try:
        return check_safe_path(value)
    except ValueError as err:
        raise _Bad(name, str(err), value) from None


def _timeout(data: Dict[str, Any]) -> float:
    value = data.get("scheduler_timeout_s", SCHEDULER_TIMEOUT_S)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _Bad("scheduler_timeout_s", "Input should be a valid number", value)
    if math.isnan(value) or value > MAX_SCHEDULER_TIMEOUT_S:
        raise _Bad("scheduler_timeout_s",
                   f"Input should be less than or equal to {MAX_SCHEDULER_TIMEOUT_S:g}", value)
    if value <= 0:
        raise _Bad("scheduler_timeout_s", "Input should be greater than 0", value)
    return float(value)


def _check(data: Dict[str, Any], path: Path) -> WorkspaceProfile:
    version = data.get("schema_version")
    if "schema_version" not in data:
        raise _Bad("schema_version", "Field required")
    try:
        check_version(version)
    except ValueError as err:
        raise _Bad("schema_version", str(err), version) from None
    backend = data.get("backend", BACKENDS[0])
    if backend not in BACKENDS or not isinstance(backend, str):
        raise _Bad("backend", "Input should be " + " or ".join(repr(b) for b in BACKENDS),
                   backend)
    workspace = _string(data, "workspace", required=True)
    slurm_bin = _string(data, "slurm_bin", required=False)
    timeout = _timeout(data)
    for key, value in data.items():
        if key not in FIELDS:
            raise _Bad(key, unknown_field(key, FIELDS), value)
    return WorkspaceProfile(path, str(workspace), slurm_bin, timeout, backend)


def workspace_problem(workspace: Path) -> Optional[str]:
    """Why ``workspace`` is not safe to keep runs in, with the fix; None when it is.

    The one home of the rule (both profile loaders apply it, so every command refuses
    such a workspace before it reads or writes under it): the workspace root, when it
    exists, is a directory of this user that neither group nor others can write, and no
    existing directory above it is world-writable without the sticky bit (anyone could
    rename the workspace away and put their own in its place). A sticky directory such as
    ``/tmp`` (mode 1777) is accepted above the workspace: others cannot rename or remove
    what is ours in it; so is a group-writable one (a project directory, often 2770): its
    group is trusted with what is in it. The root itself must not rely on the sticky bit:
    others could still create runs and records in it.
    """
    try:
        real = workspace.resolve()
    except (OSError, RuntimeError) as err:
        return f"workspace {workspace}: cannot resolve ({err})"
    if real.exists():
        info = real.stat()
        if not S_ISDIR(info.st_mode):
            return f"workspace {workspace}: not a directory"
        if info.st_uid != os.geteuid():
            return (f"workspace {workspace}: owned by uid {info.st_uid}, not by you "
                    f"(uid {os.geteuid()}); use a directory of your own")
        if info.st_mode & 0o022:
            who = "group- and world" if info.st_mode & 0o022 == 0o022 else \
                "group" if info.st_mode & 0o020 else "world"
            return (f"workspace {workspace}: {who}-writable (mode {info.st_mode & 0o7777:o}); "
                    f"other users could plant or replace runs; fix: chmod go-w {real}")
    for parent in real.parents:
        try:
            mode = parent.stat().st_mode
        except OSError:
            continue  # not there yet: submit creates it 0700
        if mode & 0o002 and not mode & S_ISVTX:
            return (f"workspace {workspace}: {parent} above it is world-writable without "
                    f"the sticky bit (mode {mode & 0o7777:o}): anyone could replace the "
                    f"workspace; fix: chmod o-w {parent}, or choose a workspace elsewhere")
    return None


def check_workspace_root(workspace: str, profile: Path) -> None:
    """InvalidInput (one line naming the profile, the path and the fix) when the workspace
    is not safe (:func:`workspace_problem`)."""
    problem = workspace_problem(Path(workspace))
    if problem:
        raise InvalidInput(f"{profile}: {problem}")


def load_workspace_profile(name_or_path: Optional[str]) -> WorkspaceProfile:
    """Find the profile and read the fields the run-reading commands use.

    InvalidInput is one line naming the file and the field, worded as ``load_profile``
    words it (secret-looking values redacted the same way).
    """
    path = resolve_profile_path(name_or_path)
    try:
        profile = _check(read_document(path), path)
    except _Bad as bad:
        message = redact(bad.message, bad.value, bad.field)
        raise InvalidInput(f"{path}: " + redact(f"{bad.field}: {message}")) from None
    check_workspace_root(profile.workspace, path)
    return profile
