"""``synthbatch profile init|validate|show``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

import click

from synthbatch.control.cli.common import SuggestingGroup, common, group_json
from synthbatch.control.cli.output import emit_json, emit_text

MARK = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}


@click.group("profile", cls=SuggestingGroup)
@group_json
def profile_group() -> None:
    """Create, check and show cluster profiles."""


def _target(path: Optional[Path], profile: Optional[str]) -> Path:
    from synthbatch.control.api import default_profile_path

    if path is not None:
        return path.expanduser()
    if profile and ("/" in profile or profile.endswith((".toml", ".json"))):
        return Path(profile).expanduser()
    return default_profile_path(profile or "default")


@profile_group.command("init")
@click.option("--path", type=click.Path(path_type=Path), default=None,
              help="Where to write (default: ~/.config/synthbatch/profiles/<--profile or "
                   "'default'>.toml).")
@click.option("--local", "local", is_flag=True,
              help="The local backend: no Slurm, runs on this machine (GPUs from nvidia-smi).")
@click.option("--workspace", default=None,
              help="Shared directory for runs (absolute; with --local default ~/synthbatch).")
@click.option("--account", default=None, help="Slurm account.")
@click.option("--partition", default=None, help="Slurm partition.")
@click.option("--qos", default=None, help="Slurm QOS.")
@click.option("--gpus-per-node", type=click.IntRange(0, 64), default=0, show_default=True,
              help="GPUs on each node of the partition.")
@click.option("--gpu-request", type=click.Choice(["gres", "gpus"]), default="gres",
              show_default=True, help="--gres=gpu:N or --gpus/--gpus-per-node.")
@click.option("--container-runtime", type=click.Choice(["none", "pyxis", "apptainer",
                                                         "charliecloud"]),
              default="none", show_default=True, help="How steps run in images.")
@click.option("--python", "python", default=None,
              help="Python 3.9+ on the compute nodes (default /usr/bin/python3; with --local "
                   "the one synthbatch runs on, outside its venv).")
@click.option("--slurm-bin", default=None, help="Directory of the Slurm commands.")
@common
def init_cmd(path: Optional[Path], local: bool, workspace: Optional[str],
             account: Optional[str], partition: Optional[str], qos: Optional[str],
             gpus_per_node: int, gpu_request: str, container_runtime: str,
             python: Optional[str], slurm_bin: Optional[str], profile: Optional[str]) -> Any:
    """Write a commented starter profile (0600); never overwrites a file."""
    from synthbatch.control.api import starter_toml, write_starter
    from synthbatch.control.errors import InvalidInput

    if local:
        text = _local_starter(workspace, python, container_runtime,
                              {"--account": account, "--partition": partition, "--qos": qos,
                               "--slurm-bin": slurm_bin})
    elif workspace is None:
        raise InvalidInput("profile init: --workspace is required (the shared directory for "
                           "runs), unless --local")
    else:
        text = starter_toml(workspace, account, partition, qos, gpus_per_node, gpu_request,
                            container_runtime, python or "/usr/bin/python3", slurm_bin)
    target = write_starter(_target(path, profile), text)
    return {"data": {"path": str(target)},
            "text": f"wrote {target}; check it with: synthbatch profile validate "
                    f"--profile {target}"}


def _local_starter(workspace: Optional[str], python: Optional[str], runtime: str,
                   slurm_only: Dict[str, Optional[str]]) -> str:
    """``profile init --local``: this machine's GPUs (nvidia-smi -L) and Python."""
    import sys

    from synthbatch.control.api import detect_gpus as detect
    from synthbatch.control.api import local_starter_toml
    from synthbatch.control.errors import InvalidInput

    given = [name for name, value in slurm_only.items() if value]
    if given:
        raise InvalidInput(f"profile init: {given[0]} is a Slurm option; --local runs without "
                           "Slurm")
    found = detect()
    return local_starter_toml(workspace or str(Path("~/synthbatch").expanduser()),
                              len(found) if found is not None else None,
                              python or getattr(sys, "_base_executable", sys.executable),
                              runtime)


@profile_group.command("validate")
@common
def validate_cmd(profile: Optional[str], as_json: bool) -> Any:
    """Check the workspace, Slurm, the partition and its GPUs, Python and containers."""
    from synthbatch.control.api import check_profile, load_profile
    from synthbatch.control.errors import InvalidInput, SchedulerUnavailable

    prof, path = load_profile(profile)
    checks = check_profile(prof)
    data: Dict[str, Any] = {"profile": str(path), "ok": all(c.status != "fail" for c in checks),
                            "checks": [c.to_dict() for c in checks]}
    text = "\n".join([f"profile {path}"] + [f"  {MARK[c.status]}  {c.name:<10} {c.detail}"
                                            for c in checks])
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        emit_json(data) if as_json else emit_text(text)
        message = (f"{path}: {len(failed)} check(s) failed: "
                   + "; ".join(f"{c.name}: {c.detail}" for c in failed))
        down = next((c.unreachable for c in failed if c.unreachable is not None), None)
        if down is not None:  # Slurm could not be asked: exit 5, with its hint
            raise SchedulerUnavailable(message, hint=down.hint)
        raise InvalidInput(message)
    return {"data": data, "text": text}


@profile_group.command("show")
@common
def show_cmd(profile: Optional[str]) -> Any:
    """Print the resolved profile as TOML (every field, defaults filled in): valid as a
    profile file itself."""
    from synthbatch.control.api import load_profile, toml_text

    prof, path = load_profile(profile)
    values = prof.model_dump(mode="json")
    text = f"# {path} with every default filled in\n{toml_text(values)}"
    return {"data": {"path": str(path), "profile": values}, "text": text.rstrip("\n")}
