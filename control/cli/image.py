"""``synthbatch image add|ls|info|rm``: the workspace's registry of sealed images."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import click

from control.cli.common import SuggestingGroup, common


def _workspace(profile: Optional[str]) -> Path:
    from control.config.profile import load_profile

    prof, _ = load_profile(profile)
    return Path(prof.workspace)


def _line(entry: Any) -> str:
    added = time.strftime("%Y-%m-%d %H:%M", time.gmtime(entry.added_at))
    return f"{entry.alias:<20} {entry.sha256[:12]}  {entry.bytes:>14}  {added}  {entry.path}"


@click.group("image", cls=SuggestingGroup)
def image_group() -> None:
    """Register sealed container images (sha256 pinned at add)."""


@image_group.command("add")
@click.argument("alias")
@click.argument("path")
@click.option("--replace", is_flag=True, help="Re-pin an alias that is already registered.")
@common
def add_cmd(alias: str, path: str, replace: bool, profile: Optional[str]) -> Any:
    """Hash the image file PATH (absolute) and register it as ALIAS."""
    from control.images import registry

    entry = registry.add(_workspace(profile), alias, path, replace=replace)
    return {"data": asdict(entry), "text": f"{entry.alias}: {entry.path} sha256 {entry.sha256}"}


@image_group.command("ls")
@common
def ls_cmd(profile: Optional[str]) -> Any:
    """List registered images."""
    from control.images import registry

    entries = sorted(registry.load(_workspace(profile)).values(), key=lambda e: e.alias)
    return {"data": {"images": [asdict(e) for e in entries]},
            "text": "\n".join(_line(e) for e in entries) or "no images"}


@image_group.command("info")
@click.argument("alias")
@click.option("--verify", is_flag=True, help="Re-hash the file and compare with the pin.")
@common
def info_cmd(alias: str, verify: bool, profile: Optional[str]) -> Any:
    """Show one image; with --verify, check that the file still matches its sha256."""
    from control.errors import Conflict
    from control.images import registry

    entry = registry.get(_workspace(profile), alias)
    data: dict = asdict(entry)
    if verify:
        problem = registry.verify(entry)
        if problem:
            raise Conflict(f"image {alias!r}: {problem}",
                           hint="re-pin with 'synthbatch image add --replace'")
        data["verified"] = True
    text = "\n".join(f"{k}: {v}" for k, v in data.items())
    return {"data": data, "text": text}


@image_group.command("rm")
@click.argument("alias")
@common
def rm_cmd(alias: str, profile: Optional[str]) -> Any:
    """Unregister ALIAS (the image file is not touched)."""
    from control.images import registry

    entry = registry.remove(_workspace(profile), alias)
    return {"data": asdict(entry), "text": f"removed {entry.alias} ({entry.path})"}
