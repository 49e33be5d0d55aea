"""Every name host/platforms.toml holds has a strategy or says it is unsupported (rdna1_kmgr/conformance.py)."""

import copy

import pytest

from rdna1_kmgr import conformance
from rdna1_kmgr.host import platform
from rdna1_kmgr.install import initramfs
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


def test_the_table_says_proven_only_where_it_ran():
    table = "\n".join(conformance.markdown_table())
    debian = next(line for line in table.splitlines() if line.startswith("| debian |"))
    ubuntu = next(line for line in table.splitlines() if line.startswith("| ubuntu |"))
    arch = next(line for line in table.splitlines() if line.startswith("| arch |"))
    assert "**proven**: `debian-archive`" in debian
    assert "**proven**" not in ubuntu  # the same apt code, never run on Ubuntu here
    assert "missing: mkinitcpio is refused" in arch
