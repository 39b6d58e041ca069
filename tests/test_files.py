"""The shared file helpers: atomic writes and remote-URI detection."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from iaa.files import atomic_path, atomic_write_text, is_remote_uri


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "a.txt"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert sorted(p.name for p in target.parent.iterdir()) == ["a.txt"]


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="disk on fire"):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk on fire")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_atomic_writes_get_the_usual_file_mode(tmp_path: Path) -> None:
    """Not mkstemp's 0600: an explain page or a manifest is as readable as any file the user writes."""
    mask = os.umask(0o022)
    os.umask(mask)
    written = atomic_write_text(tmp_path / "page.html", "<p>")
    assert stat.S_IMODE(written.stat().st_mode) == 0o666 & ~mask


@pytest.mark.parametrize("uri, remote", [("s3://bucket/x", True), ("gs://b", True), ("file:///tmp/x", False),
                                         ("/mnt/nfs/x", False), ("relative/x", False), ("", False), (None, False)])
def test_remote_uris(uri: object, remote: bool) -> None:
    assert is_remote_uri(uri) is remote
