"""What is inside an image, found by running it here with the profile's runtime.

``image add`` calls :func:`inspect_image` once the digest is pinned. When the runtime can
run the image on this machine (charliecloud's ``ch-run``, ``apptainer exec``; pyxis runs
images only as srun steps) it runs, inside the image and with the runtime's flags from
:func:`agent_stdlib.containers.wrap` (so the environment is as clean as a step's):

1. ``python3 -I -c <probe.py> MOUNT_POINT...``: the image's Python (version, executable),
   whether ``vllm``, ``sglang``, ``data_designer`` (import specs, package versions) and
   ``llama-server`` (on PATH, ``--version``) are there, and which of the directories a
   step is bound onto exist (charliecloud binds only onto existing ones);
2. ``llama-server --version`` directly when the image has no ``python3``;
3. the agent bundle's import check (:func:`control.bundle.check_agent_bundle`) with the
   image's ``python3``, the extracted bundle bound at ``/synthbatch/scratch``: whether the
   agent can run in this image at all.

The record is plain JSON kept in the registry entry and shown by ``image info``; an image
that cannot be inspected here gets ``{"ran": false, "reason": ...}``.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from synthbatch.agent_stdlib.containers import (
    DEFAULT_EXECUTABLE,
    IMAGE_PYTHON,
    RUN_DIR_MOUNT,
    SCRATCH_MOUNT,
    wrap,
)
from synthbatch.agent_stdlib.contracts import ContainerSpec, MountSpec
from synthbatch.control.bundle import check_agent_bundle

PROBE = Path(__file__).with_name("probe.py")
RUN_TIMEOUT_S = 120.0
SOFTWARE = ("vllm", "sglang", "llama-server", "data_designer")
NOT_RUNNABLE = {
    "none": "the profile has no container runtime (container.runtime = \"none\")",
    "pyxis": "pyxis runs images only as srun steps; not inspected on this machine",
}


def _box(runtime: str, executable: str, path: str,
         mounts: Sequence[MountSpec] = ()) -> ContainerSpec:
    return ContainerSpec(runtime=runtime, image="inspect", path=path, sha256="",
                         mounts=tuple(mounts), executable=executable)


def image_argv(runtime: str, executable: str, path: str, argv: Sequence[str],
               mounts: Sequence[MountSpec] = ()) -> List[str]:
    """``argv`` run inside the image at ``path``, as a step would run it (no srun)."""
    wrapped = wrap(_box(runtime, executable, path, mounts), argv)
    if wrapped.srun_flags:
        raise ValueError(NOT_RUNNABLE["pyxis"])
    return list(wrapped.argv)


def runtime_env() -> Dict[str, str]:
    """This process's environment with ``USER`` set (ch-run refuses to start without)."""
    env = dict(os.environ)
    if not env.get("USER"):
        env["USER"] = pwd.getpwuid(os.getuid()).pw_name
    return env


