"""The agent zipapp: deterministic build, stdlib-only import check, shiv runtime, locate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from synthbatch.control import bundle
from synthbatch.control.bundle import (
    BundleError,
    build_agent_bundle,
    check_agent_bundle,
    locate_agent_bundle,
    sha256_file,
)

from .conftest import REPO_ROOT, find_python39, snapshot_agent_sources

MANIFEST = "site-packages/agent_stdlib/_bundle_manifest.json"


def rewrite_zip(src: Path, dst: Path, replace: dict) -> Path:
    """Copy the zip ``src`` to ``dst``; ``replace`` maps names to new bytes (None = drop)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            if info.filename in replace:
                continue
            zout.writestr(info, zin.read(info))
        for name, data in replace.items():
            if data is not None:
                zout.writestr(name, data)
    return dst


# --------------------------------------------------------------------------- determinism


def test_build_twice_is_byte_identical(tmp_path: Path, agent_src_snapshot: Path) -> None:
    first = build_agent_bundle(tmp_path / "a", agent_src_snapshot)
    second = build_agent_bundle(tmp_path / "b", agent_src_snapshot)
    assert first.name == second.name
    assert first.read_bytes() == second.read_bytes()
    assert first.name == f"agent-{sha256_file(first)}.pyz"
    assert (first.stat().st_mode & 0o777) == 0o644
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [first.name]  # no temp left


def test_mtimes_modes_and_caches_do_not_change_the_bytes(
    tmp_path: Path, agent_src_snapshot: Path, agent_pyz: Path
) -> None:
    other = snapshot_agent_sources(tmp_path / "elsewhere" / "renamed_pkg")
    for i, path in enumerate(sorted(other.rglob("*.py"))):
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
        path.chmod(0o600 if i % 2 else 0o755)
    (other / "__pycache__").mkdir(exist_ok=True)
    (other / "__pycache__" / "junk.cpython-311.pyc").write_bytes(b"junk")
    (other / "notes.txt").write_text("not python")
    rebuilt = build_agent_bundle(tmp_path / "out", other)
    assert rebuilt.read_bytes() == agent_pyz.read_bytes()


