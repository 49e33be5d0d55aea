"""Every name host/platforms.toml holds has a strategy or says it is unsupported (rdna1_kmgr/conformance.py)."""

import copy

import pytest
from sysfs_fixtures import FakeSysroot

from rdna1_kmgr import conformance
from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.follow import hooks
from rdna1_kmgr.host import platform, system_identity
from rdna1_kmgr.install import boot_guard, initramfs
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.modbuild import prerequisites
from rdna1_kmgr.source import distro_source


def test_every_record_and_axis_has_a_strategy_or_an_unsupported_entry():
    names = [record.name for record in platform.entries()]
    assert {"ubuntu", "debian", "fedora", "arch"} <= set(names)
    for record in platform.entries():
        for axis in conformance.AXES:
            conformance.standing(record, axis)  # raises NoStrategy


@pytest.mark.parametrize(
    "field, value",
    [
        ("kernel_source", "gentoo-ebuild"),  # a fetcher no stage has
        ("package_manager", "zypper"),
        ("initramfs_tool", "booster"),
        ("boot_loader", "refind"),
        ("kernel_hooks", "zypper-plugins"),
    ],
)
def test_a_record_naming_a_strategy_no_stage_has_fails(monkeypatch, field, value):
    data = copy.deepcopy(platform._data())
    data["platforms"]["opensuse"] = {**data["platforms"]["debian"], "ids": ["opensuse-tumbleweed"], field: value}
    monkeypatch.setattr(platform, "_data", lambda: data)
    record = platform.named("opensuse")
    axis = next(axis for axis in conformance.AXES if axis.field == field)
    with pytest.raises(conformance.NoStrategy, match=f"opensuse names {field} '{value}', which no stage knows"):
        conformance.standing(record, axis)


def test_a_strategy_added_to_a_registry_without_its_standing_fails(monkeypatch):
    monkeypatch.delitem(conformance.STRATEGIES, ("package_manager", "apt"))
    axis = next(axis for axis in conformance.AXES if axis.field == "package_manager")
    with pytest.raises(conformance.NoStrategy, match="has no standing"):
        conformance.standing(platform.named("debian"), axis)


def test_the_registries_the_table_reads_are_the_ones_the_stages_use():
    # a registry's names, as the stages look them up (not conformance's copy of them)
    assert set(distro_source.FETCHERS) == {"debian-archive", "ubuntu-archive"}
    assert set(initramfs.TOOLS) == {"update-initramfs", "dracut", "mkinitcpio"}
    assert set(prerequisites.MANAGERS) == {"apt", "dnf", "pacman"}
    assert set(boot_guard.BOOT_LOADERS) == {"grub"}
    assert set(hooks.KERNEL_HOOKS) == {"debian-kernel-hooks"}


def test_the_table_says_proven_only_where_it_ran():
    table = "\n".join(conformance.markdown_table())
    debian = next(line for line in table.splitlines() if line.startswith("| debian |"))
    ubuntu = next(line for line in table.splitlines() if line.startswith("| ubuntu |"))
    arch = next(line for line in table.splitlines() if line.startswith("| arch |"))
    assert "**proven**: `debian-archive`" in debian
    assert "**proven**" not in ubuntu  # the same apt code, never run on Ubuntu here
    assert "missing: mkinitcpio is refused" in arch
    assert "**proven**: `grub`: update-grub and grubenv" in debian
    assert "**proven**: `debian-kernel-hooks`: /etc/kernel/postinst.d" in debian
    assert "written: `grub`: the code proven on debian" in ubuntu  # Debian's GRUB and hooks, never run on Ubuntu
    assert "written: `debian-kernel-hooks`: the code proven on debian" in ubuntu
    assert "missing: neither systemd-boot nor GRUB without update-grub" in arch
    assert "missing: no pacman hook is placed" in arch


@pytest.mark.parametrize("field", ["boot_loader", "kernel_hooks"])
def test_a_record_naming_no_boot_loader_or_hooks_fails_unless_it_says_unsupported(monkeypatch, field):
    data = copy.deepcopy(platform._data())
    del data["platforms"]["debian"][field]
    monkeypatch.setattr(platform, "_data", lambda: data)
    axis = next(axis for axis in conformance.AXES if axis.field == field)
    with pytest.raises(conformance.NoStrategy, match=f"debian names no {field}"):
        conformance.standing(platform.named("debian"), axis)
    assert isinstance(conformance.standing(platform.named("fedora"), axis)[1], conformance.Unsupported)


def _system(tmp_path, distro_id: str, version: str, pretty_name: str) -> FakeSysroot:
    return FakeSysroot(tmp_path / distro_id).kernel("6.1.0-56-amd64").os_release(distro_id, version, pretty_name)


def test_the_boot_guard_asks_the_registry_for_the_boot_loader_the_record_names(tmp_path, monkeypatch):
    fedora = system_identity.read(_system(tmp_path, "fedora", "41", "Fedora Linux 41").root)
    monkeypatch.setattr(system_identity, "read", lambda *args: fedora)  # this machine, as Fedora
    assert boot_guard.unavailable(TargetRoot()) == (
        "fedora's boot loader (grub2-bls) is not one rdna1-kmgr drives (GRUB through update-grub)"
    )

    class Bls:  # a strategy registered under the record's name is the one asked
        def unavailable(self, root: TargetRoot) -> str | None:
            return "the grub2-bls strategy was asked"

    monkeypatch.setitem(boot_guard.BOOT_LOADERS, "grub2-bls", Bls())
    assert boot_guard.unavailable(TargetRoot()) == "the grub2-bls strategy was asked"


def test_hooks_install_places_the_hooks_the_record_names_and_refuses_where_it_names_none(tmp_path):
    debian = _system(tmp_path, "debian", "12", "Debian GNU/Linux 12 (bookworm)")
    placed = [hook.where for hook in hooks.hooks_for(TargetRoot(debian.root))]
    assert "etc/kernel/postinst.d/rdna1-kmgr" in placed and "etc/apt/apt.conf.d/80rdna1-kmgr" in placed
    arch = _system(tmp_path, "arch", "", "Arch Linux")
    with pytest.raises(HostError) as err:
        hooks.hooks_for(TargetRoot(arch.root))
    assert err.value.line() == (
        "rdna1-kmgr places no kernel hooks on arch (pacman-hooks): after installing a kernel, run "
        "`rdna1-kmgr follow --kernel KREL` for it yourself"
    )
