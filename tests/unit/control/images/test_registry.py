"""The image registry and ``synthbatch image add|ls|info|rm``."""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import stat
from pathlib import Path

import pytest

from synthbatch.agent_stdlib.imagedigest import tree_digest
from synthbatch.control.cli.output import ByteProgress
from synthbatch.control.errors import Conflict, InvalidInput, NotFound
from synthbatch.control.images import registry
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


@pytest.mark.parametrize("text", ["{", "[]", '{"schema_version": 99, "images": {}}',
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


# ----------------------------------------------------------------------------- kinds and trees


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "images" / "py"
    for folder in ("etc", "usr/bin", "synthbatch/run", "synthbatch/scratch"):
        (root / folder).mkdir(parents=True)
    (root / "etc" / "passwd").write_text("root:x:0:0::/:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    (root / "usr" / "bin" / "python3").write_bytes(b"\x7fELF not really")
    return root


def test_a_charliecloud_image_directory_is_pinned_by_its_tree_digest(workspace: Path,
                                                                     tree: Path) -> None:
    entry = registry.add(workspace, "py", str(tree), kind="client", now=1.0)
    assert entry.sha256 == tree_digest(str(tree))[0]
    assert (entry.format, entry.kind, entry.bytes) == ("directory", "client",
                                                       22 + 10 + 15)
    assert registry.verify(entry) is None
    (tree / "usr" / "bin" / "python3").chmod(0o755)  # a mode bit is part of the image
    assert "does not match" in (registry.verify(entry) or "")


def test_a_directory_that_is_no_image_tree_is_refused(workspace: Path, tree: Path) -> None:
    (tree / "etc" / "group").unlink()
    with pytest.raises(InvalidInput, match=r"not an image tree \(no etc/group"):
        registry.add(workspace, "py", str(tree))


def test_kind_is_checked_and_a_squashfs_file_is_a_format(workspace: Path, image: Path) -> None:
    with pytest.raises(InvalidInput, match="image kind 'engine'"):
        registry.add(workspace, "vllm", str(image), kind="engine")
    assert registry.add(workspace, "vllm", str(image)).format == "squashfs"


def test_hashing_reports_progress_and_the_inspection_is_kept(workspace: Path,
                                                              image: Path) -> None:
    seen = []
    entry = registry.add(workspace, "vllm", str(image), progress=lambda d, t: seen.append((d, t)),
                         inspect=lambda path: {"ran": False, "reason": f"looked at {path}"})
    assert seen[-1] == (8000, 8000)
    assert registry.get(workspace, "vllm").inspection == {"ran": False,
                                                          "reason": f"looked at {image}"}
    assert entry.inspection == registry.get(workspace, "vllm").inspection


def test_a_version_1_registry_is_still_read(workspace: Path, image: Path) -> None:
    workspace.mkdir()
    registry.registry_path(workspace).write_text(json.dumps({"schema_version": 1, "images": {
        "old": {"path": str(image), "sha256": "a" * 64, "bytes": 8000, "added_at": 1.0}}}))
    entry = registry.load(workspace)["old"]
    assert (entry.kind, entry.inspection, registry.image_format(entry)) == ("serving", None,
                                                                            "squashfs")
    registry.add(workspace, "vllm", str(image))  # rewritten as version 2, old entry kept
    data = json.loads(registry.registry_path(workspace).read_text())
    assert data["schema_version"] == 2 and sorted(data["images"]) == ["old", "vllm"]


def _add_many(workspace: str, images: str, first: int) -> None:
    for index in range(first, first + 5):
        registry.add(Path(workspace), f"img{index}", f"{images}/vllm.sqsh")


def test_concurrent_adds_never_lose_an_entry(workspace: Path, image: Path) -> None:
    context = multiprocessing.get_context("fork")
    procs = [context.Process(target=_add_many, args=(str(workspace), str(image.parent), n))
             for n in (0, 5, 10, 15)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert sorted(registry.load(workspace)) == sorted(f"img{i}" for i in range(20))
    assert not list(workspace.glob("*.tmp*"))  # no temp file left behind


def test_the_progress_bar_draws_only_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    quiet, loud = io.StringIO(), Tty()
    for stream in (quiet, loud):
        bar = ByteProgress("sha256 x.sqsh", stream)
        bar(2**30, 4 * 2**30)
        bar(4 * 2**30, 4 * 2**30)
        bar.close()
    assert quiet.getvalue() == ""
    assert loud.getvalue().endswith("100.0% 4.00/4.00 GiB\n") and "\r" in loud.getvalue()
