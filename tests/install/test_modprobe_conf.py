"""The shared /etc/modprobe.d/rdna1-kmgr.conf: derived from every kernel with a finished install, never owned by one.

Fast: journals written through the journal's own API in a scratch state directory. The real two-kernel install
and `rollback --kernel` of one of them is in tests/follow/test_follow_real.py.
"""

import pytest

from rdna1_kmgr.install import journal as jr
from rdna1_kmgr.install import modprobe_conf
from rdna1_kmgr.install.install_begin import InstallBegin
from rdna1_kmgr.install.journal_records import Commit, Rollback
from rdna1_kmgr.modbuild.dkms_package import Package

A, B = "6.1.0-56-amd64", "6.12.95+deb12-amd64"


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path / "state"))
    return tmp_path / "state"


def finished_install(kernel: str, mask: int) -> jr.Journal:
    journal = jr.Journal(kernel)
    journal.begin(
        InstallBegin(
            kernel=kernel,
            root="/",
            package=Package("rdna1-amdgpu", "6.1.192+p0123456789ab"),
            parameters={"rdna1_quirks": f"0x{mask:x}"},
        )
    )
    journal.append(Commit(verified={}))
    return journal


def options_lines(text: str | None) -> list[str]:
    return [line for line in (text or "").splitlines() if not line.startswith("#")]


def test_kernels_that_agree_share_one_options_line():
    text = modprobe_conf.text({A: {"rdna1_quirks": "0x3"}, B: {"rdna1_quirks": "0x3"}})
    assert options_lines(text) == ["options amdgpu rdna1_quirks=0x3"]
    assert text.startswith(modprobe_conf.MARKER)


def test_kernels_that_disagree_get_no_options_line_so_none_gets_anothers_mask():
    text = modprobe_conf.text({A: {"rdna1_quirks": "0x3"}, B: {"rdna1_quirks": "0x1"}})
    assert options_lines(text) == []
    assert f"#   {A}: rdna1_quirks=0x3" in text and f"#   {B}: rdna1_quirks=0x1" in text


def test_no_kernel_installed_means_no_file():
    assert modprobe_conf.text({}) is None


def test_rolling_back_either_kernel_leaves_the_others_line_and_the_last_removes_the_file(state, tmp_path):
    conf = tmp_path / "etc/modprobe.d" / modprobe_conf.NAME
    conf.parent.mkdir(parents=True)
    finished_install(A, 3)
    modprobe_conf.sync(conf)
    first = conf.read_text()
    finished_install(B, 3)
    modprobe_conf.sync(conf)
    assert conf.read_text() == first  # the same parameters: the same bytes (no initramfs goes stale)

    # A is rolled back first, although it was installed first: B's line stays.
    jr.Journal(A).append(Rollback("test", keep_build=False))
    assert modprobe_conf.undo_plan(conf, A) == f"rewrite {conf} for the kernels still installed ({B})"
    modprobe_conf.sync(conf, exclude=A)
    assert options_lines(conf.read_text()) == ["options amdgpu rdna1_quirks=0x3"]

    jr.Journal(B).append(Rollback("test", keep_build=False))
    assert modprobe_conf.undo_plan(conf, B) == f"remove {conf} (if present)"
    assert "removed" in modprobe_conf.sync(conf, exclude=B)
    assert not conf.exists()
    assert "already absent" in modprobe_conf.sync(conf, exclude=B)  # idempotent, as rollback must be


def test_a_file_of_that_name_not_written_by_rdna1_kmgr_is_not_ours(tmp_path):
    conf = tmp_path / modprobe_conf.NAME
    assert modprobe_conf.is_ours(conf)  # absent
    conf.write_text("options amdgpu dc=0\n")
    assert not modprobe_conf.is_ours(conf)
    conf.write_text(modprobe_conf.text({A: {"rdna1_quirks": "0x3"}}))
    assert modprobe_conf.is_ours(conf)
