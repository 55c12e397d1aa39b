"""``synthbatch profile init|validate|show`` and the checks behind validate."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import List, Sequence

import pytest

from synthbatch.control.config.loader import load_model
from synthbatch.control.config.profile import Profile
from synthbatch.control.runs import doctor as checks
from synthbatch.control.slurm.runner import CommandResult
from tests.conftest import REPO
from tests.fakes import invoke, tomllib

TESTBED = REPO / "examples" / "profiles" / "testbed.toml"


# ----------------------------------------------------------------------------- init


def test_init_writes_a_commented_valid_profile(tmp_path: Path) -> None:
    target = tmp_path / "p" / "cluster.toml"
    result = invoke("profile", "init", "--path", str(target), "--workspace", "/shared/ws",
                    "--account", "proj", "--partition", "gpu", "--gpus-per-node", "8",
                    "--gpu-request", "gpus", "--container-runtime", "pyxis")
    assert result.exit_code == 0, result.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    text = target.read_text()
    assert text.count("\n# ") > 10  # commented
    profile = load_model(target, Profile)
    assert (profile.workspace, profile.account, profile.partition) == ("/shared/ws", "proj",
                                                                       "gpu")
    assert (profile.gpus_per_node, profile.gpu_request) == (8, "gpus")
    assert profile.container.runtime == "pyxis" and profile.qos is None


def test_init_default_location_and_name(home: Path) -> None:
    previous = os.umask(0o022)  # the usual umask: mkdir's parents got 0755 under it
    try:
        assert invoke("profile", "init", "--workspace", "/ws").exit_code == 0
    finally:
        os.umask(previous)
    assert (home / ".config/synthbatch/profiles/default.toml").is_file()
    for folder in (".config", ".config/synthbatch", ".config/synthbatch/profiles"):
        assert stat.S_IMODE((home / folder).stat().st_mode) == 0o700, folder  # was 0755
    assert invoke("profile", "init", "--workspace", "/ws", "--profile", "big").exit_code == 0
    assert (home / ".config/synthbatch/profiles/big.toml").is_file()


def test_init_never_overwrites(tmp_path: Path) -> None:
    target = tmp_path / "p.toml"
    target.write_text("mine")
    result = invoke("profile", "init", "--path", str(target), "--workspace", "/ws")
    assert result.exit_code == 4
    assert "already exists" in result.stderr and target.read_text() == "mine"


@pytest.mark.parametrize("args,field", [
    (["--workspace", "relative"], "workspace"),
    (["--workspace", "/ws", "--partition", "bad name"], "partition"),
    (["--workspace", "/ws", "--python", "/usr/bin/py\nthon"], "python"),
])
def test_init_rejects_bad_values(tmp_path: Path, args: Sequence[str], field: str) -> None:
    target = tmp_path / "p.toml"
    result = invoke("profile", "init", "--path", str(target), *args)
    assert result.exit_code == 2
    assert len(result.stderr.splitlines()) == 1 and f"{field}:" in result.stderr
    assert not target.exists()


# ----------------------------------------------------------------------------- show


def test_show_prints_resolved_defaults() -> None:
    result = invoke("profile", "show", "--profile", str(TESTBED))
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"# {TESTBED} with every default filled in"
    assert 'partition = "debug"' in lines and "port_base = 20000" in lines
    assert "[container]" in lines and 'runtime = "none"' in lines
    assert "# account is not set" in lines  # was `account = null`: not TOML
    data = json.loads(invoke("profile", "show", "--profile", str(TESTBED), "--json").stdout)
    assert data["profile"]["gpus_per_node"] == 4 and data["path"] == str(TESTBED)


HOSTILE = """schema_version = 1
workspace = "/shared/ws"
partition = "gpu"
env_allow = ["HF_HOME", "VLLM_LOGGING_LEVEL"]
secrets = ["HF_TOKEN"]
[container]
runtime = "apptainer"
executable = "/opt/apptainer/bin/apptainer"
mounts = [{ host = "/shared/models", container = "/models", read_only = true },
          { host = "/scratch", container = "/scratch" }]
