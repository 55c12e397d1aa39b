"""The container argv builder (golden per runtime), env passing and path translation."""

from __future__ import annotations

import json
from typing import Callable, Optional

import pytest

from agent_stdlib.containers import RUN_DIR_MOUNT, container_env, translate, wrap
from agent_stdlib.contracts import ContainerSpec, MountSpec

MOUNTS = (MountSpec("/shared/models", "/models", True),
          MountSpec("/shared/models/private", "/private", False),
          MountSpec("/ws/runs/r-1", RUN_DIR_MOUNT, False))
ARGV = ("vllm", "serve", "/models/llama", "--port", "20000")


def spec(runtime: str, path: str = "/img/vllm.sqsh", executable: str = "") -> ContainerSpec:
    return ContainerSpec(runtime=runtime, image="vllm", path=path, sha256="a" * 64,
                         mounts=MOUNTS, executable=executable)


def srun_line(container: Optional[ContainerSpec], gpus: int = 2) -> str:
    wrapped = wrap(container, ARGV, env_names=["HF_TOKEN", "SYNTHBATCH_SHARD", "HF_TOKEN"],
                   gpus=gpus)
    return json.dumps({"srun_flags": list(wrapped.srun_flags), "argv": list(wrapped.argv)},
                      indent=2) + "\n"


@pytest.mark.parametrize("runtime,path", [("pyxis", "/img/vllm.sqsh"),
                                          ("apptainer", "/img/vllm.sif"),
                                          ("charliecloud", "/img/vllm.sqfs")])
def test_golden(runtime: str, path: str, golden: Callable[[str, str], None]) -> None:
    golden(f"container-{runtime}.json", srun_line(spec(runtime, path)))


def test_none_and_no_container_leave_argv_alone() -> None:
    for container in (None, spec("none")):
        wrapped = wrap(container, ARGV, env_names=["A"], gpus=1)
        assert wrapped.srun_flags == () and wrapped.argv == ARGV


def test_pyxis_flags() -> None:
    wrapped = wrap(spec("pyxis"), ARGV, env_names=["B", "A"])
    assert wrapped.argv == ARGV
    assert wrapped.srun_flags == (
        "--container-image=/img/vllm.sqsh",
        "--container-mounts=/shared/models:/models:ro,/shared/models/private:/private,"
        "/ws/runs/r-1:/synthbatch/run",
        "--no-container-mount-home", "--container-env=A,B")


def test_pyxis_without_env_names_has_no_container_env() -> None:
    assert not any(f.startswith("--container-env") for f in wrap(spec("pyxis"), ARGV).srun_flags)


def test_apptainer_nv_only_with_gpus() -> None:
    assert "--nv" in wrap(spec("apptainer", "/i.sif"), ARGV, gpus=1).argv
    no_gpu = wrap(spec("apptainer", "/i.sif"), ARGV, gpus=0).argv
    assert "--nv" not in no_gpu
    assert no_gpu[:5] == ("apptainer", "exec", "--cleanenv", "--no-home", "--bind")
    assert no_gpu[-len(ARGV) - 1:] == ("/i.sif",) + ARGV


def test_charliecloud_binds_and_separator() -> None:
    argv = wrap(spec("charliecloud", "/i.sqfs", executable="/opt/ch/bin/ch-run"), ARGV).argv
    assert argv[0] == "/opt/ch/bin/ch-run"
    assert argv[1:7] == ("-b", "/shared/models:/models", "-b", "/shared/models/private:/private",
                         "-b", "/ws/runs/r-1:/synthbatch/run")
    assert argv[7:9] == ("/i.sqfs", "--") and argv[9:] == ARGV


def test_unknown_runtime() -> None:
    with pytest.raises(ValueError, match="unknown container runtime"):
        wrap(spec("docker"), ARGV)


def test_apptainer_env_is_prefixed() -> None:
    env = container_env(spec("apptainer", "/i.sif"), {"HF_TOKEN": "x", "PATH": "/bin"},
                        ["HF_TOKEN", "MISSING"])
    assert env == {"HF_TOKEN": "x", "PATH": "/bin", "APPTAINERENV_HF_TOKEN": "x"}
    assert container_env(spec("pyxis"), {"A": "1"}, ["A"]) == {"A": "1"}
    assert container_env(None, {"A": "1"}, ["A"]) == {"A": "1"}


@pytest.mark.parametrize("path,expected", [
    ("/shared/models/llama", "/models/llama"),
    ("/shared/models", "/models"),
    ("/shared/models/private/x/y.gguf", "/private/x/y.gguf"),  # most specific wins
    ("/shared/models/private", "/private"),
    ("/shared/modelsx/a", None),  # a prefix, not a parent
    ("/elsewhere/a", None),
    ("/ws/runs/r-1/shards/shard-00000/output", "/synthbatch/run/shards/shard-00000/output"),
    ("/shared/models/./llama/", "/models/llama"),
])
def test_translate(path: str, expected: Optional[str]) -> None:
    assert translate(path, MOUNTS) == expected
    assert translate(path, tuple(reversed(MOUNTS))) == expected  # order does not matter
