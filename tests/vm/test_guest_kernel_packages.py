"""rdna1_kmgr.vm.guest_kernel.image_packages: which packages hold a bootable kernel, per distribution."""

import pytest

from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.host import platform
from rdna1_kmgr.vm import guest_kernel


def test_ubuntu_guest_kernel_comes_from_its_split_packages():
    assert guest_kernel.image_packages("6.8.0-48-generic", platform.named("ubuntu")) == [
        "linux-image-unsigned-6.8.0-48-generic",
        "linux-modules-6.8.0-48-generic",
        "linux-modules-extra-6.8.0-48-generic",
    ]


def test_debian_guest_kernel_is_one_package():
    assert guest_kernel.image_packages("6.1.0-56-amd64", platform.named("debian")) == ["linux-image-6.1.0-56-amd64"]


def test_a_platform_without_fetched_images_is_refused_before_any_download(tmp_path, monkeypatch):
    monkeypatch.setenv("RDNA1_KMGR_CACHE", str(tmp_path))
    fedora = guest_kernel.system_identity.SystemIdentity(
        tmp_path, "6.11.4-301.fc41.x86_64", "fedora", (), "", None, None, platform.named("fedora")
    )
    monkeypatch.setattr(guest_kernel.system_identity, "read", lambda *args: fedora)
    with pytest.raises(HostError, match="fetching kernel 6.11.4-301.fc41.x86_64's image is not supported on fedora"):
        guest_kernel.fetch_image("6.11.4-301.fc41.x86_64")