[sbatch_options]
exclusive = ""
gres-flags = "enforce-binding"
constraint = "a100&ib"
comment = "team:llm/batch"
"""


@pytest.mark.parametrize("source", ["testbed", "pyxis", "hostile"])
def test_show_prints_a_profile_that_reads_back_as_itself(tmp_path: Path, source: str) -> None:
    from synthbatch.control.config.document import tomllib

    path = {"testbed": TESTBED, "pyxis": REPO / "examples" / "profiles" / "pyxis.toml",
            "hostile": tmp_path / "hostile.toml"}[source]
    if source == "hostile":
        path.write_text(HOSTILE)
    shown = invoke("profile", "show", "--profile", str(path))
    assert shown.exit_code == 0, shown.output
    again = tmp_path / "again.toml"
    again.write_text(shown.stdout)
    original = load_model(path, Profile)
    assert tomllib.loads(shown.stdout)  # valid TOML
    assert load_model(again, Profile) == original  # and the same profile, every field
    assert invoke("profile", "show", "--profile", str(again)).stdout.splitlines()[1:] == \
        shown.stdout.splitlines()[1:]  # a fixed point


# ----------------------------------------------------------------------------- validate


PARTITION = ("PartitionName=debug Default=YES MaxNodes=UNLIMITED MaxTime={max_time} "
             "MaxCPUsPerNode=UNLIMITED Nodes=node[1-2] State={state} TotalCPUs=16 "
             "TotalNodes=2 MaxMemPerNode=UNLIMITED AllowAccounts=ALL AllowQos=ALL\n")


class FakeCluster:
    """Answers the commands validate runs; fails on anything else."""

    def __init__(self, sinfo: str = "debug*|up|2|idle\n", python: str = "3.11.2\n",
                 srun_help: str = "--container-image=...", version_rc: int = 0,
                 gres: str = "gpu:4", state: str = "UP", max_time: str = "UNLIMITED") -> None:
        self.out = {"sinfo": sinfo, "srun": srun_help}
        self.partition = PARTITION.format(state=state, max_time=max_time) \
            if "debug" in sinfo else ""
        self.nodes = f"node1|8|4096|{gres}|idle\nnode2|8|4096|{gres}|idle\n"
        self.python, self.version_rc = python, version_rc
        self.calls: List[List[str]] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> CommandResult:
        self.calls.append(list(argv))
        name = Path(argv[0]).name
        if name == "scontrol" and "partition" in argv:
            missing = "debug" in argv and not self.partition
            return CommandResult(argv, int(missing), self.partition,
                                 "Partition debug not found\n" if missing else "")
        if name == "scontrol":
            return CommandResult(argv, 0, "MaxArraySize = 1001\n", "")
        if name == "sinfo" and "-N" in argv:
            return CommandResult(argv, 0, self.nodes, "")
        if name in self.out:
            return CommandResult(argv, 0, self.out[name], "")
        if argv[1:2] == ["-c"]:
            return CommandResult(argv, 0, self.python, "")
        if argv[1:] == ["--version"]:
            return CommandResult(argv, self.version_rc, "1.3.0\n", "not found")
        raise AssertionError(f"unexpected command {argv}")


def profile(tmp_path: Path, **changes: object) -> Profile:
    data = load_model(TESTBED, Profile).model_dump()
    data.update(workspace=str(tmp_path / "ws"), **changes)
    return Profile.model_validate(data)


def write_profile(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile(tmp_path, **changes).model_dump(mode="json")))
    return path


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    fake = FakeCluster()
    monkeypatch.setattr(checks, "run_command", fake)
    monkeypatch.setattr(checks.shutil, "which", lambda name: f"/usr/bin/{name}")
    return fake


def test_validate_all_ok(tmp_path: Path, cluster: FakeCluster) -> None:
    (tmp_path / "ws").mkdir()
    path = write_profile(tmp_path)
    result = invoke("profile", "validate", "--profile", str(path))
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert out.startswith(f"profile {path}\n")
    for name in ("workspace", "slurm", "partition", "arrays", "python", "container", "secrets",
                 "port_base"):
        assert f"  {name}" in out
    assert "2 of 2 node(s) of partition debug fit 2 CPUs, 1024 MB, 4 GPUs" in out
    assert "MaxArraySize 1001" in out
    assert "check on a compute node: srun -p debug" in out
    data = json.loads(invoke("profile", "validate", "--profile", str(path), "--json").stdout)
    assert data["ok"] is True and len(data["checks"]) == 8


def test_validate_failure_reports_and_exits_2(tmp_path: Path, cluster: FakeCluster) -> None:
    cluster.out["sinfo"] = "batch*|up|8|idle\n"
    cluster.partition = ""
    path = write_profile(tmp_path)
    result = invoke("profile", "validate", "--profile", str(path))
    assert result.exit_code == 2
    assert "FAIL  partition  partition debug does not exist on this cluster (have: batch)" \
        in result.stdout
    line = result.stderr.splitlines()
    assert len(line) == 1 and "1 check(s) failed: partition:" in line[0]
    assert str(path) in line[0]
    as_json = invoke("profile", "validate", "--profile", str(path), "--json")
    assert as_json.exit_code == 2 and json.loads(as_json.stdout)["ok"] is False
    assert json.loads(as_json.stderr)["error"]["code"] == "invalid_input"


@pytest.mark.parametrize("changes,gpus,status,fragment", [
    ({}, 4, "ok", "2 of 2 node(s) of partition debug fit"),
    ({"gres": "gpu:a100:8(S:0-1)"}, 4, "ok", "fit 2 CPUs, 1024 MB, 4 GPUs"),
    ({"gres": "gpu:2"}, 4, "fail", "4 GPUs per node, but the biggest node of partition "
                                   "debug has 2"),
    ({"state": "DOWN"}, 4, "warn", "partition debug is DOWN: jobs wait until it is UP"),
    ({"gres": "(null)"}, 0, "ok", "0 GPUs"),
    ({"sinfo": "other|up|2|idle\n"}, 4, "fail", "partition debug does not exist"),
    ({"max_time": "00:10:00"}, 4, "fail", "time limit 00:30:00 is above partition debug's "
                                          "MaxTime (10 min)"),
])
def test_check_cluster(tmp_path: Path, changes: dict, gpus: int, status: str,
                       fragment: str) -> None:
    found = checks.check_cluster(profile(tmp_path, gpus_per_node=gpus), FakeCluster(**changes))
    assert any((c.status, fragment in c.detail) == (status, True) for c in found), found


def test_check_cluster_default_partition(tmp_path: Path) -> None:
    (found,) = checks.check_cluster(profile(tmp_path, partition=None), FakeCluster())
    assert found.status == "ok" and "partition debug" in found.detail


def test_check_workspace(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(f"server:/export {tmp_path} nfs4 rw 0 0\n/dev/sda1 / ext4 rw 0 0\n")
    assert checks.check_workspace(tmp_path, mounts).status == "ok"
    mounts.write_text("/dev/sda1 / ext4 rw 0 0\n")
    local = checks.check_workspace(tmp_path, mounts)
    assert local.status == "warn" and "ext4" in local.detail
    missing = checks.check_workspace(tmp_path / "a" / "b", mounts)
    assert missing.status == "warn" and "does not exist yet" in missing.detail
    (tmp_path / "file").write_text("x")
    assert checks.check_workspace(tmp_path / "file", mounts).status == "fail"
    assert not list(tmp_path.glob(".synthbatch-probe-*"))


@pytest.mark.parametrize("python,status", [("3.9.18\n", "ok"), ("3.8.10\n", "fail"),
                                           ("garbage\n", "warn")])
def test_check_python(tmp_path: Path, python: str, status: str) -> None:
    check = checks.check_python(profile(tmp_path), FakeCluster(python=python))
    assert check.status == status and "srun -p debug -N1 -n1 -t 1" in check.detail


def test_check_python_missing(tmp_path: Path) -> None:
    """Missing beside the workspace (shared with the nodes): a FAIL, as in ``plan``."""
    check = checks.check_python(profile(tmp_path, python=str(tmp_path / "nope" / "python3")),
                                checks.run_command)
    assert check.status == "fail" and "does not exist" in check.detail


def test_check_container(tmp_path: Path) -> None:
    pyxis = profile(tmp_path, container={"runtime": "pyxis"})
    assert checks.check_container(pyxis, FakeCluster()).status == "ok"
    assert checks.check_container(pyxis, FakeCluster(srun_help="usage")).status == "fail"
    apptainer = profile(tmp_path, container={"runtime": "apptainer"})
    assert checks.check_container(apptainer, FakeCluster()).status == "ok"
    assert checks.check_container(apptainer, FakeCluster(version_rc=1)).status == "warn"


def test_check_binaries(tmp_path: Path) -> None:
    prof = profile(tmp_path)
    assert checks.check_binaries(prof, lambda name: f"/usr/bin/{name}").status == "ok"
    missing = checks.check_binaries(prof, lambda n: None if n == "sacct" else "/x")
    assert missing.status == "fail" and missing.detail.endswith(": sacct")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    with_dir = checks.check_binaries(profile(tmp_path, slurm_bin=str(bin_dir)), lambda n: "/x")
    assert with_dir.status == "fail" and str(bin_dir) in with_dir.detail


def test_check_secrets_names_only(tmp_path: Path) -> None:
    prof = profile(tmp_path, secrets=["HF_TOKEN", "OTHER_TOKEN"])
    check = checks.check_secrets(prof, {"HF_TOKEN": "hf_value_never_shown"})
    assert check.status == "warn" and "OTHER_TOKEN" in check.detail
    assert "hf_value_never_shown" not in check.detail
    assert checks.check_secrets(prof, {"HF_TOKEN": "a", "OTHER_TOKEN": "b"}).status == "ok"


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/mounts")
def test_fs_type_of_root() -> None:
    assert checks.fs_type(Path("/")) is not None




DOWN = "slurm_load_partitions: Unable to contact slurm controller (connect failure)\n"


def test_validate_with_an_unreachable_scheduler_exits_5(tmp_path: Path, cluster: FakeCluster,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))

    def down(argv: Sequence[str], timeout: float) -> CommandResult:
        if Path(argv[0]).name in ("sinfo", "scontrol"):
            return CommandResult(argv, 1, "", DOWN)
        return cluster(argv, timeout)

    monkeypatch.setattr(checks, "run_command", down)
    (tmp_path / "ws").mkdir()
    path = write_profile(tmp_path)
    result = invoke("profile", "validate", "--profile", str(path))
    assert result.exit_code == 5
    assert "FAIL  partition  sinfo failed: slurm_load_partitions: Unable to contact" in \
        result.stdout
    (line,) = result.stderr.splitlines()
    assert line.endswith("(connect failure) (hint: is slurmctld up?)"), line
    assert "may have taken effect" not in result.output
    as_json = invoke("profile", "validate", "--profile", str(path), "--json")
    assert as_json.exit_code == 5
    assert json.loads(as_json.stderr)["error"]["code"] == "scheduler_unavailable"
    assert [set(c) for c in json.loads(as_json.stdout)["checks"]] == \
        [{"name", "status", "detail"}] * 8


# ----------------------------------------------------------------------------- local backend


def fake_nvidia_smi(folder: Path, monkeypatch: pytest.MonkeyPatch, gpus: int) -> None:
    """An ``nvidia-smi`` first on PATH that lists ``gpus`` GPUs."""
    folder.mkdir(exist_ok=True)
    script = folder / "nvidia-smi"
    lines = "".join(f"echo 'GPU {i}: NVIDIA H100 (UUID: GPU-{i})'\n" for i in range(gpus))
    script.write_text(f"#!/bin/sh\n[ \"$1\" = -L ] || exit 9\n{lines}")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")


def test_init_local_writes_a_working_local_profile(tmp_path: Path, home: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(tmp_path / "bin", monkeypatch, 2)
    result = invoke("profile", "init", "--local")
    assert result.exit_code == 0, result.stderr
    target = home / ".config/synthbatch/profiles/default.toml"
    text = target.read_text()
    assert "nvidia-smi -L lists 2" in text and text.count("\n# ") > 8
    profile = load_model(target, Profile)
    assert (profile.backend, profile.workspace, profile.gpus_per_node) == (
        "local", str(home / "synthbatch"), 2)
    assert Path(profile.python).is_file() and profile.local.gpus is None
    checks = {c["name"]: c for c in json.loads(
        invoke("profile", "validate", "--profile", str(target), "--json").stdout)["checks"]}
    assert checks["gpus"]["status"] == "ok" and "0, 1 (nvidia-smi -L)" in checks["gpus"]["detail"]
    assert "slurm" not in checks and "partition" not in checks


def test_init_local_without_nvidia_smi_and_its_refusals(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no nvidia-smi anywhere
    target = tmp_path / "local.toml"
    result = invoke("profile", "init", "--local", "--path", str(target), "--workspace",
                    str(tmp_path / "ws"), "--python", sys.executable)
    assert result.exit_code == 0, result.stderr
    profile = load_model(target, Profile)
    assert profile.gpus_per_node == 0 and "none found" in target.read_text()
    refused = invoke("profile", "init", "--local", "--path", str(tmp_path / "x.toml"),
                     "--partition", "gpu")
    assert refused.exit_code == 2 and "--partition is a Slurm option" in refused.stderr
    pyxis = invoke("profile", "init", "--local", "--path", str(tmp_path / "y.toml"),
                   "--container-runtime", "pyxis")
    assert pyxis.exit_code == 2 and "pyxis starts containers through srun" in pyxis.stderr
    slurm = invoke("profile", "init", "--path", str(tmp_path / "z.toml"))
    assert slurm.exit_code == 2 and "--workspace is required" in slurm.stderr


@pytest.mark.parametrize("listed, per_node, smi, status, words", [
    (None, 2, "GPU 0: A\nGPU 1: B\n", "ok", "0, 1 (nvidia-smi -L)"),
    ([1], 1, "GPU 0: A\nGPU 1: B\n", "ok", "1 (local.gpus)"),
    ([3], 1, "GPU 0: A\n", "fail", "GPU 3 is not one of this machine's"),
    (None, 4, "GPU 0: A\n", "fail", "gpus_per_node = 4, but this machine has 1 GPU(s)"),
    (None, 2, None, "ok", "0, 1 (no nvidia-smi: gpus_per_node)"),
])
def test_check_local_gpus(tmp_path: Path, listed, per_node: int, smi, status: str,
                          words: str) -> None:
    def runner(argv, timeout):  # type: ignore[no-untyped-def]
        assert list(argv) == ["nvidia-smi", "-L"]
        return CommandResult(argv, 0 if smi is not None else 127, smi or "", "")

    data = {**tomllib.loads((REPO / "examples/profiles/local.toml").read_text()),
            "gpus_per_node": per_node, "local": {"gpus": listed} if listed else {}}
    check = checks.check_local_gpus(Profile.model_validate(data), runner)
    assert check.status == status and words in check.detail, check
