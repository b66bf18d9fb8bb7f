"""A local sandbox's disk quota: its home is a filesystem of its own, a sparse ext4 image of the quota's size
(``box/disk.img``), loop-mounted at ``box/root`` in a mount namespace of the sandbox's own (root only).

Why: the sandboxes' directories share the data dir's filesystem, and one sandbox filled it in a fraction of
a second, after which every other tenant's new sandbox failed. With an image per sandbox, a sandbox that
fills its disk gets ENOSPC ("No space left on device") inside, on its own filesystem, and nobody else sees
anything; the image is sparse, so it costs the host only what the sandbox wrote (a few MiB of metadata
to begin with). What the host has free is guarded separately (``local_min_free_bytes``, local.py).

Why a namespace of its own: the mount then exists only as long as the sandbox's processes do. However the
sandbox ends (deleted, suspended, killed with the gateway down, the host's processes killed by a test), the
kernel unmounts it and frees the loop device (``mount -o loop`` sets autoclear); a mount on the host would
outlive every one of those that forgot it. The host sees the image, not the files: to look inside a
stopped sandbox's disk, ``mount -o loop,ro box/disk.img /mnt``.

Project quotas would need the data dir on XFS or an ext4 mounted with ``prjquota``; a loop-mounted image
works on any filesystem, and needs only root (as per-sandbox UIDs do), ``mkfs.ext4`` and ``unshare``. A
gateway that is not root, or that lacks them, runs without quotas and says so at startup.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

IMAGE = "disk.img"
_MKFS = ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1"]
# Run in the new mount namespace, before the sandbox: mount its disk, give its top to the sandbox's UID.
_MOUNT = ('img=$0 root=$1 uid=$2; shift 2; mount -o loop,nosuid,nodev "$img" "$root" || exit 125; '
          'rmdir "$root/lost+found" 2>/dev/null; chown "$uid:$uid" "$root" && chmod 700 "$root" || exit 125; '
          'exec "$@"')


def unavailable() -> str | None:
    """Why quotas cannot be had here, or None."""
    if os.geteuid() != 0:
        return "the gateway is not root (loop mounts need it)"
    for tool in ("mkfs.ext4", "mount", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: e2fsprogs, mount, util-linux)"
    return None


def image(box: Path, quota: int) -> Path | None:
    """The sandbox's disk image, made (sparse, ``quota`` bytes) on its first start; None for a sandbox made
    before quotas, whose files are in a plain ``root/`` (it keeps them, without a quota).
    Raises ``OSError`` or ``RuntimeError`` when the image cannot be made."""
    path = box / IMAGE
    if path.exists():
        return path
    root = box / "root"
    if root.is_dir() and any(root.iterdir()):
        return None
    partial = box / (IMAGE + ".new")
    with open(partial, "wb") as file:
        file.truncate(quota)
    done = subprocess.run([*_MKFS, str(partial)], capture_output=True, timeout=60, check=False)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"mkfs.ext4 {partial}: {done.stderr.decode(errors='replace').strip()}")
    partial.rename(path)
    return path


def launch_prefix(disk: Path, root: Path, uid: int) -> list[str]:
    """The argv that runs the rest of a launch in a mount namespace of its own with ``disk`` at ``root``."""
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", _MOUNT,
            str(disk), str(root), str(uid)]