def test_archive_is_normalised(agent_pyz: Path, agent_src_snapshot: Path) -> None:
    data = agent_pyz.read_bytes()
    assert data.startswith(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(agent_pyz) as zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        assert names == sorted(names)
        assert {"__main__.py", "environment.json", MANIFEST} <= set(names)
        assert any(n.startswith("_bootstrap/") for n in names)
        for info in infos:
            assert info.date_time == (1980, 1, 1, 0, 0, 0)
            assert info.external_attr >> 16 == 0o100644
            assert info.compress_type == zipfile.ZIP_STORED
        env = json.loads(zf.read("environment.json"))
        manifest = json.loads(zf.read(MANIFEST))
    assert env["entry_point"] == "agent_stdlib.__main__:main"
    assert env["built_at"] == "1980-01-01 00:00:00"
    assert env["build_id"] == bundle.source_digest(agent_src_snapshot)
    assert env["shiv_version"] == "1.0.8"
    assert manifest["modules"] == sorted(manifest["modules"])
    assert {"agent_stdlib", "agent_stdlib.__main__"} <= set(manifest["modules"])
    shipped = {n for n in names if n.startswith("site-packages/") and n.endswith(".py")}
    assert len(shipped) == len(manifest["modules"])


# --------------------------------------------------------------------------- import check


def test_check_passes_on_the_real_package(agent_pyz: Path) -> None:
    assert check_agent_bundle(agent_pyz) == []


def test_check_passes_on_python39_if_available(agent_pyz: Path) -> None:
    python39 = find_python39()
    if python39 is None:
        pytest.skip("no Python 3.9 interpreter installed (the agent's minimum version)")
    assert check_agent_bundle(agent_pyz, python=python39) == []


@pytest.mark.parametrize("module", ["pydantic", "yaml"])
def test_check_fails_on_a_non_stdlib_import(
    tmp_path: Path, agent_src_snapshot: Path, module: str
) -> None:
    src = snapshot_agent_sources(tmp_path / "agent_stdlib")
    (src / "sneaky.py").write_text(f'"""Not allowed."""\nimport {module}\n')
    errors = check_agent_bundle(build_agent_bundle(tmp_path / "out", src))
    assert len(errors) == 1, errors
    assert errors[0].startswith("agent_stdlib.sneaky: ModuleNotFoundError")
    assert repr(module) in errors[0]


def test_check_fails_on_a_nested_non_stdlib_import(tmp_path: Path) -> None:
    src = snapshot_agent_sources(tmp_path / "agent_stdlib")
    (src / "sub").mkdir()
    (src / "sub" / "__init__.py").write_text("")
    (src / "sub" / "deep.py").write_text("import click\n")
    errors = check_agent_bundle(build_agent_bundle(tmp_path / "out", src))
    assert [e.split(":")[0] for e in errors] == ["agent_stdlib.sub.deep"], errors


def test_check_fails_on_a_module_missing_from_the_archive(tmp_path: Path, agent_pyz: Path) -> None:
    with zipfile.ZipFile(agent_pyz) as zf:
        manifest = json.loads(zf.read(MANIFEST))
    manifest["modules"] = sorted(manifest["modules"] + ["agent_stdlib.ghost"])
    broken = rewrite_zip(agent_pyz, tmp_path / "broken.pyz", {MANIFEST: json.dumps(manifest)})
    errors = check_agent_bundle(broken)
    assert errors == ["agent_stdlib.ghost: listed in the manifest but its file is missing"]


def test_check_fails_on_a_module_missing_from_the_manifest(tmp_path: Path, agent_pyz: Path) -> None:
    with zipfile.ZipFile(agent_pyz) as zf:
        manifest = json.loads(zf.read(MANIFEST))
    manifest["modules"].remove("agent_stdlib.__main__")
    broken = rewrite_zip(agent_pyz, tmp_path / "broken.pyz", {MANIFEST: json.dumps(manifest)})
    errors = check_agent_bundle(broken)
    assert errors == [
        "agent_stdlib.__main__: shipped in the archive but not listed in the manifest"
    ]


def test_check_fails_without_manifest(tmp_path: Path, agent_pyz: Path) -> None:
    broken = rewrite_zip(agent_pyz, tmp_path / "broken.pyz", {MANIFEST: None})
    errors = check_agent_bundle(broken)
    assert len(errors) == 1 and "manifest" in errors[0] and "missing" in errors[0]


def test_check_fails_on_a_non_zip(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.pyz"
    bogus.write_bytes(b"#!/usr/bin/env python3\nprint('hi')\n")
    errors = check_agent_bundle(bogus)
    assert len(errors) == 1 and "cannot open archive" in errors[0]


# --------------------------------------------------------------------------- shiv runtime


@pytest.mark.parametrize("flags", [[], ["-I"], ["-I", "-S"]], ids=["plain", "-I", "-I-S"])
def test_pyz_runs_with_shiv_root_and_leaves_home_alone(
    tmp_path: Path, agent_pyz: Path, flags: list
) -> None:
    home, shiv_root = tmp_path / "home", tmp_path / "scratch"
    home.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}
    env["SHIV_ROOT"] = str(shiv_root)
    proc = subprocess.run(
        [sys.executable, *flags, str(agent_pyz), "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage" in proc.stdout.lower()
    assert not (home / ".shiv").exists()
    assert list(home.iterdir()) == []
    extracted = list(shiv_root.glob(f"{agent_pyz.name}_*/site-packages/agent_stdlib"))
    assert len(extracted) == 1


# --------------------------------------------------------------------------- CLI + imports


def test_build_zipapp_check_exits_zero(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "build_zipapp.py"), "--check", "--out-dir", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("OK ")
    assert len(list(tmp_path.glob("agent-*.pyz"))) == 1


def test_build_zipapp_check_fails_on_a_bad_bundle(tmp_path: Path) -> None:
    src = snapshot_agent_sources(tmp_path / "agent_stdlib")
    (src / "bad.py").write_text("import pydantic\n")
    proc = subprocess.run(
        [
            sys.executable, str(REPO_ROOT / "build_zipapp.py"), "--check",
            "--out-dir", str(tmp_path / "out"), "--source-dir", str(src),
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "agent_stdlib.bad: ModuleNotFoundError" in proc.stderr


def test_bundle_module_imports_no_third_party_packages() -> None:
    code = (
        "import sys; import synthbatch.control.bundle; "
        "bad = [m for m in ('pydantic', 'click', 'shiv') if m in sys.modules]; "
        "assert not bad, bad"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- locate


@pytest.fixture
def no_prebuilt(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Point the prebuilt-bundle dir at an empty dir and clear the env override."""
    prebuilt = tmp_path / "prebuilt"
    prebuilt.mkdir()
    monkeypatch.setattr(bundle, "PREBUILT_DIR", prebuilt)
    monkeypatch.delenv(bundle.BUNDLE_ENV_VAR, raising=False)
    return prebuilt


def test_locate_uses_the_env_override(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, agent_pyz: Path, no_prebuilt: Path
) -> None:
    monkeypatch.setenv(bundle.BUNDLE_ENV_VAR, str(agent_pyz))
    assert locate_agent_bundle(tmp_path / "cache") == agent_pyz.resolve()
    monkeypatch.setenv(bundle.BUNDLE_ENV_VAR, str(tmp_path / "missing.pyz"))
    with pytest.raises(BundleError, match="no such file"):
        locate_agent_bundle(tmp_path / "cache")


def test_locate_prefers_the_prebuilt_bundle(
    tmp_path: Path, agent_pyz: Path, no_prebuilt: Path
) -> None:
    shipped = no_prebuilt / agent_pyz.name
    shipped.write_bytes(agent_pyz.read_bytes())
    assert locate_agent_bundle(tmp_path / "cache") == shipped
    assert not (tmp_path / "cache").exists()
    (no_prebuilt / ("agent-" + "0" * 64 + ".pyz")).write_bytes(b"x")
    with pytest.raises(BundleError, match="expected one prebuilt bundle"):
        locate_agent_bundle(tmp_path / "cache")


def test_locate_rejects_a_prebuilt_bundle_whose_name_lies(
    tmp_path: Path, agent_pyz: Path, no_prebuilt: Path
) -> None:
    (no_prebuilt / ("agent-" + "0" * 64 + ".pyz")).write_bytes(agent_pyz.read_bytes())
    with pytest.raises(BundleError, match="does not match its name"):
        locate_agent_bundle(tmp_path / "cache")


def test_locate_builds_into_the_cache_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, agent_src_snapshot: Path, no_prebuilt: Path
) -> None:
    monkeypatch.setattr(bundle, "agent_source_dir", lambda: agent_src_snapshot)
    cache = tmp_path / "cache"
    first = locate_agent_bundle(cache)
    assert first.parent == cache and first.name == f"agent-{sha256_file(first)}.pyz"
    index = json.loads((cache / "index.json").read_text())
    assert index["entries"] == {bundle.source_digest(agent_src_snapshot): first.name}
    before = first.stat().st_mtime_ns

    def no_build(*_args: object) -> Path:
        raise AssertionError("rebuilt although the cache matches")

    monkeypatch.setattr(bundle, "build_agent_bundle", no_build)
    assert locate_agent_bundle(cache) == first
    assert first.stat().st_mtime_ns == before


def test_locate_rebuilds_when_the_sources_change(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_prebuilt: Path
) -> None:
    src = snapshot_agent_sources(tmp_path / "agent_stdlib")
    monkeypatch.setattr(bundle, "agent_source_dir", lambda: src)
    cache = tmp_path / "cache"
    first = locate_agent_bundle(cache)
    (src / "extra.py").write_text('"""New module."""\n')
    second = locate_agent_bundle(cache)
    assert second != first and second.is_file() and first.is_file()
    assert len(json.loads((cache / "index.json").read_text())["entries"]) == 2
    assert check_agent_bundle(second) == []


def test_locate_without_shiv_explains_what_to_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_prebuilt: Path
) -> None:
    monkeypatch.setitem(sys.modules, "shiv", None)  # makes `import shiv` raise ImportError
    with pytest.raises(BundleError, match=r"dependency of synthbatch.*SYNTHBATCH_AGENT_PYZ"):
        locate_agent_bundle(tmp_path / "cache")
