"""``synthbatch image add|ls|info|rm``: the workspace's registry of sealed images."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, Optional

import click

from synthbatch.control.cli.common import SuggestingGroup, common, group_json


def _profile(profile: Optional[str]) -> Any:
    from synthbatch.control.api import load_profile

    return load_profile(profile)[0]


def _line(entry: Any) -> str:
    added = time.strftime("%Y-%m-%d %H:%M", time.gmtime(entry.added_at))
    return (f"{entry.alias:<20} {entry.kind:<7} {entry.sha256[:12]}  {entry.bytes:>14}  "
            f"{added}  {entry.path}")


def _inspector(prof: Any) -> Any:
    """Inspects an image with the profile's runtime and mounts (see control/images/inspect)."""
    from synthbatch.agent_stdlib.layout import bundle_cache
    from synthbatch.control.api import BundleError, inspect_image, locate_agent_bundle

    box = prof.container

    def inspect(path: str) -> Optional[Dict[str, Any]]:
        try:
            agent: Optional[Path] = locate_agent_bundle(bundle_cache(prof.workspace))
        except BundleError:
            agent = None  # no bundle to check here: the rest of the inspection still runs
        return inspect_image(path, box.runtime, box.executable or "",
                             [m.container for m in box.mounts], agent)

    return inspect


def _text(entry: Any, data: Dict[str, Any]) -> str:
    from synthbatch.control.readapi import describe_image as describe

    shown = {k: v for k, v in data.items() if k != "inspection"}
    return "\n".join([f"{k}: {v}" for k, v in shown.items()] +
                     describe(entry.inspection, entry.kind))


@click.group("image", cls=SuggestingGroup)
@group_json
def image_group() -> None:
    """Register sealed container images (sha256 pinned at add)."""


@image_group.command("add")
@click.argument("alias")
@click.argument("path")
@click.option("--kind", type=click.Choice(["serving", "client"]), default="serving",
              show_default=True, help="What the image is for (inspection notes follow it).")
@click.option("--replace", is_flag=True, help="Re-pin an alias that is already registered.")
@click.option("--no-inspect", is_flag=True, help="Do not run the image to see what is inside.")
@common
def add_cmd(alias: str, path: str, kind: str, replace: bool, no_inspect: bool,
            profile: Optional[str]) -> Any:
    """Hash the image PATH (absolute: a .sqsh/.squashfs/.sqfs/.sif file or a charliecloud
    image directory), inspect it when the profile's runtime can run it here, and register
    it as ALIAS."""
    from synthbatch.control.api import image_registry as registry
    from synthbatch.control.cli.output import ByteProgress

    prof = _profile(profile)
    bar = ByteProgress(f"sha256 {Path(path).name}")
    try:
        entry = registry.add(Path(prof.workspace), alias, path, replace=replace, kind=kind,
                             progress=bar, inspect=None if no_inspect else _inspector(prof))
    finally:
        bar.close()
    from synthbatch.control.readapi import describe_image as describe

    lines = [f"{entry.alias}: {entry.path} sha256 {entry.sha256}"]
    if entry.inspection is not None:
        lines += describe(entry.inspection, entry.kind)
    return {"data": asdict(entry), "text": "\n".join(lines)}


@image_group.command("ls")
@common
def ls_cmd(profile: Optional[str]) -> Any:
    """List registered images."""
    from synthbatch.control.api import image_registry as registry

    entries = sorted(registry.load(Path(_profile(profile).workspace)).values(),
                     key=lambda e: e.alias)
    return {"data": {"images": [asdict(e) for e in entries]},
            "text": "\n".join(_line(e) for e in entries) or "no images"}


@image_group.command("info")
@click.argument("alias")
@click.option("--verify", is_flag=True, help="Re-hash the image and compare with the pin.")
@common
def info_cmd(alias: str, verify: bool, profile: Optional[str]) -> Any:
    """Show one image and what its inspection found; with --verify, check that it still
    matches its pinned digest."""
    from synthbatch.control.api import image_registry as registry
    from synthbatch.control.cli.output import ByteProgress
    from synthbatch.control.errors import Conflict

    entry = registry.get(Path(_profile(profile).workspace), alias)
    data: dict = asdict(entry)
    if verify:
        bar = ByteProgress(f"sha256 {Path(entry.path).name}")
        try:
            problem = registry.verify(entry, progress=bar)
        finally:
            bar.close()
        if problem:
            raise Conflict(f"image {alias!r}: {problem}",
                           hint="re-pin with 'synthbatch image add --replace'")
        data["verified"] = True
    return {"data": data, "text": _text(entry, data)}


@image_group.command("rm")
@click.argument("alias")
@common
def rm_cmd(alias: str, profile: Optional[str]) -> Any:
    """Unregister ALIAS (the image itself is not touched)."""
    from synthbatch.control.api import image_registry as registry

    entry = registry.remove(Path(_profile(profile).workspace), alias)
    return {"data": asdict(entry), "text": f"removed {entry.alias} ({entry.path})"}
