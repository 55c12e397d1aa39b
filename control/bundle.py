"""Build, check and locate the agent zipapp (``agent-<sha256>.pyz``).

The allocation agent (:mod:`agent_stdlib`) runs on compute nodes as a single shiv zipapp,
``python agent.pyz <role> ...``, without any installation. This module:

* builds that zipapp from the ``agent_stdlib`` sources with shiv 1.0.8 and normalises the
  archive so that the same sources always give byte-identical output
  (:func:`build_agent_bundle`);
* checks a built archive by importing every module it ships with an isolated interpreter
  (``python -I -S``), so that any non-stdlib import fails the check
  (:func:`check_agent_bundle`);
* finds the bundle the control plane stages into a run directory at submit time
  (:func:`locate_agent_bundle`).

It deliberately imports nothing outside the standard library at module level (no pydantic,
no click, no shiv), so ``build_zipapp.py`` and ``setup.py`` can load it in a bare
interpreter. shiv is imported lazily, only when a bundle has to be built.

At run time shiv extracts the archive's ``site-packages`` into ``$SHIV_ROOT`` (default
``~/.shiv``); the batch script points ``SHIV_ROOT`` at node-local scratch.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

__all__ = [
    "AGENT_PACKAGE",
    "BUNDLE_ENV_VAR",
    "ENTRY_POINT",
    "MANIFEST_NAME",
    "SHIV_VERSION",
    "SOURCE_PACKAGE",
    "BundleError",
    "agent_source_dir",
    "build_agent_bundle",
    "check_agent_bundle",
    "locate_agent_bundle",
    "sha256_file",
    "source_digest",
]

#: The agent's package name inside the zipapp (top level there: nothing else is installed).
AGENT_PACKAGE = "agent_stdlib"
#: The same sources' name where the control plane is installed (``import synthbatch``).
SOURCE_PACKAGE = "synthbatch.agent_stdlib"
ENTRY_POINT = "agent_stdlib.__main__:main"
SHEBANG = "/usr/bin/env python3"
SHIV_VERSION = "1.0.8"
MANIFEST_NAME = "_bundle_manifest.json"
BUNDLE_ENV_VAR = "SYNTHBATCH_AGENT_PYZ"
#: Bumped whenever the archive layout/normalisation changes, so cached bundles are rebuilt.
BUNDLE_FORMAT = 1
#: Fixed metadata written into every zip entry (the earliest timestamp zip can store).
ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)
ZIP_FILE_MODE = 0o100644  # regular file, rw-r--r--
#: Stored (not deflated): output bytes then do not depend on the zlib version.
ZIP_COMPRESSION = zipfile.ZIP_STORED
SITE_PACKAGES = "site-packages"
INDEX_NAME = "index.json"
INDEX_MAX_ENTRIES = 32
PREBUILT_DIR = Path(__file__).resolve().parent / "_bundle"
CHECK_TIMEOUT_S = 120.0


class BundleError(Exception):
    """The agent bundle cannot be built, found or verified."""


# --------------------------------------------------------------------------- hashing


def sha256_file(path: Path) -> str:
    """Return the hex sha256 of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def agent_source_dir() -> Path:
    """Return the directory of the installed (or checked-out) ``agent_stdlib`` package.

    The package is located without being imported.
    """
    import importlib.util

    spec = importlib.util.find_spec(SOURCE_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise BundleError(f"cannot find the {SOURCE_PACKAGE!r} package sources")
    return Path(locations[0]).resolve()


def _source_files(source_dir: Path) -> List[Tuple[str, Path]]:
    """Return ``(posix relative path, path)`` of every ``*.py`` file, sorted, no caches."""
    if not (source_dir / "__init__.py").is_file():
        raise BundleError(f"{source_dir} is not a Python package (no __init__.py)")
    files = []
    for path in source_dir.rglob("*.py"):
        rel = path.relative_to(source_dir)
        if "__pycache__" in rel.parts or not path.is_file():
            continue
        if rel.as_posix() == MANIFEST_NAME:
            continue
        files.append((rel.as_posix(), path))
    return sorted(files)


def source_digest(source_dir: Optional[Path] = None) -> str:
    """Return a digest of the agent sources plus the bundle format and shiv version.

    Two source trees with the same digest produce byte-identical bundles.
    """
    source_dir = Path(source_dir) if source_dir is not None else agent_source_dir()
    digest = hashlib.sha256(
        f"synthbatch-agent-bundle/{BUNDLE_FORMAT}/shiv-{SHIV_VERSION}\0".encode()
    )
    for rel, path in _source_files(source_dir):
        data = path.read_bytes()
        digest.update(f"{rel}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def _module_name(rel: str) -> str:
    parts = [AGENT_PACKAGE] + rel[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _module_relpath(module: str) -> List[str]:
    """Candidate archive-relative paths (under site-packages) of ``module``."""
    base = module.replace(".", "/")
    return [base + ".py", base + "/__init__.py"]


# --------------------------------------------------------------------------- build


def _import_shiv() -> Tuple[object, object]:
    """Import shiv's builder and Environment lazily, checking the pinned version."""
    try:
        import shiv
        from shiv import builder
        from shiv.bootstrap.environment import Environment
    except ImportError as exc:
        raise BundleError(
            f"shiv=={SHIV_VERSION} is needed to build the agent bundle but is not importable "
            f"({exc}); it is a dependency of synthbatch: reinstall it (pip install "
            f"shiv=={SHIV_VERSION}) or set {BUNDLE_ENV_VAR} to a prebuilt agent-<sha256>.pyz"
        ) from exc
    version = getattr(shiv, "__version__", None)
    if version != SHIV_VERSION:
        raise BundleError(
            f"shiv=={SHIV_VERSION} is required to build the agent bundle, found {version}; "
            f"install shiv=={SHIV_VERSION} or set {BUNDLE_ENV_VAR}"
        )
    return builder, Environment


def _stage_site_packages(source_dir: Path, site_packages: Path, digest: str) -> List[str]:
    """Copy the package's ``*.py`` files into ``site_packages`` and write the manifest.

    Returns the sorted list of module names written to the manifest.
    """
    pkg = site_packages / AGENT_PACKAGE
    modules = []
    for rel, path in _source_files(source_dir):
        target = pkg / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
        modules.append(_module_name(rel))
    if AGENT_PACKAGE not in modules:
        raise BundleError(f"{source_dir} has no __init__.py")
    modules.sort()
    manifest = {
        "schema_version": 1,
        "package": AGENT_PACKAGE,
        "entry_point": ENTRY_POINT,
        "source_digest": digest,
        "modules": modules,
    }
    (pkg / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return modules


def _run_shiv(site_packages: Path, target: Path, digest: str) -> None:
    """Run shiv's archive builder (no pip involved) on a staged site-packages dir."""
    builder, environment_cls = _import_shiv()
    env = environment_cls(  # type: ignore[operator]
        built_at="1980-01-01 00:00:00",
        shiv_version=SHIV_VERSION,
        build_id=digest,
        entry_point=ENTRY_POINT,
        compile_pyc=False,
        extend_pythonpath=False,
        reproducible=True,
    )
    builder.create_archive(  # type: ignore[attr-defined]
        [site_packages],
        target=target,
        interpreter=SHEBANG,
        main="_bootstrap:bootstrap",
        env=env,
        compressed=False,
    )


def _deterministic_environment(raw: bytes, digest: str) -> bytes:
    """Rewrite shiv's environment.json with fixed build id/timestamp and sorted keys."""
    env = json.loads(raw.decode("utf-8"))
    env.update(
        build_id=digest,
        built_at="1980-01-01 00:00:00",
        reproducible=True,
        root=None,
        always_write_cache=False,
    )
    return (json.dumps(env, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")


def _normalise_archive(raw_pyz: Path, out: Path, digest: str) -> None:
    """Rewrite shiv's archive so that its bytes only depend on the entries' names and data.

    Keeps the shebang preamble; entries sorted by name; fixed timestamp, mode, creator
    system and compression; no directory entries; no comment or extra fields.
    """
    data = raw_pyz.read_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as zin:
        infos = zin.infolist()
        # Offset of the first local header = length of the preamble (the shebang line).
        preamble_len = min((i.header_offset for i in infos), default=0)
        preamble = data[:preamble_len]
        entries: Dict[str, bytes] = {}
        for info in infos:
            if info.is_dir():
                continue
            if info.filename in entries:
                raise BundleError(f"duplicate archive entry {info.filename}")
            entries[info.filename] = zin.read(info)
    if not preamble.startswith(b"#!") or not preamble.endswith(b"\n"):
        raise BundleError(f"unexpected preamble in shiv output: {preamble[:80]!r}")
    entries["environment.json"] = _deterministic_environment(entries["environment.json"], digest)

    with open(out, "wb") as fh:
        fh.write(preamble)
        with zipfile.ZipFile(fh, "w", compression=ZIP_COMPRESSION) as zout:
            for name in sorted(entries):
                info = zipfile.ZipInfo(name, date_time=ZIP_DATE_TIME)
                info.compress_type = ZIP_COMPRESSION
                info.create_system = 3  # Unix, so external_attr is honoured everywhere
                info.external_attr = ZIP_FILE_MODE << 16
                zout.writestr(info, entries[name])


def build_agent_bundle(out_dir: Path, source_dir: Optional[Path] = None) -> Path:
    """Build ``out_dir/agent-<sha256>.pyz`` from the ``agent_stdlib`` sources and return it.

    ``source_dir`` is the package directory to bundle (default: the installed/checked-out
    ``agent_stdlib``); its contents are always packaged as ``agent_stdlib``. Only ``*.py``
    files are included. The output is byte-identical for identical sources (see
    :func:`source_digest`); the name carries the sha256 of the final bytes. The file is
    written to a temporary name and renamed into place with mode 0644.
    """
    source_dir = (Path(source_dir) if source_dir is not None else agent_source_dir()).resolve()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    digest = source_digest(source_dir)
    with tempfile.TemporaryDirectory(prefix="agent-bundle-") as tmp:
        tmp_path = Path(tmp)
        site_packages = tmp_path / SITE_PACKAGES
        site_packages.mkdir()
        _stage_site_packages(source_dir, site_packages, digest)
        raw = tmp_path / "shiv-raw.pyz"
        _run_shiv(site_packages, raw, digest)

        fd, tmp_name = tempfile.mkstemp(prefix=".agent-", suffix=".pyz.tmp", dir=out_dir)
        os.close(fd)
        try:
            _normalise_archive(raw, Path(tmp_name), digest)
            os.chmod(tmp_name, 0o644)
            final = out_dir / f"agent-{sha256_file(Path(tmp_name))}.pyz"
            os.replace(tmp_name, final)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
    return final


# --------------------------------------------------------------------------- check

_CHECK_SCRIPT = r"""
import importlib, json, sys
site_packages, entry_point, modules = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path[:] = [site_packages] + [p for p in sys.path if p and p != site_packages]
errors = []
for name in modules:
    try:
        importlib.import_module(name)
    except BaseException as exc:  # noqa: B036 - SystemExit at import is an error too
        msg = str(exc).strip().splitlines()
        errors.append("%s: %s: %s" % (name, type(exc).__name__, msg[0] if msg else ""))
mod, _, attr = entry_point.partition(":")
if mod in sys.modules:
    obj = sys.modules[mod]
    for part in attr.split("."):
        obj = getattr(obj, part, None)
    if not callable(obj):
        errors.append("%s: entry point %s is not callable" % (mod, entry_point))
sys.stdout.write(json.dumps({"errors": errors}))
"""


def _safe_extract(archive: zipfile.ZipFile, dest: Path) -> None:
    root = dest.resolve()
    for info in archive.infolist():
        target = (dest / info.filename).resolve()
        if target != root and root not in target.parents:
            raise BundleError(f"archive entry escapes the extraction dir: {info.filename}")
    archive.extractall(dest)


# Given the host directory the bundle was extracted to: the command prefix that runs the
# check elsewhere (inside an image) and that directory as the command sees it.
Runner = Callable[[str], Tuple[List[str], str]]


def check_agent_bundle(pyz: Path, python: str = sys.executable,
                       runner: Optional[Runner] = None,
                       env: Optional[Dict[str, str]] = None) -> List[str]:
    """Import every module listed in the bundle's manifest with ``python -I -S``.

    The archive is extracted to a temporary directory; the check interpreter has only the
    standard library and the extracted ``site-packages`` on ``sys.path``, so any import of a
    third-party package (pydantic, yaml, ...) fails. Also fails when the manifest is missing
    or invalid, names a module without a file, or misses a module shipped in the archive.
    With ``runner`` the interpreter runs behind its prefix (``ch-run -b DIR:/x IMG --``:
    an image's ``python3``), seeing the extracted directory where ``runner`` says, in
    ``env`` (default: this process's environment).

    Returns a list of one-line error strings; an empty list means the bundle is OK.
    """
    pyz = Path(pyz)
    errors: List[str] = []
    with tempfile.TemporaryDirectory(prefix="agent-check-") as tmp:
        dest = Path(tmp)
        try:
            with zipfile.ZipFile(pyz) as archive:
                _safe_extract(archive, dest)
        except (OSError, zipfile.BadZipFile) as exc:
            return [f"{pyz}: cannot open archive: {exc}"]
        except BundleError as exc:
            return [f"{pyz}: {exc}"]
        site_packages = dest / SITE_PACKAGES
        manifest_path = site_packages / AGENT_PACKAGE / MANIFEST_NAME
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            modules = manifest["modules"]
            if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
                raise ValueError("'modules' is not a list of strings")
        except FileNotFoundError:
            return [f"{pyz}: manifest {AGENT_PACKAGE}/{MANIFEST_NAME} is missing"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return [f"{pyz}: manifest {AGENT_PACKAGE}/{MANIFEST_NAME} is invalid: {exc}"]

        for module in modules:
            if not any((site_packages / rel).is_file() for rel in _module_relpath(module)):
                errors.append(f"{module}: listed in the manifest but its file is missing")
        shipped = {
            _module_name(p.relative_to(site_packages / AGENT_PACKAGE).as_posix())
            for p in (site_packages / AGENT_PACKAGE).rglob("*.py")
        }
        for module in sorted(shipped - set(modules)):
            errors.append(f"{module}: shipped in the archive but not listed in the manifest")
        importable = [m for m in modules if m in shipped]

        try:
            env_json = json.loads((dest / "environment.json").read_text(encoding="utf-8"))
            entry_point = str(env_json.get("entry_point") or "")
        except (OSError, ValueError) as exc:
            errors.append(f"environment.json: unreadable: {exc}")
            entry_point = ""
        if entry_point != ENTRY_POINT:
            errors.append(f"environment.json: entry point {entry_point!r} != {ENTRY_POINT!r}")

        prefix, seen = runner(tmp) if runner is not None else ([], tmp)
        argv = prefix + [
            python, "-I", "-S", "-B", "-c", _CHECK_SCRIPT,
            f"{seen}/{SITE_PACKAGES}", entry_point or ENTRY_POINT, json.dumps(importable),
        ]  # fmt: skip
        try:
            proc = subprocess.run(
                argv,
                cwd=tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=CHECK_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return errors + [f"{python}: cannot run the import check: {exc}"]
        try:
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            errors.extend(str(e) for e in result["errors"])
        except (IndexError, ValueError, KeyError, TypeError):
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            errors.append(f"import check failed (exit {proc.returncode}): {tail}")
        else:
            if proc.returncode != 0:
                errors.append(f"import check exited {proc.returncode}")
    return errors


# --------------------------------------------------------------------------- locate


def _verified(path: Path) -> Path:
    """Return ``path`` if its name is ``agent-<sha256 of its bytes>.pyz``."""
    expected = path.name[len("agent-") : -len(".pyz")]
    if not (path.name.startswith("agent-") and path.suffix == ".pyz"):
        raise BundleError(f"{path}: not named agent-<sha256>.pyz")
    actual = sha256_file(path)
    if actual != expected:
        raise BundleError(f"{path}: content sha256 {actual} does not match its name")
    return path


def _read_index(index: Path) -> Dict[str, str]:
    """The cache index through the one tolerant reader ({}: missing or damaged)."""
    from synthbatch.agent_stdlib.statefile import read_json_or_none  # see locate_agent_bundle

    entries = (read_json_or_none(index) or {}).get("entries")
    return {str(k): str(v) for k, v in entries.items()} if isinstance(entries, dict) else {}


def _write_index(index: Path, entries: Dict[str, str]) -> None:
    """Replace the index durably; the entries keep their order (most recent last)."""
    from synthbatch.agent_stdlib.statefile import write_bytes_atomic

    write_bytes_atomic(index, (json.dumps({"schema_version": 1, "entries": entries},
                                          indent=2) + "\n").encode("utf-8"))


def _prebuilt_bundles() -> List[Path]:
    if not PREBUILT_DIR.is_dir():
        return []
    return sorted(PREBUILT_DIR.glob("agent-*.pyz"))


def locate_agent_bundle(cache_dir: Path) -> Path:
    """Return the agent zipapp to stage into a run directory.

    In order:

    1. ``$SYNTHBATCH_AGENT_PYZ`` if set (the file must exist);
    2. the prebuilt ``control/_bundle/agent-*.pyz`` shipped in the wheel (exactly one);
    3. a bundle built from the installed/checked-out ``agent_stdlib`` sources into
       ``cache_dir``, reused when ``cache_dir/index.json`` maps the current source digest to
       an existing bundle. Needs shiv; raises :class:`BundleError` when it is missing.

    Bundles from 2 and 3 are verified to be named after their content's sha256.
    """
    override = os.environ.get(BUNDLE_ENV_VAR)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise BundleError(f"{BUNDLE_ENV_VAR}={override}: no such file")
        return path.resolve()

    prebuilt = _prebuilt_bundles()
    if len(prebuilt) == 1:
        return _verified(prebuilt[0])
    if len(prebuilt) > 1:
        names = ", ".join(p.name for p in prebuilt)
        raise BundleError(f"{PREBUILT_DIR}: expected one prebuilt bundle, found {names}")

    cache_dir = Path(cache_dir).expanduser()
    cache_dir.mkdir(parents=True, exist_ok=True)
    source_dir = agent_source_dir()
    digest = source_digest(source_dir)
    index = cache_dir / INDEX_NAME
    # statefile's lock: imported here, so that setup.py can load this module by its path
    from synthbatch.agent_stdlib.statefile import locked

    with locked(cache_dir / ".lock"):
        entries = _read_index(index)
        name = entries.get(digest)
        if name and (cache_dir / name).is_file():
            try:
                return _verified(cache_dir / name)
            except BundleError:
                (cache_dir / name).unlink(missing_ok=True)
        built = build_agent_bundle(cache_dir, source_dir)
        entries.pop(digest, None)
        entries[digest] = built.name  # most recent last
        for old_digest in list(entries)[:-INDEX_MAX_ENTRIES]:
            old = entries.pop(old_digest)
            if old not in entries.values():
                (cache_dir / old).unlink(missing_ok=True)
        _write_index(index, entries)
    return built
