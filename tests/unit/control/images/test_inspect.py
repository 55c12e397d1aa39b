"""Image inspection: the probe, the runtimes it can and cannot use, and ``image info``.

The real runtime (ch-run on the test image) is exercised in
``tests/integration/test_containers_slurm.py``; here a stand-in ``ch-run`` runs the
command on the host, with a fake site-packages and a fake ``llama-server``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from synthbatch.control.images import registry
from synthbatch.control.images.inspect import PROBE, describe, image_argv, inspect_image
from tests.fakes import invoke

FAKE_CH_RUN = '''#!{python}
"""A stand-in for ch-run: checks its options, maps -b targets back to host paths in the
arguments (a poor man's mount namespace), and runs the command on the host with a fake
site-packages and PATH ("the image")."""
import os, sys
args = sys.argv[1:]
binds = []
while args[0] != "--":
    flag = args.pop(0)
    if flag == "-b":
        binds.append(args.pop(0).split(":"))
    elif not flag.startswith("--"):
        image = flag
assert os.path.exists(image), image
cmd = args[1:]
def host(value):
    for src, dst in binds:
        if value == dst or value.startswith(dst + "/"):
            return src + value[len(dst):]
    return value
cmd = [host(a) for a in cmd if a != "-I"]
if cmd[0] == "python3":
    cmd[0] = {python!r}
env = {{"PYTHONPATH": {site!r}, "PATH": {bin!r} + ":/usr/bin:/bin"}}
os.execve(cmd[0] if "/" in cmd[0] else "/usr/bin/env", cmd if "/" in cmd[0] else ["env"] + cmd,
          env)
'''


@pytest.fixture
def fake_image(tmp_path: Path) -> Path:
    """Site-packages with vllm and data_designer, a bin/ with llama-server, a stand-in."""
    site, bin_dir = tmp_path / "site", tmp_path / "bin"
    for name, dist, version in (("vllm", "vllm", "0.6.3"),
                                ("data_designer", "data_designer", "0.9.7")):
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text("raise SystemExit('never imported')\n")
        meta = site / f"{dist}-{version}.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\n"
                                       f"Version: {version}\n")
    bin_dir.mkdir()
    server = bin_dir / "llama-server"
    server.write_text("#!/bin/sh\necho 'version: 4526 (abcdef0)' >&2\n")
    server.chmod(0o755)
    fake = tmp_path / "ch-run"
    fake.write_text(FAKE_CH_RUN.format(python=sys.executable, site=str(site), bin=str(bin_dir)))
    fake.chmod(0o755)
    image = tmp_path / "image.sqfs"
    image.write_bytes(b"squashfs")
    return image


def test_the_probe_finds_engines_clients_and_mount_points(fake_image: Path,
                                                          tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE.read_text(), str(tmp_path / "site"),
                           "/no/such/dir"],
                          env={"PYTHONPATH": str(tmp_path / "site"),
                               "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60, check=True)
    report = json.loads(done.stdout)
    assert report["python"]["executable"] == sys.executable
    software = report["software"]
    assert software["vllm"]["version"] == "0.6.3"
    assert software["data_designer"]["version"] == "0.9.7"
    assert software["sglang"] is None
    assert software["llama-server"] == {"version": "version: 4526 (abcdef0)",
                                        "path": str(tmp_path / "bin" / "llama-server")}
    assert report["mount_points"] == {str(tmp_path / "site"): True, "/no/such/dir": False}


def test_inspection_runs_the_image_with_the_runtime_and_checks_the_agent(
        fake_image: Path, tmp_path: Path, agent_pyz: Path) -> None:
    record = inspect_image(str(fake_image), "charliecloud", str(tmp_path / "ch-run"),
                           ["/models"], agent_pyz)
    assert record["ran"] is True and record["python"]["executable"] == sys.executable
    assert record["software"]["vllm"]["version"] == "0.6.3"
    assert set(record["mount_points"]) == {"/models", "/synthbatch/run", "/synthbatch/scratch"}
    assert record["agent"] == {"bundle": agent_pyz.name, "ok": True, "errors": []}
    lines = describe(record, "serving")
    assert "  vllm: 0.6.3 (" in "\n".join(lines) and "  sglang: absent" in lines
    assert not any(line.startswith("  note:") for line in lines)  # it has an engine
    assert "  note: no data_designer package found" not in describe(record, "client")


def test_what_cannot_be_inspected_here_says_why(tmp_path: Path) -> None:
    image = str(tmp_path / "x.sqsh")
    pyxis = inspect_image(image, "pyxis")
    assert pyxis["ran"] is False and "srun" in pyxis["reason"]
    gone = inspect_image(image, "apptainer", str(tmp_path / "no-apptainer"))
    assert gone["ran"] is False and gone["reason"].endswith("no-apptainer is not installed here")
    assert describe(gone, "serving") == [f"inspection: not run ({gone['reason']})"]
    with pytest.raises(ValueError, match="srun"):
        image_argv("pyxis", "", image, ["python3"])


def test_an_image_without_python_is_reported_so(tmp_path: Path) -> None:
    fake = tmp_path / "ch-run"
    fake.write_text("#!/bin/sh\necho 'exec: python3: not found' >&2\nexit 127\n")
    fake.chmod(0o755)
    record = inspect_image(str(tmp_path), "charliecloud", str(fake))
    assert record["python"] is None and "exit 127: exec: python3: not found" in \
        record["python_error"]
    assert "  python: none (exit 127: exec: python3: not found)" in describe(record, "client")
    assert "  note: no data_designer package found" in describe(record, "client")


def test_image_add_and_info_show_the_inspection(fake_image: Path, tmp_path: Path,
                                                 workspace: Path) -> None:
    profile = tmp_path / "charlie.toml"
    profile.write_text(f'schema_version = 1\nworkspace = "{workspace}"\npython = "/usr/bin/'
                       f'python3"\n[container]\nruntime = "charliecloud"\n'
                       f'executable = "{tmp_path / "ch-run"}"\n')
    added = invoke("image", "add", "eng", str(fake_image), "--profile", str(profile))
    assert added.exit_code == 0, added.output
    assert "  vllm: 0.6.3 (" in added.stdout
    info = invoke("image", "info", "eng", "--profile", str(profile), "--json")
    data = json.loads(info.stdout)
    assert data["kind"] == "serving" and data["format"] == "squashfs"
    assert data["inspection"]["software"]["data_designer"]["version"] == "0.9.7"
    skipped = invoke("image", "add", "raw", str(fake_image), "--no-inspect", "--profile",
                     str(profile))
    assert skipped.exit_code == 0 and registry.get(workspace, "raw").inspection is None
    text = invoke("image", "info", "raw", "--profile", str(profile)).stdout
    assert "inspection: none" in text
