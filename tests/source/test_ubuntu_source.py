"""rdna1_kmgr.source.ubuntu_source: which Ubuntu build a kernel is, and which package holds its source."""

import pytest
from packaging.version import Version
from ubuntu_fixtures import ubuntu_sysroot

from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.host import system_identity
from rdna1_kmgr.source import kernel_source, ubuntu_source


def test_ubuntu_version_signature_is_parsed():
    assert ubuntu_source.parse_signature("Ubuntu 6.8.0-48.48-generic 6.8.12\n") == ("6.8.0-48.48", "generic", "6.8.12")
    assert ubuntu_source.parse_signature("Ubuntu 6.8.0-48.48~22.04.1-generic 6.8.12") == (
        "6.8.0-48.48~22.04.1",
        "generic",
        "6.8.12",
    )
    assert ubuntu_source.parse_signature("Ubuntu 6.8.0-1015.16-lowlatency-64k 6.8.12") == (
        "6.8.0-1015.16",
        "lowlatency-64k",
        "6.8.12",
    )
    assert ubuntu_source.parse_signature("Linux version 6.1.0-56-amd64") is None


def test_ubuntu_sysroot_is_identified(tmp_path):
    root = ubuntu_sysroot(tmp_path, "6.8.0-48-generic", "6.8.0-48.48", "6.8.12")
    system = system_identity.read(root)
    assert (system.platform.name, system.codename, system.running_release) == ("ubuntu", "noble", "6.8.0-48-generic")
    kernel = ubuntu_source.ubuntu_kernel("6.8.0-48-generic", system)
    assert kernel == ubuntu_source.UbuntuKernel("6.8.0-48-generic", "6.8.0-48.48", "6.8.12", None)
    assert kernel.source_packages == ["linux-source-6.8.0"]
    # Another kernel than the running one: nothing on a sysroot says which build it is.
    assert ubuntu_source.ubuntu_kernel("6.8.0-49-generic", system) is None


def test_ubuntu_hwe_kernel_looks_for_the_hwe_source_package_first(tmp_path):
    root = ubuntu_sysroot(tmp_path, "6.8.0-48-generic", "6.8.0-48.48~22.04.1", "6.8.12")
    kernel = ubuntu_source.ubuntu_kernel("6.8.0-48-generic", system_identity.read(root))
    assert kernel.source_packages == ["linux-hwe-6.8-source-6.8.0", "linux-source-6.8.0"]
    # dpkg names the source package that built it: then only that one.
    assert ubuntu_source.UbuntuKernel(
        "6.8.0-48-generic", "6.8.0-48.48~22.04.1", None, "linux-hwe-6.8"
    ).source_packages == ["linux-hwe-6.8-source-6.8.0"]


def test_ubuntu_signature_of_another_abi_is_refused(tmp_path):
    root = ubuntu_sysroot(tmp_path, "6.8.0-48-generic", "6.8.0-47.47", "6.8.12")
    with pytest.raises(HostError, match="not its ABI"):
        ubuntu_source.ubuntu_kernel("6.8.0-48-generic", system_identity.read(root))


def test_ubuntu_package_versions_name_the_abi_base_not_the_linux_version():
    assert kernel_source.matches_package(Version("6.8.12"), "6.8.0-48.48")
    assert kernel_source.matches_package(Version("6.8.12"), "6.8.0-48.48~22.04.1")
    assert not kernel_source.matches_package(Version("6.9.1"), "6.8.0-48.48")
    assert kernel_source.matches_package(Version("6.1.192"), "6.1.192-2")  # Debian: the Linux version itself
    assert not kernel_source.matches_package(Version("6.1.191"), "6.1.192-2")
