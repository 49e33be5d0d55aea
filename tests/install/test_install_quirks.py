"""`install --quirks MASK`: the experiment's pick written as the module's rdna1_quirks in modprobe.d,
journaled like every install, replaced by another mask, undone by rollback; a mask beyond the build is
refused with nothing changed. The scratch systems and their real dkms/depmod/initramfs come from
test_module_install."""

from install_checks import assert_same_system
from install_system import (  # noqa: F401  (fixtures)
    fake_tools,
    one_error_line,
    pristine,
    system,
)

from rdna1_kmgr.render import quirk_catalog

BITS = sorted(1 << q.bit for q in quirk_catalog.load_quirks().values())
BUILT = sum(BITS)  # the stand-in build carries every quirk of the catalog


def options(system) -> list[str]:
    conf = system.root / "etc/modprobe.d/rdna1-kmgr.conf"
    return [line for line in conf.read_text().splitlines() if line.startswith("options ")]


def test_install_quirks_writes_the_mask_and_another_mask_replaces_it(system):
    before = system.hash()
    proc = system.install("--quirks", hex(BITS[0]))
    assert proc.returncode == 0, proc.stderr
    assert options(system) == [f"options amdgpu rdna1_quirks=0x{BITS[0]:x}"]
    assert system.resolves_to() == system.installed_path

    proc = system.install("--quirks", "0")
    assert proc.returncode == 0, proc.stderr
    assert options(system) == ["options amdgpu rdna1_quirks=0x0"]
    assert system.journal_kinds()[-1] == "commit"

    assert system.rollback().returncode == 0
    assert_same_system(before, system.hash())


def test_a_mask_beyond_the_build_is_refused_and_nothing_changes(system):
    before = system.hash()
    proc = system.install("--quirks", hex(BUILT << 1 | BUILT))
    assert proc.returncode == 2
    assert "has bits the build lacks" in one_error_line(proc)
    proc = system.install("--quirks", "lots")
    assert proc.returncode == 2 and "invalid quirk mask 'lots'" in one_error_line(proc)
    assert_same_system(before, system.hash())
    assert system.journal_kinds() == []