def _run(argv: Sequence[str], timeout: float = RUN_TIMEOUT_S) -> Tuple[int, str, str]:
    try:
        done = subprocess.run(list(argv), env=runtime_env(), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return -1, "", f"timed out after {timeout:.0f} s"
    except OSError as err:
        return -1, "", str(err)
    return done.returncode, done.stdout, done.stderr


def _last_json(text: str) -> Optional[Dict[str, Any]]:
    for line in reversed(text.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def runtime_executable(runtime: str, executable: str) -> Optional[str]:
    """The runtime's binary here (absolute), or None when it is not installed."""
    name = executable or DEFAULT_EXECUTABLE.get(runtime, "")
    if not name:
        return None
    if os.sep in name:
        return name if os.access(name, os.X_OK) else None
    return shutil.which(name)


def agent_check(runtime: str, exe: str, path: str, agent_pyz: Path,
                python: str = IMAGE_PYTHON) -> Dict[str, Any]:
    """The agent bundle's import check run with the image's ``python3`` (all errors)."""
    def runner(extracted: str) -> Tuple[List[str], str]:
        mounts = [MountSpec(extracted, SCRATCH_MOUNT, False)]
        return image_argv(runtime, exe, path, [], mounts), SCRATCH_MOUNT

    errors = check_agent_bundle(agent_pyz, python=python, runner=runner, env=runtime_env())
    return {"bundle": agent_pyz.name, "ok": not errors, "errors": errors}


def inspect_image(path: str, runtime: str, executable: str = "",
                  mount_points: Sequence[str] = (),
                  agent_pyz: Optional[Path] = None) -> Dict[str, Any]:
    """The inspection record of the image at ``path`` (see the module docstring)."""
    record: Dict[str, Any] = {"runtime": runtime, "inspected_at": round(time.time(), 3)}
    if runtime in NOT_RUNNABLE:
        return {**record, "ran": False, "reason": NOT_RUNNABLE[runtime]}
    exe = runtime_executable(runtime, executable)
    if exe is None:
        name = executable or DEFAULT_EXECUTABLE.get(runtime, runtime)
        return {**record, "ran": False, "reason": f"{name} is not installed here"}
    wanted = sorted(set(mount_points) | {RUN_DIR_MOUNT, SCRATCH_MOUNT})
    code, out, err = _run(image_argv(runtime, exe, path, [IMAGE_PYTHON, "-I", "-c",
                                                          PROBE.read_text(), *wanted]))
    report = _last_json(out) if code == 0 else None
    if report is None:
        record.update(ran=True, python=None, software=dict.fromkeys(SOFTWARE),
                      mount_points=None, python_error=f"exit {code}: {_tail(err or out)}")
        code, out, err = _run(image_argv(runtime, exe, path, ["llama-server", "--version"]))
        if code == 0:
            line = _tail(out + "\n" + err)
            record["software"]["llama-server"] = {"version": line, "path": "llama-server"}
        return record
    software = report.get("software") if isinstance(report.get("software"), dict) else {}
    record.update(ran=True, python=report.get("python"),
                  software={name: software.get(name) for name in SOFTWARE},
                  mount_points=report.get("mount_points"))
    if agent_pyz is not None:
        agent = agent_check(runtime, exe, path, agent_pyz)
        record["agent"] = {**agent, "errors": agent["errors"][:5]}
    return record


def describe(record: Optional[Dict[str, Any]], kind: str) -> List[str]:
    """``image info`` lines of an inspection record (untrusted text: printed made visible)."""
    if not record:
        return ["inspection: none"]
    if not record.get("ran"):
        return [f"inspection: not run ({record.get('reason', 'unknown reason')})"]
    lines = [f"inspection: ran with {record.get('runtime')}"]
    python = record.get("python")
    if isinstance(python, dict):
        lines.append(f"  python: {python.get('version')} ({python.get('executable')})")
    else:
        lines.append(f"  python: none ({record.get('python_error', 'no python3')})")
    software = record.get("software") or {}
    for name in SOFTWARE:
        found = software.get(name)
        shown = f"{found.get('version')} ({found.get('path')})" if isinstance(found, dict) \
            else "absent"
        lines.append(f"  {name}: {shown}")
    points = record.get("mount_points")
    if isinstance(points, dict) and record.get("runtime") == "charliecloud":
        missing = [p for p, there in sorted(points.items()) if not there]
        lines.append("  mount points: " + ("all present" if not missing else
                                           "missing " + ", ".join(missing)))
    agent = record.get("agent")
    if isinstance(agent, dict):
        lines.append(f"  agent {agent.get('bundle')}: " + (
            "imports with the image's python3" if agent.get("ok") else
            "does not import: " + "; ".join(str(e) for e in agent.get("errors") or [])))
    engines = [n for n in ("vllm", "sglang", "llama-server") if software.get(n)]
    if kind == "serving" and not engines:
        lines.append("  note: no serving engine found (vllm, sglang, llama-server)")
    if kind == "client" and not software.get("data_designer"):
        lines.append("  note: no data_designer package found")
    return lines
