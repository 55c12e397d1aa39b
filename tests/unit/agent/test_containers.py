"""The container argv builder (golden per runtime), env passing and path translation."""

from __future__ import annotations

import json
from typing import Callable, Optional

import pytest

from synthbatch.agent_stdlib.containers import (
    IMAGE_PATH,
    RUN_DIR_MOUNT,
    SCRATCH_MOUNT,
    container_env,
    kept_names,
    translate,
    with_scratch,
    wrap,
)
from synthbatch.agent_stdlib.contracts import ContainerSpec, MountSpec

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
    binds = argv.index("-b")
    assert argv[binds:binds + 6] == ("-b", "/shared/models:/models", "-b",
                                     "/shared/models/private:/private",
                                     "-b", "/ws/runs/r-1:/synthbatch/run")
    assert argv[binds + 6:binds + 8] == ("/i.sqfs", "--") and argv[binds + 8:] == ARGV


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


# ----------------------------------------------------------------------------- env and scratch

SCRATCHED = with_scratch(spec("charliecloud", "/i.sqfs"), "/tmp/shiv-0")


def test_charliecloud_keeps_only_named_variables_and_puts_no_value_in_the_argv() -> None:
    argv = wrap(SCRATCHED, ARGV, env_names=["HF_TOKEN", "SYNTHBATCH_SHARD"],
                inherit=["HF_HOME"]).argv
    head = argv[:argv.index("/i.sqfs")]
    unset = [a for a in head if a.startswith("--unset-env=")]
    assert unset == ["--unset-env=!(" + "|".join(kept_names(["HF_TOKEN", "SYNTHBATCH_SHARD"],
                                                            ["HF_HOME"])) + ")"]
    kept = set(unset[0][len("--unset-env=!("):-1].split("|"))
    assert {"HF_TOKEN", "SYNTHBATCH_SHARD", "HF_HOME", "SLURM_*", "SLURMD_NODENAME",
            "CUDA_VISIBLE_DEVICES", "USER"} <= kept
    assert not kept & {"PATH", "HOME", "TMPDIR", "SHIV_ROOT"}  # host paths stay outside
    assert "--private-tmp" in head  # the host's /tmp is not the image's
    # the only values in the argv are fixed, non-secret container facts
    assert [a for a in head if a.startswith("--set-env")] == [
        f"--set-env=PATH={IMAGE_PATH}", f"--set-env=SHIV_ROOT={SCRATCH_MOUNT}"]
    assert head[-2:] == ("-b", f"/tmp/shiv-0:{SCRATCH_MOUNT}")


def test_charliecloud_keeps_a_path_the_step_sets_itself() -> None:
    argv = wrap(spec("charliecloud", "/i.sqfs"), ARGV, env_names=["PATH"]).argv
    assert not any(a.startswith("--set-env=PATH") for a in argv)
    assert not any(a.startswith("--set-env=SHIV_ROOT") for a in argv)  # no scratch mounted
    assert "PATH" in argv[2][len("--unset-env=!("):-1].split("|")


def test_scratch_is_mounted_once_and_only_into_images() -> None:
    assert with_scratch(None, "/tmp/s") is None
    assert with_scratch(spec("none"), "/tmp/s") == spec("none")
    assert with_scratch(spec("pyxis"), "") == spec("pyxis")
    twice = with_scratch(with_scratch(spec("pyxis"), "/tmp/a"), "/tmp/b")
    assert [m for m in twice.mounts if m.container == SCRATCH_MOUNT] == [
        MountSpec("/tmp/b", SCRATCH_MOUNT, False)]
    assert translate("/tmp/b/x", twice.mounts) == SCRATCH_MOUNT + "/x"


@pytest.mark.parametrize("runtime,expected", [
    ("pyxis", {"SHIV_ROOT": SCRATCH_MOUNT}),  # its task starts inside the image
    ("apptainer", {"SHIV_ROOT": "/tmp/shiv-0", "APPTAINERENV_SHIV_ROOT": SCRATCH_MOUNT}),
    ("charliecloud", {"SHIV_ROOT": "/tmp/shiv-0"}),  # the host binder's; --set-env inside
])
def test_shiv_root_inside_each_runtime_is_the_scratch_mount(runtime: str, expected) -> None:
    box = with_scratch(spec(runtime), "/tmp/shiv-0")
    env = container_env(box, {"SHIV_ROOT": "/tmp/shiv-0", "A": "1"}, ["A"])
    assert {k: v for k, v in env.items() if k.endswith("SHIV_ROOT")} == expected
    if runtime == "pyxis":
        assert "--container-env=A,SHIV_ROOT" in wrap(box, ARGV, ["A"]).srun_flags
