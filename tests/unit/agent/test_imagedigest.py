"""Image digests: a file's sha256, a directory's tree digest (the documented rule)."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

import pytest

from synthbatch.agent_stdlib.imagedigest import TREE_MAGIC, image_digest, tree_digest, tree_stamp


def make_tree(root: Path) -> Path:
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    (root / "usr" / "bin").mkdir(parents=True)
    tool = root / "usr" / "bin" / "tool"
    tool.write_bytes(b"#!/bin/sh\necho hi\n")
    tool.chmod(0o755)
    (root / "bin").symlink_to("usr/bin")
    (root / "empty").mkdir()
    os.mkfifo(root / "fifo", 0o600)
    return root


def expected(root: Path) -> str:
    """The digest as docs/containers.md and agent_stdlib/imagedigest.py spell the rule."""
    records = []
    paths = []

    def visit(rel: str) -> None:
        for name in sorted(os.listdir(root / rel if rel else root)):
            child = f"{rel}/{name}" if rel else name
            paths.append(child)
            st = os.lstat(root / child)
            if stat.S_ISDIR(st.st_mode):
                visit(child)

    visit("")
    for rel in paths:
        st = os.lstat(root / rel)
        perm = oct(stat.S_IMODE(st.st_mode))[2:]
        if stat.S_ISDIR(st.st_mode):
            kind, detail = "d", perm
        elif stat.S_ISREG(st.st_mode):
            kind = "f"
            detail = perm + ":" + hashlib.sha256((root / rel).read_bytes()).hexdigest()
        elif stat.S_ISLNK(st.st_mode):
            kind, detail = "l", os.readlink(root / rel)
        else:
            kind, detail = "p", perm
        records.append(f"{kind}\0{rel}\0{detail}\0".encode())
    return hashlib.sha256(TREE_MAGIC + b"".join(records)).hexdigest()


def test_a_file_digest_is_its_sha256(tmp_path: Path) -> None:
    image = tmp_path / "x.sqfs"
    image.write_bytes(b"squash" * 100000)
    seen = []
    digest, size = image_digest(str(image), lambda done, total: seen.append((done, total)))
    assert digest == hashlib.sha256(image.read_bytes()).hexdigest() and size == 600000
    assert seen[-1] == (600000, 600000)


def test_the_tree_digest_follows_the_documented_rule(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "img")
    digest, size = image_digest(str(root))
    assert digest == expected(root)
    assert size == len("root:x:0:0::/root:/bin/sh\n") + len(b"#!/bin/sh\necho hi\n")


def test_a_copy_elsewhere_with_other_owners_and_times_has_the_same_digest(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "img")
    copy = tmp_path / "copy" / "img"
    shutil.copytree(root, copy, symlinks=True, ignore=lambda d, names: ["fifo"])
    os.mkfifo(copy / "fifo", 0o600)
    os.utime(copy / "etc" / "passwd", (1, 1))
    if os.geteuid() == 0:
        os.lchown(copy / "usr" / "bin" / "tool", 1234, 1234)
    assert tree_digest(str(copy))[0] == tree_digest(str(root))[0]


@pytest.mark.parametrize("change", [
    lambda r: (r / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/bash\n"),
    lambda r: (r / "usr" / "bin" / "tool").chmod(0o644),
    lambda r: (r / "etc" / "passwd").rename(r / "etc" / "passwd2"),
    lambda r: ((r / "bin").unlink(), (r / "bin").symlink_to("/usr/bin")),
    lambda r: (r / "empty" / "new").mkdir(),
    lambda r: (r / "fifo").unlink(),
])
def test_any_change_of_content_name_type_or_mode_changes_the_digest(tmp_path: Path,
                                                                     change) -> None:
    root = make_tree(tmp_path / "img")
    before = tree_digest(str(root))[0]
    change(root)
    assert tree_digest(str(root))[0] != before


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_device_nodes_count_by_their_numbers(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "img")
    os.mknod(root / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    before = tree_digest(str(root))[0]
    (root / "null").unlink()
    os.mknod(root / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    assert tree_digest(str(root))[0] != before


def test_the_stamp_moves_when_anything_below_is_touched(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "img")
    stamp = tree_stamp(str(root))
    assert tree_stamp(str(root)) == stamp
    deep = root / "usr" / "bin" / "tool"
    before = os.stat(deep)
    deep.write_bytes(b"#!/bin/sh\necho HI\n")  # same size, then the old mtime back
    os.utime(deep, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert tree_stamp(str(root)) != stamp  # its ctime moved


def test_an_unreadable_image_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="cannot read .*nowhere"):
        image_digest(str(tmp_path / "nowhere"))
