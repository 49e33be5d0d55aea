"""doctor on fixture trees: KFD nodes, device access, the override wherever it hides, the quirk mask, probe
errors, BAR, PyTorch builds. Fast; test_doctor_debian.py reads Debian's real ROCm libraries."""

import os
from pathlib import Path

import pytest
from doctor_checks import GFX1030, HOST, board_root, bundle, by_check, run

from rdna1_kmgr.core.output import to_json
from rdna1_kmgr.doctor import report
from rdna1_kmgr.render import quirk_catalog


def test_kfd_node_and_access_for_a_user_in_render(tmp_path):
    result = run(board_root(tmp_path))
    kfd = by_check(result, "kfd")
    assert [f["level"] for f in kfd] == ["ok"]
    assert "gfx1010 (gfx_target_version 100100)" in kfd[0]["seen"] and "FB_PUBLIC" in kfd[0]["seen"]
    access = by_check(result, "access")[0]
    assert access["level"] == "ok" and "dev/kfd" in access["seen"] and "renderD128" in access["seen"]
    assert result["board_processor"] == "gfx1010" and result["rocm_loads"] == "gfx1010"


def test_a_user_outside_render_is_told_to_join_it(tmp_path):
    result = run(board_root(tmp_path), user="guest")
    access = by_check(result, "access")[0]
    assert access["level"] == "problem"
    assert "`sudo usermod -aG render,video guest`" in access["todo"]
    assert access["facts"]["devices"][str(tmp_path / "root/dev/kfd")]["read_write"] is False


