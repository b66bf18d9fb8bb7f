"""Host UIDs of local sandboxes (gateway as root): unique across every installation on the host.

Sandbox IDs are deterministic (the same identity gives the same ID in any checkout), so two
gateways with their own data dirs on one host used to derive the same UID for the same ID and
each saw the other's processes as its own sandbox's.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gateway.providers.confine import UID_BASE, UID_RANGE, Bubblewrap

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="host UIDs are handed out only when the gateway is root")


def _uid_of(confinement: Bubblewrap, box: Path) -> int:
    launch = confinement.prepare(box, box.name)
    confinement.release(launch.cgroups)
    return int((box / "uid").read_text())


def test_two_installations_never_share_a_uid_for_the_same_sandbox_id(tmp_path: Path) -> None:
    registry = tmp_path / "registry"  # stands in for the host's (UID_REGISTRY)
    first, second = (Bubblewrap(tmp_path / name, uid_registry=registry) for name in ("checkout-a", "checkout-b"))
    uids = [_uid_of(c, tmp_path / name / "sandboxes" / f"ses-{i}")
            for i in range(5) for c, name in ((first, "checkout-a"), (second, "checkout-b"))]
    assert len(set(uids)) == len(uids) and all(UID_BASE <= uid < UID_BASE + UID_RANGE for uid in uids)
    again = tmp_path / "checkout-a" / "sandboxes" / "ses-0"
    assert _uid_of(first, again) == uids[0]  # a resumed sandbox keeps its UID (its files are its own)


def test_a_destroyed_sandboxs_uid_is_free_again_and_a_shared_one_is_refused(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    first, second = Bubblewrap(tmp_path / "a", uid_registry=registry), Bubblewrap(tmp_path / "b", uid_registry=registry)
    box = tmp_path / "a" / "sandboxes" / "ses-x"
    uid = _uid_of(first, box)
    # An installation from before the registry recorded the same UID for its own sandbox: refused.
    twin = tmp_path / "b" / "sandboxes" / "ses-x"
    twin.mkdir(parents=True)
    (twin / "uid").write_text(str(uid))
    with pytest.raises(RuntimeError, match=f"host UID {uid} .* also held by {box}"):
        second.prepare(twin, "ses-x")
    shutil.rmtree(box)  # destroyed: its claim is stale
    assert _uid_of(second, twin) == uid
