"""rdna1_kmgr.install.initramfs.detect: the tool a system has, its platform's default first."""

import pytest

from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.host import platform
from rdna1_kmgr.install import initramfs
from rdna1_kmgr.install.target_root import TargetRoot


def test_the_platforms_default_wins_only_among_installed_tools(monkeypatch):
    installed = {"update-initramfs", "dracut"}
    monkeypatch.setattr(
        initramfs.shutil, "which", lambda program: f"/usr/sbin/{program}" if program in installed else None
    )
    root = TargetRoot()
    assert initramfs.detect(root, platform.named("fedora").initramfs_tool).name == "dracut"
    assert initramfs.detect(root, platform.named("debian").initramfs_tool).name == "initramfs-tools"
    assert initramfs.detect(root).name == "initramfs-tools"  # no record: the fixed order
    installed.discard("update-initramfs")  # a Debian system with dracut installed instead uses dracut
    assert initramfs.detect(root, platform.named("debian").initramfs_tool).name == "dracut"
    installed.clear()
    with pytest.raises(HostError, match="no initramfs tool found"):
        initramfs.detect(root, platform.named("arch").initramfs_tool)
