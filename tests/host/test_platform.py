"""rdna1_kmgr.host.platform: each supported distribution's record, found from its own os-release.

The os-release texts are the distributions' own (their documented /etc/os-release of these releases); the
expected records are what each distribution ships: its package manager, where its DKMS (or shim-signed, or
akmods) keeps the signing key, its default initramfs tool, and where its kernel source comes from.
"""

from pathlib import Path

import apt_fixtures
import pytest
import ubuntu_fixtures

from rdna1_kmgr.core.errors import HostError, UsageError
from rdna1_kmgr.host import platform, system_identity
from rdna1_kmgr.modbuild import prerequisites

UBUNTU_NOBLE = ubuntu_fixtures.OS_RELEASE  # Ubuntu 24.04's os-release, as the Ubuntu fixtures use it

DEBIAN_BOOKWORM = apt_fixtures.DEBIAN_BOOKWORM_OS_RELEASE

LINUX_MINT = """NAME="Linux Mint"
VERSION="21.3 (Virginia)"
ID=linuxmint
ID_LIKE="ubuntu debian"
PRETTY_NAME="Linux Mint 21.3"
VERSION_ID="21.3"
VERSION_CODENAME=virginia
UBUNTU_CODENAME=jammy
"""

FEDORA_41 = """NAME="Fedora Linux"
VERSION="41 (Workstation Edition)"
ID=fedora
VERSION_ID=41
VERSION_CODENAME=""
PLATFORM_ID="platform:f41"
PRETTY_NAME="Fedora Linux 41 (Workstation Edition)"
VARIANT_ID=workstation
"""

ROCKY_9 = """NAME="Rocky Linux"
VERSION="9.4 (Blue Onyx)"
ID="rocky"
ID_LIKE="rhel centos fedora"
VERSION_ID="9.4"
PRETTY_NAME="Rocky Linux 9.4 (Blue Onyx)"
"""

ARCH = """NAME="Arch Linux"
PRETTY_NAME="Arch Linux"
ID=arch
BUILD_ID=rolling
ANSI_COLOR="38;2;23;147;209"
HOME_URL="https://archlinux.org/"
LOGO=archlinux-logo
"""

ENDEAVOUROS = """NAME="EndeavourOS"
PRETTY_NAME="EndeavourOS"
ID="endeavouros"
ID_LIKE="arch"
BUILD_ID=rolling
"""

GENTOO = """NAME=Gentoo
ID=gentoo
PRETTY_NAME="Gentoo Linux"
VERSION_ID="2.15"
"""


def sysroot(tmp_path: Path, os_release: str, release: str = "6.1.0-56-amd64") -> system_identity.SystemIdentity:
    (tmp_path / "etc").mkdir(parents=True)
    (tmp_path / "etc/os-release").write_text(os_release)
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/osrelease").write_text(release + "\n")
    return system_identity.read(tmp_path)


@pytest.mark.parametrize(
    "os_release, name, codename",
    [
        (UBUNTU_NOBLE, "ubuntu", "noble"),
        (DEBIAN_BOOKWORM, "debian", "bookworm"),
        (LINUX_MINT, "ubuntu", "virginia"),  # ID_LIKE="ubuntu debian": Ubuntu's, not Debian's
        (FEDORA_41, "fedora", None),  # the codename only Debian's and Ubuntu's archives use
        (ROCKY_9, "fedora", None),
        (ARCH, "arch", None),
        (ENDEAVOUROS, "arch", None),
    ],
)
def test_a_system_is_the_platform_its_os_release_says(tmp_path, os_release, name, codename):
    system = sysroot(tmp_path, os_release)
    assert system.platform.name == name
    assert codename is None or system.codename == codename
    assert system.platform.supported
    assert system.to_json()["family"] == name


# What each distribution ships, from its own documentation: package manager, the MOK pair its DKMS signs
# with when told nothing, the initramfs tool it installs by default, the kind of its kernel source, its boot
# loader (Arch installs none: archinstall's default on UEFI) and where its packages run a kernel's hooks.
SHIPPED = {
    "ubuntu": (
        "apt",
        "/var/lib/shim-signed/mok/MOK.priv",
        "/var/lib/shim-signed/mok/MOK.der",
        "update-initramfs",
        "ubuntu-archive",
        "grub",
        "debian-kernel-hooks",
    ),
    "debian": (
        "apt",
        "/var/lib/dkms/mok.key",
        "/var/lib/dkms/mok.pub",
        "update-initramfs",
        "debian-archive",
        "grub",
        "debian-kernel-hooks",
    ),
    "fedora": (
        "dnf",
        "/etc/pki/akmods/private/private_key.priv",
        "/etc/pki/akmods/certs/public_key.der",
        "dracut",
        "fedora-srpm",
        "grub2-bls",
        "kernel-install",
    ),
    "arch": (
        "pacman",
        "/var/lib/dkms/mok.key",
        "/var/lib/dkms/mok.pub",
        "mkinitcpio",
        "arch-pkgbuild",
        "systemd-boot",
        "pacman-hooks",
    ),
}


@pytest.mark.parametrize("os_release", [UBUNTU_NOBLE, DEBIAN_BOOKWORM, FEDORA_41, ARCH])
def test_each_platform_names_its_distributions_own_ways(tmp_path, os_release):
    record = sysroot(tmp_path, os_release).platform
    shipped = (
        record.package_manager,
        str(record.key_pair.key),
        str(record.key_pair.cert),
        record.initramfs_tool,
        record.kernel_source,
        record.boot_loader,
        record.kernel_hooks,
    )
    assert shipped == SHIPPED[record.name]


def test_every_data_entry_is_one_of_the_four_in_match_order():
    assert [record.name for record in platform.entries()] == ["ubuntu", "debian", "fedora", "arch"]
    assert platform.named("debian") == platform.for_identity("debian", "")


def test_guest_images_are_named_where_they_are_fetched():
    assert platform.named("debian").guest_image_packages("6.1.0-56-amd64") == ["linux-image-6.1.0-56-amd64"]
    assert platform.named("ubuntu").guest_image_packages("6.8.0-48-generic")[0] == (
        "linux-image-unsigned-6.8.0-48-generic"
    )
    assert platform.named("fedora").guest_image_packages("6.11.4-301.fc41.x86_64") == []


def test_an_unknown_distribution_reads_fine_and_fails_only_where_a_strategy_is_needed(tmp_path):
    system = sysroot(tmp_path, GENTOO)
    record = system.platform
    assert (record.name, record.supported, record.package_manager, record.kernel_source) == (
        "gentoo",
        False,
        None,
        None,
    )
    assert system.to_json()["family"] == "gentoo"
    # DKMS's own key pair: a build signs with what DKMS would use by itself.
    assert (str(record.key_pair.key), record.key_pair.name) == ("/var/lib/dkms/mok.key", "debian")
    with pytest.raises(HostError) as err:
        prerequisites.manager_for(record)
    assert err.value.line().startswith("no package manager support for the distribution 'gentoo': install ")


def test_an_unknown_platform_name_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown platform 'gentoo'"):
        platform.named("gentoo")


def test_this_host_has_a_record():
    system = system_identity.read()
    assert system.platform == platform.for_identity(system.distro_id, system.like)
