"""Checkpoint storage that every node of a cluster sees.

Multi-node clusters need shared storage for checkpoints (Ray stopped syncing to the head node
in 2.7): :func:`check_storage` fails early unless the storage path is a cloud URI or a network
file system, or all nodes run on this machine (``ray.cluster_utils.Cluster`` in tests).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from iaa.files import REMOTE_SCHEMES, is_remote_uri
from iaa.platform.resources import ClusterError, Node

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
            f"{where}: --storage-path is required so that every node can write and read checkpoints; "
            "give a shared NFS path mounted at the same place on all nodes, or a bucket such as s3://bucket/iaa"
        )
    if "://" in str(storage_path) and not str(storage_path).startswith("file://"):
        if not is_remote_uri(storage_path):
            raise ClusterError(f"--storage-path {storage_path}: unsupported scheme; use one of {', '.join(REMOTE_SCHEMES)}")
        return
    if len(hosts) == 1 or os.environ.get(ASSUME_SHARED_ENV) == "1":
        return
    fs_type = filesystem_type(Path(str(storage_path).removeprefix("file://")), mounts)
    if fs_type not in NETWORK_FS and not fs_type.startswith("fuse."):
        raise ClusterError(
            f"{where}, but --storage-path {storage_path} is on a local {fs_type} file system that the other "
            "nodes cannot see; use an NFS mount shared by all nodes or s3://bucket/path "
            f"(set {ASSUME_SHARED_ENV}=1 if this file system is shared after all)"
        )
