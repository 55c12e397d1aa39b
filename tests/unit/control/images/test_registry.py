"""The image registry and ``synthbatch image add|ls|info|rm``."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import pytest

from control.errors import Conflict, InvalidInput, NotFound
from control.images import registry
from tests.conftest import REPO
from tests.fakes import invoke

TESTBED = REPO / "examples" / "profiles" / "testbed.toml"


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "images" / "vllm.sqsh"
    path.parent.mkdir()
    path.write_bytes(b"squashfs" * 1000)
    return path


def test_add_pins_sha256(workspace: Path, image: Path) -> None:
    entry = registry.add(workspace, "vllm", str(image), now=5.0)
    assert entry.sha256 == hashlib.sha256(image.read_bytes()).hexdigest()
    assert (entry.bytes, entry.added_at, entry.path) == (8000, 5.0, str(image))
    assert registry.load(workspace) == {"vllm": entry}
    assert stat.S_IMODE(registry.registry_path(workspace).stat().st_mode) == 0o600


def test_add_conflict_and_replace(workspace: Path, image: Path) -> None:
    registry.add(workspace, "vllm", str(image))
    with pytest.raises(Conflict) as info:
        registry.add(workspace, "vllm", str(image))
    assert info.value.exit_code == 4 and "--replace" in (info.value.hint or "")
    image.write_bytes(b"new")
    entry = registry.add(workspace, "vllm", str(image), replace=True)
    assert entry.sha256 == hashlib.sha256(b"new").hexdigest()


@pytest.mark.parametrize("path,error", [
    ("relative/vllm.sqsh", InvalidInput), ("/a/../vllm.sqsh", InvalidInput),
    ("/a b/vllm.sqsh", InvalidInput), ("/img/vllm.tar", InvalidInput),
    ("/nowhere/vllm.sqsh", NotFound),
])
def test_add_rejects_paths(workspace: Path, path: str, error: type) -> None:
    with pytest.raises(error):
        registry.add(workspace, "vllm", path)
    assert registry.load(workspace) == {}


@pytest.mark.parametrize("alias", ["-x", "a b", "a/b", "", "x" * 65])
def test_add_rejects_aliases(workspace: Path, image: Path, alias: str) -> None:
    with pytest.raises(InvalidInput):
        registry.add(workspace, alias, str(image))


def test_remove_and_get(workspace: Path, image: Path) -> None:
    registry.add(workspace, "vllm", str(image))
    assert registry.get(workspace, "vllm").alias == "vllm"
    registry.remove(workspace, "vllm")
    assert registry.load(workspace) == {}
    with pytest.raises(NotFound):
        registry.remove(workspace, "vllm")
    with pytest.raises(NotFound):
        registry.get(workspace, "vllm")
    assert image.exists()  # the file itself is left alone


def test_verify(workspace: Path, image: Path) -> None:
    entry = registry.add(workspace, "vllm", str(image))
    assert registry.verify(entry) is None
    image.write_bytes(b"tampered")
    assert "does not match" in (registry.verify(entry) or "")
    image.unlink()
    assert "no such file" in (registry.verify(entry) or "")


@pytest.mark.parametrize("text", ["{", "[]", '{"schema_version": 2, "images": {}}',
                                  '{"schema_version": 1, "images": {"a": {"path": 1}}}'])
def test_corrupt_registry(workspace: Path, text: str) -> None:
    workspace.mkdir()
    registry.registry_path(workspace).write_text(text)
    with pytest.raises(InvalidInput, match="image registry"):
        registry.load(workspace)


# ----------------------------------------------------------------------------- CLI


def test_cli_round_trip(profile_file: Path, image: Path) -> None:
    added = invoke("image", "add", "vllm", str(image), "--profile", str(profile_file))
    assert added.exit_code == 0, added.stderr
    assert added.stdout.startswith(f"vllm: {image} sha256 ")
    listed = invoke("image", "ls", "--profile", str(profile_file), "--json")
    images = json.loads(listed.stdout)["images"]
    assert [i["alias"] for i in images] == ["vllm"]
    info = invoke("image", "info", "vllm", "--verify", "--profile", str(profile_file), "--json")
    assert info.exit_code == 0 and json.loads(info.stdout)["verified"] is True
    removed = invoke("image", "rm", "vllm", "--profile", str(profile_file))
    assert removed.exit_code == 0 and removed.stdout.startswith("removed vllm")
    assert invoke("image", "ls", "--profile", str(profile_file)).stdout == "no images\n"


def test_cli_errors(profile_file: Path, image: Path) -> None:
    missing = invoke("image", "info", "nope", "--profile", str(profile_file))
    assert missing.exit_code == 3 and "not registered" in missing.stderr
    bad = invoke("image", "add", "vllm", "rel.sqsh", "--profile", str(profile_file))
    assert bad.exit_code == 2 and len(bad.stderr.splitlines()) == 1
    invoke("image", "add", "vllm", str(image), "--profile", str(profile_file))
    image.write_bytes(b"changed")
    verify = invoke("image", "info", "vllm", "--verify", "--profile", str(profile_file))
    assert verify.exit_code == 4 and "does not match" in verify.stderr
    again = invoke("image", "add", "vllm", str(image), "--profile", str(profile_file), "--json")
    assert again.exit_code == 4 and json.loads(again.stderr)["error"]["code"] == "conflict"
