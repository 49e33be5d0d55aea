"""Every check of a value that reaches a path, a command line or a shell-sourced file is a full match: the
value with a trailing newline (which `re.match(r"...$")` lets through, `$` matching before it) is refused."""

import pytest

from rdna1_kmgr.core import user_input
from rdna1_kmgr.core.errors import HostError, UsageError
from rdna1_kmgr.source import apt_sources, debian_archive, fedora_srpm, tarball_fetch
from rdna1_kmgr.userspace import profiles

SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # sha256 of nothing


def _profile_value(value: str):
    return profiles._profile("t", {"summary": "s", "set": {"HSA_OVERRIDE_GFX_VERSION": value}})


def _profile_name(name: str):
    return profiles._profile("t", {"summary": "s", "set": {name: "1"}})


CHECKS = [
    ("kernel release", user_input.kernel_release, "6.1.0-56-amd64", UsageError),
    ("PCI address", user_input.pci_address, "0000:03:00.0", UsageError),
    ("short PCI address", user_input.pci_address, "03:00.0", UsageError),
    ("Debian version", debian_archive.check_debian_version, "6.1.192-2", UsageError),
    ("Debian package", debian_archive._check_package, "linux-source-6.1", UsageError),
    ("SHA-256", tarball_fetch.check_sha256, SHA256, UsageError),
    ("profile value", _profile_value, "10.3.0", ValueError),
    ("profile variable", _profile_name, "HSA_OVERRIDE_GFX_VERSION", ValueError),
]


@pytest.mark.parametrize(("what", "check", "valid", "error"), CHECKS, ids=[c[0] for c in CHECKS])
def test_a_valid_value_passes_and_the_same_with_a_trailing_newline_is_refused(what, check, valid, error):
    check(valid)
    with pytest.raises(error):
        check(valid + "\n")


def test_a_suite_with_a_trailing_newline_is_refused():
    with pytest.raises(UsageError, match="invalid suite name"):
        debian_archive.PrivateArchive("bookworm\n", codename="bookworm")
    with pytest.raises(HostError, match="invalid suite name"):
        apt_sources.archive_for("bookworm\n", "bookworm", entries=[])


def test_a_fedora_release_with_a_trailing_newline_is_not_fedoras():
    assert fedora_srpm.fedora_kernel("6.11.4-301.fc41.x86_64") is not None
    assert fedora_srpm.fedora_kernel("6.11.4-301.fc41.x86_64\n") is None


def test_a_kernel_release_with_a_newline_never_names_a_folder(tmp_path):
    (tmp_path / "6.1.0-56-amd64\n").mkdir()
    (tmp_path / "6.1.0-56-amd64").mkdir()
    assert [release for release, _ in user_input.named_by_release(tmp_path)] == ["6.1.0-56-amd64"]


def test_a_user_name_is_a_full_match():
    assert user_input.user_name("owner") == "owner"
    for bad in ("owner\n", "../root", "-rf", "a b", "", "x" * 40):
        with pytest.raises(UsageError, match="is not a user name"):
            user_input.user_name(bad)