def test_sudo_user_is_the_one_checked(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("SUDO_USER counts only when running as root")
    monkeypatch.setenv("SUDO_USER", "guest")
    result = to_json(report.run(board_root(tmp_path).root, [], None))
    assert result["user"] == "guest" and by_check(result, "access")[0]["level"] == "problem"


@pytest.mark.parametrize(
    "rel,line",
    [
        ("etc/environment", 'HSA_OVERRIDE_GFX_VERSION="10.3.0"'),
        ("etc/environment.d/50-rocm.conf", "HSA_OVERRIDE_GFX_VERSION=10.3.0"),
        ("etc/profile.d/rocm.sh", "export HSA_OVERRIDE_GFX_VERSION=10.3.0  # forum advice"),
        ("etc/security/pam_env.conf", "HSA_OVERRIDE_GFX_VERSION DEFAULT=10.3.0"),
        ("home/owner/.bashrc", "export HSA_OVERRIDE_GFX_VERSION='10.3.0'"),
        ("home/owner/.config/fish/config.fish", "set -gx HSA_OVERRIDE_GFX_VERSION 10.3.0"),
    ],
)
def test_the_override_is_found_wherever_it_is_set(tmp_path, rel, line):
    tree = board_root(tmp_path).file(rel, f"# set by hand\n{line}\n")
    result = run(tree)
    override = by_check(result, "gfx-override")
    assert [f["level"] for f in override] == ["problem"]
    assert f"/{rel}:2" in override[0]["seen"] and "(in force)" in override[0]["seen"]
    assert "gfx1030 code instead of gfx1010" in override[0]["why"]
    assert result["rocm_loads"] == "gfx1030"


def test_an_override_unset_later_is_shown_but_not_in_force(tmp_path):
    tree = board_root(tmp_path).file("etc/profile.d/a-rocm.sh", "export HSA_OVERRIDE_GFX_VERSION=10.3.0\n")
    tree.file("home/owner/.profile", "unset HSA_OVERRIDE_GFX_VERSION\n")
    result = run(tree)
    override = by_check(result, "gfx-override")
    assert len(override) == 1 and "(in force)" not in override[0]["seen"]
    assert result["rocm_loads"] == "gfx1010"


def test_no_override_anywhere_is_ok(tmp_path):
    tree = board_root(tmp_path).file("home/owner/.bashrc", "export PATH=$PATH:/opt/rocm/bin\n")
    assert [f["level"] for f in by_check(run(tree), "gfx-override")] == ["ok"]


def test_the_quirk_mask_is_named_by_the_catalogs_bits(tmp_path):
    catalog = quirk_catalog.load_quirks()
    mask = sum(1 << q.bit for q in catalog.values())
    tree = board_root(tmp_path).file("sys/module/amdgpu/parameters/rdna1_quirks", f"{mask}\n")
    board = by_check(run(tree), "board")[0]
    assert board["level"] == "ok" and f"rdna1_quirks=0x{mask:x}" in board["seen"]
    for quirk in catalog.values():
        assert quirk.id in board["seen"]
    stock = by_check(run(board_root(tmp_path / "stock")), "board")[0]
    assert "stock amdgpu" in stock["seen"]


def test_probe_errors_come_from_the_kernel_log(tmp_path):
    tree = board_root(tmp_path).kmsg(
        "[drm] amdgpu kernel modesetting enabled.",
        "amdgpu 0000:0a:00.0: amdgpu: Fatal error during GPU init",
        "amdgpu: probe of 0000:0a:00.0 failed with error -22",
    )
    errors = by_check(run(tree), "probe-errors")[0]
    assert errors["level"] == "problem" and "probe of 0000:0a:00.0 failed" in errors["seen"]
    assert len(errors["facts"]["lines"]) == 2
    clean = board_root(tmp_path / "clean").kmsg("[drm] amdgpu kernel modesetting enabled.")
    assert by_check(run(clean), "probe-errors")[0]["level"] == "ok"


def test_large_and_small_bar(tmp_path):
    device = "sys/devices/pci0000:00/0000:0a:00.0"
    vram = 6 << 30
    large = board_root(tmp_path / "large").file(f"{device}/mem_info_vram_total", f"{vram}\n")
    large.file(f"{device}/resource", "0x0000007800000000 0x00000079ffffffff 0x000000000014220c\n")
    large.file(f"{device}/resource0_resize", "0000000000003f00\n")
    bar = by_check(run(large), "bar")[0]
    assert "large BAR (BAR0 8192 MiB, VRAM 6144 MiB, resizable)" in bar["seen"]
    small = board_root(tmp_path / "small").file(f"{device}/mem_info_vram_total", f"{vram}\n")
    small.file(f"{device}/resource", "0x00000000e0000000 0x00000000efffffff 0x000000000014220c\n")
    assert "small BAR (BAR0 256 MiB" in by_check(run(small), "bar")[0]["seen"]


def torch_site(root: Path, version: str, hip: str | None, kernels: bytes | None) -> Path:
    site = root / "lib/python3.11/site-packages"
    (site / "torch/lib").mkdir(parents=True)
    (site / "torch/version.py").write_text(
        f"__version__ = '{version}'\ndebug = False\ncuda: Optional[str] = None\n" f"hip: Optional[str] = {repr(hip)}\n"
    )
    if kernels is not None:
        (site / "torch/lib/libtorch_hip.so").write_bytes(b"\x7fELF" + b"\1" * 999 + kernels)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    return site


def test_a_rocm_torch_without_gfx1010_code_is_a_problem(tmp_path):
    tree = board_root(tmp_path)
    venv = tmp_path / "root/home/owner/venv"
    torch_site(venv, "2.4.0+rocm6.1", "6.1.40091", bundle(HOST, GFX1030, "hipv4-amdgcn-amd-amdhsa--gfx1100"))
    torch = by_check(run(tree), "torch")
    assert [f["level"] for f in torch] == ["problem"]
    assert "NO gfx1010 code (it has: gfx1030 gfx1100)" in torch[0]["seen"]
    assert "invalid device function" in torch[0]["why"]


def test_a_named_venv_is_read_and_generic_rdna1_code_counts(tmp_path):
    tree = board_root(tmp_path)
    venv = tmp_path / "root/srv/torch-venv"  # under --sysroot a named path is inside the sysroot
    torch_site(venv, "2.9.0+rocm7.0", "7.0.1", bundle(HOST, "hipv4-amdgcn-amd-amdhsa--gfx10-1-generic"))
    (venv / "bin").mkdir()
    (venv / "bin/python3").write_text("")
    torch = by_check(run(tree, pythons=["/srv/torch-venv/bin/python3"]), "torch")
    assert [f["level"] for f in torch] == ["ok"] and str(venv) in torch[0]["seen"]


def test_missing_python_path_is_bad_input(tmp_path):
    from rdna1_kmgr.core.errors import UsageError

    with pytest.raises(UsageError, match="does not exist"):
        run(board_root(tmp_path), pythons=[str(tmp_path / "nope")])


def test_links_out_of_the_owners_home_are_not_followed_as_root(tmp_path, monkeypatch):
    """Issue 40: doctor runs as root and read whatever the owner's files linked to. A ~/.bashrc linked to
    /etc/shadow is never opened; one linked to a file outside the home that sets the override (a stand-in
    whose content would show) is not read; a venv that is a link out of the home is no site of the owner's,
    and a libtorch_hip.so linked out of its venv is not scanned."""
    import builtins
    import io

    tree = board_root(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "rocm.sh").write_text("export HSA_OVERRIDE_GFX_VERSION=10.3.0\n")
    home = tmp_path / "root/home/owner"
    home.mkdir(parents=True, exist_ok=True)
    (home / ".bashrc").symlink_to("/etc/shadow")
    (home / ".profile").symlink_to(outside / "rocm.sh")
    torch_site(outside / "venv", "2.4.0+rocm6.1", "6.1.40091", bundle(HOST, GFX1030))
    (home / "venv").symlink_to(outside / "venv")
    torch_site(home / "own", "2.5.0+rocm6.2", "6.2.41133", None)
    (home / "own/lib/python3.11/site-packages/torch/lib/libtorch_hip.so").symlink_to(
        outside / "venv/lib/python3.11/site-packages/torch/lib/libtorch_hip.so"
    )
    opened = []
    for module, name in ((builtins, "open"), (io, "open"), (os, "open")):
        real = getattr(module, name)

        def spy(path, *a, _real=real, **k):
            if isinstance(path, str | os.PathLike):
                opened.append(os.path.realpath(path))  # where the open lands, links followed
            return _real(path, *a, **k)

        monkeypatch.setattr(module, name, spy)
    result = run(tree)
    monkeypatch.undo()
    assert not [p for p in opened if p == "/etc/shadow" or p.startswith(str(outside))]
    assert [f["level"] for f in by_check(result, "gfx-override")] == ["ok"]
    torch = by_check(result, "torch")
    assert [f["facts"]["site"] for f in torch] == [str(home / "own/lib/python3.11/site-packages")]
    assert "gfx1030" not in str(torch[0]["facts"]["libtorch_hip"])
