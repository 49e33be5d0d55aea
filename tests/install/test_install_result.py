"""InstallResult: `install --json`'s three shapes keep the keys main's install wrote before it became a pipeline
(issue 41), and the result cannot be changed once made."""

import dataclasses
import json

import pytest

from rdna1_kmgr.install.install_result import InstallResult, Verified

# main's module_install.run, read by hand before the change: the plan's dict, the install's, a second install's
PLANNED_KEYS = {"kernel", "package", "package_version", "module_sha256", "vm_check", "parameters", "boot_guard", "plan"}
VERIFIED = Verified("/lib/modules/K/updates/dkms/amdgpu.ko", "ab" * 32, "/boot/initrd.img-K", None)


def planned(**changes) -> InstallResult:
    result = InstallResult(
        "K",
        "rdna1-amdgpu",
        "6.1.192+p0123456789ab",
        True,
        module_sha256="ab" * 32,
        vm_check={"verdict": "pass", "mode": "emulated", "record": "/var/lib/rdna1-kmgr/validations/ab.json"},
        parameters={"rdna1_quirks": "0x3"},
        boot_guard={"off": "GRUB does not boot this machine"},
        plan=("install rdna1-amdgpu/6.1.192+p0123456789ab for kernel K", "1. dkms-install"),
    )
    return dataclasses.replace(result, **changes)


def test_a_plan_has_the_plan_keys():
    out = planned().to_json()
    assert set(out) == PLANNED_KEYS | {"dry_run"} and out["dry_run"] is True
    assert out["plan"] == ["install rdna1-amdgpu/6.1.192+p0123456789ab for kernel K", "1. dkms-install"]
    assert out["parameters"] == {"rdna1_quirks": "0x3"}
    json.dumps(out)  # plain JSON, no mapping proxies


def test_an_install_done_adds_what_was_verified_the_journal_and_the_next_boot():
    done = planned(dry_run=False, verified=VERIFIED, journal="/var/lib/rdna1-kmgr/journal/K/journal.jsonl")
    out = dataclasses.replace(done, next_boot=("Installed it.",)).to_json()
    assert set(out) == PLANNED_KEYS | {"dry_run", "verified", "journal", "next_boot"}
    assert out["verified"] == {
        "module": "/lib/modules/K/updates/dkms/amdgpu.ko",
        "sha256": "ab" * 32,
        "initramfs": "/boot/initrd.img-K",
        "initramfs_module": None,
    }
    assert out["next_boot"] == ["Installed it."] and out["dry_run"] is False
    json.dumps(out)


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_module_installed_already_says_so_with_what_was_verified(dry_run):
    out = InstallResult("K", "rdna1-amdgpu", "6.1.192+p0", dry_run, already_installed=True, verified=VERIFIED).to_json()
    assert out == {
        "kernel": "K",
        "package": "rdna1-amdgpu",
        "package_version": "6.1.192+p0",
        "already_installed": True,
        "dry_run": dry_run,
        "module": "/lib/modules/K/updates/dkms/amdgpu.ko",
        "sha256": "ab" * 32,
        "initramfs": "/boot/initrd.img-K",
        "initramfs_module": None,
    }


def test_the_result_cannot_be_changed():
    result = planned()
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.kernel = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        result.parameters["rdna1_quirks"] = "0x0"  # type: ignore[index]
