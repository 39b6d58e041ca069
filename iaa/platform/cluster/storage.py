"""Checkpoint storage that every node of a cluster sees, and that only its owner can write.

Multi-node clusters need shared storage for checkpoints (Ray stopped syncing to the head node
in 2.7): :func:`check_storage` fails early unless the storage path is a cloud URI or a network
file system, or all nodes run on this machine (``ray.cluster_utils.Cluster`` in tests).

Resuming a sweep unpickles Tune's state (``tuner.pkl``, the searcher's state) from the storage
path, and unpickling runs code: :func:`check_private` refuses a local folder, or a pickle in it,
that another user owns or that group or others may write. A remote URI cannot be checked this
way: whoever can write the bucket prefix is trusted (see docs/network.md).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Sequence

from iaa.files import REMOTE_SCHEMES, is_remote_uri
from iaa.platform.cluster.resources import ClusterError, Node

NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "ceph", "cephfs", "beegfs",
              "glusterfs", "fuse.glusterfs", "fuse.gcsfuse", "fuse.s3fs", "fuse.mountpoint-s3", "fuse.juicefs",
              "fuse.ceph", "fuse.sshfs", "9p", "virtiofs", "wekafs", "panfs")
ASSUME_SHARED_ENV = "IAA_ASSUME_SHARED_STORAGE"   # set to 1 for a shared file system not detected here


def filesystem_type(path: Path, mounts: str | None = None) -> str:
    """The type of the file system holding ``path`` (longest matching mount point in /proc/mounts)."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text(encoding="utf-8")
        except OSError:
            return "unknown"
    path = Path(os.path.realpath(path))     # symlinks resolved; the path need not exist yet
    best, best_type = "", "unknown"
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        mount_point = parts[1].replace("\\040", " ")
        inside = str(path) == mount_point or str(path).startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, best_type = mount_point, parts[2]
    return best_type


def check_storage(storage_path: str | None, nodes: Sequence[Node], *, mounts: str | None = None) -> None:
    """Fail early when a multi-node cluster has no shared checkpoint storage.

    Accepted on more than one node: a cloud URI (``s3://``, ``gs://``, ...), a path on a network
    file system (NFS, Lustre, CephFS, a FUSE bucket mount, ...), any path when every node runs on
    this machine, or any path when ``IAA_ASSUME_SHARED_STORAGE=1``.
    """
    hosts = {n.address for n in nodes}
    if len(nodes) <= 1:
        return
    where = f"the cluster has {len(nodes)} nodes ({len(hosts)} hosts)"
    if not storage_path:
        raise ClusterError(
            f"{where}: `storage_path` is required so that every node can write and read checkpoints; "
            "give a shared NFS path mounted at the same place on all nodes, or a bucket such as s3://bucket/iaa"
        )
    if "://" in str(storage_path) and not str(storage_path).startswith("file://"):
        if not is_remote_uri(storage_path):
            raise ClusterError(f"`storage_path` {storage_path}: unsupported scheme; use one of {', '.join(REMOTE_SCHEMES)}")
        return
    if len(hosts) == 1 or os.environ.get(ASSUME_SHARED_ENV) == "1":
        return
    fs_type = filesystem_type(Path(str(storage_path).removeprefix("file://")), mounts)
    if fs_type not in NETWORK_FS and not fs_type.startswith("fuse."):
        raise ClusterError(
            f"{where}, but `storage_path` {storage_path} is on a local {fs_type} file system that the other "
            "nodes cannot see; use an NFS mount shared by all nodes or s3://bucket/path "
            f"(set {ASSUME_SHARED_ENV}=1 if this file system is shared after all)"
        )


def check_private(folder: str | os.PathLike[str], what: str = "the sweep's storage") -> None:
    """Refuse to unpickle from ``folder`` unless it and every pickle directly in it are this user's own.

    Owned by the current user and not writable by group or others, as ssh asks of ``~/.ssh``.
    A remote URI is not checked (its access control is the bucket's).
    """
    if is_remote_uri(folder):
        return
    folder = Path(str(folder).removeprefix("file://"))
    for path in [folder, *sorted(folder.glob("*.pkl"))]:
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        problem = None
        if stat.S_ISLNK(st.st_mode):
            problem = "is a symbolic link"
        elif st.st_uid != os.getuid():
            problem = f"is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
        elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            problem = f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
        if problem:
            raise ClusterError(f"{path} {problem}; resuming would unpickle {what} from it, which runs code that "
                               f"whoever can write it chose. Check it, then `chmod go-w {path}` (and chown it) "
                               "to resume, or start a new sweep")
