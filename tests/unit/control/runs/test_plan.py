"""The dry run's login-node checks for a local profile: this machine is the partition."""

from __future__ import annotations

from pathlib import Path

from synthbatch.control.runs.plan import local_fit, resolve
from tests.conftest import REPO

RUN = REPO / "examples" / "fake-server.toml"  # one replica of 1 GPU per allocation


def local_profile(tmp_path: Path, gpus_per_node: int, gpus: str = "") -> Path:
    path = tmp_path / "local.toml"
    path.write_text(
        "schema_version = 1\nbackend = \"local\"\n"
        f"workspace = \"{tmp_path / 'ws'}\"\ngpus_per_node = {gpus_per_node}\n"
        "python = \"/usr/bin/python3\"\ndefault_time_limit = \"00:30:00\"\n"
        "[local]\nmax_concurrent = 1\n" + (f"gpus = [{gpus}]\n" if gpus else ""))
    return path


def test_a_local_run_fits_when_this_machine_has_its_gpus(tmp_path: Path) -> None:
    found = local_fit(resolve(RUN, str(local_profile(tmp_path, 2))))
    assert [(f.level, f.field) for f in found] == [("ok", "local backend")]
    assert "1 of 2 GPUs" in found[0].message


def test_more_gpus_than_the_machine_has_is_an_error_naming_the_deployments(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("synthbatch.control.backends.local.gpus.detect",
lambda *a: [0])  # nvidia-smi
    run = tmp_path / "two-gpus.toml"  # one replica of 2 GPUs per allocation
    run.write_text(RUN.read_text().replace("gpus = 1", "gpus = 2").replace(
        "{config_dir}/../fixtures", str(REPO / "fixtures")))
    found = local_fit(resolve(run, str(local_profile(tmp_path, 4))))
    assert [f.level for f in found] == ["error"]
    assert found[0].field.endswith("deployments (GPUs per node; the profile's gpus_per_node "
                                   "is 4)")
    assert found[0].message == ("2 GPUs per allocation, but this machine's local backend has "
                                "1 (0)")
