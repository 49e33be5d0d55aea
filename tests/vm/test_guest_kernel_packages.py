"""rdna1_kmgr.vm.guest_kernel.image_packages: which packages hold a bootable kernel, per distribution."""

import pytest

from rdna1_kmgr.core.errors import HostError, SourceError
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


def test_an_image_without_a_kernel_is_refused_by_the_packages_there_were(tmp_path, monkeypatch):
    """Ubuntu's modules packages may be missing from every suite searched (not required): the refusal names
    the packages that were downloaded, not the one that was not there."""
    release = "6.8.0-48-generic"
    monkeypatch.setenv("RDNA1_KMGR_CACHE", str(tmp_path))
    ubuntu = guest_kernel.system_identity.SystemIdentity(
        tmp_path, release, "ubuntu", (), "noble", None, None, platform.named("ubuntu")
    )
    monkeypatch.setattr(guest_kernel.system_identity, "read", lambda *args: ubuntu)
    monkeypatch.setattr(guest_kernel, "_suites", lambda system: ("noble",))
    image = tmp_path / f"linux-image-unsigned-{release}_6.8.0-48.48_amd64.deb"
    there = {f"linux-image-unsigned-{release}": image}
    monkeypatch.setattr(guest_kernel, "_download", lambda package, suites, codename, required=True: there.get(package))
    for step in ("_run", "_merge_usr", "_keep_what_a_guest_boots"):
        monkeypatch.setattr(guest_kernel, step, lambda *args: None)
    monkeypatch.setattr(guest_kernel, "keep_guest_modules", lambda tmp, release: (0, 0))
    with pytest.raises(SourceError, match=f"^{image.name} hold no boot/vmlinuz-{release} with its modules$"):
        guest_kernel.fetch_image(release)
