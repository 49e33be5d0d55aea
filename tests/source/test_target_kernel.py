"""Which kernel a command is for: the release asked, else the running one, else the distribution's current one."""

import os
from pathlib import Path

from rdna1_kmgr.source import kernel_source, target_kernel


def test_kernel_release_is_resolved_and_explained(monkeypatch):
    monkeypatch.setattr(
        target_kernel.distro_source,
        "kernel_package",
        lambda release, system: ({"6.1.0-56-amd64": "6.1.192-2"}.get(release), None),
    )
    monkeypatch.setattr(target_kernel, "distro_current_kernel", lambda: "6.1.0-56-amd64")
    monkeypatch.setattr(os, "uname", lambda: os.uname_result(("Linux", "h", "6.18.44-custom", "#1", "x86_64")))
    kernel = target_kernel.resolve_kernel(None)
    assert kernel.release == "6.1.0-56-amd64" and kernel.package_version == "6.1.192-2"
    assert "6.18.44-custom is not a" in kernel.note and "6.1.0-56-amd64" in kernel.note
    assert "building for the distribution's current kernel 6.1.0-56-amd64" in kernel.note
    # install says what it does: no "building for" in a plan that builds nothing
    note = target_kernel.resolve_kernel(None, "planning an install").note
    assert "planning an install for the distribution's current kernel 6.1.0-56-amd64" in note
    assert target_kernel.resolve_kernel("6.1.0-56-amd64").note is None


def test_the_distro_kernel_of_this_machine_is_found():
    release = target_kernel.distro_current_kernel()
    installed = sorted(p.name for p in Path("/lib/modules").iterdir() if (p / "build").exists())
    assert release is not None and release in installed
    assert kernel_source.debian_kernel_version(release)  # e.g. 6.1.192-2 from dpkg
