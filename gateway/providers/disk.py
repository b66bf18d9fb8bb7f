"""A local sandbox's disk quota: its ``root/`` is a filesystem of its own, a sparse ext4 image of the quota's
size loop-mounted there (root only).

Why: the sandboxes' directories share the data dir's filesystem, and one sandbox filled it in a fraction of
a second, after which every other tenant's new sandbox failed. With an image per sandbox, a sandbox that
fills its disk gets ENOSPC ("No space left on device") inside, on its own filesystem, and nobody else sees
anything; the image is sparse, so it costs the host only what the sandbox wrote (a few MiB of metadata
to begin with). What the host has free is guarded separately (``local_min_free_bytes``, local.py).

Project quotas would need the data dir on XFS or an ext4 mounted with ``prjquota``; a loop-mounted image
works on any filesystem, and needs only root (as per-sandbox UIDs do) and ``mkfs.ext4``. A gateway that is
not root, or that lacks either, runs without quotas and says so at startup.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

IMAGE = "disk.img"
_MKFS = ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1"]
_MOUNT_OPTIONS = "loop,nosuid,nodev"


def unavailable() -> str | None:
    """Why quotas cannot be had here, or None."""
    if os.geteuid() != 0:
        return "the gateway is not root (loop mounts need it)"
    for tool in ("mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: e2fsprogs, mount)"
    return None


def mount(box: Path, quota: int) -> bool:
    """``box/root`` on its own filesystem of ``quota`` bytes (made on first use); False for a sandbox made
    before quotas, whose files are already in a plain ``root/`` (it keeps them, without a quota).
    Raises ``OSError`` or ``RuntimeError`` when the image cannot be made or mounted."""
    root = box / "root"
    if os.path.ismount(root):
        return True
    image = box / IMAGE
    if not image.exists():
        if root.is_dir() and any(root.iterdir()):
            return False
        with open(image, "wb") as file:
            file.truncate(quota)
        _run([*_MKFS, str(image)], image)
    root.mkdir(exist_ok=True)
    _run(["mount", "-o", _MOUNT_OPTIONS, str(image), str(root)], image)
    with contextlib.suppress(OSError):
        (root / "lost+found").rmdir()  # the sandbox's home starts empty (e2fsck makes it again if it must)
    return True


def unmount(box: Path) -> None:
    """Detach ``box/root`` (lazily: a straggler of the sandbox may still hold it; the loop device goes with it)."""
    root = box / "root"
    if os.path.ismount(root):
        subprocess.run(["umount", "--lazy", str(root)], capture_output=True, timeout=30, check=False)


def _run(argv: list[str], image: Path) -> None:
    done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} {image}: {done.stderr.decode(errors='replace').strip()}")
