"""detect: fixture trees prove the reading of each shape of machine; the real run proves it on this one."""

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sysfs_fixtures as fx
from click.testing import CliRunner

from rdna1_kmgr.cli import main
from rdna1_kmgr.core.errors import HostError, UsageError
from rdna1_kmgr.host import host_facts, sysfs


def bdfs(devices) -> list[str]:
    return [dev.bdf for dev in devices]


def snapshot(root: Path) -> dict:
    """Every path under root with its link target or content: to prove detect changes nothing."""
    state = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            state[str(path)] = ("link", os.readlink(path))
        elif path.is_file():
            state[str(path)] = ("file", path.read_bytes())
        else:
            state[str(path)] = ("dir",)
    return state


# ---- fixture trees -------------------------------------------------------------------------------------


def test_rx5600xt_with_its_audio(tmp_path):
    fx.rx5600xt(tmp_path)
    before = snapshot(tmp_path)
    facts = host_facts.detect(tmp_path)
    assert snapshot(tmp_path) == before

    assert facts.kernel_release == "6.1.0-56-amd64"
    assert (facts.distro_id, facts.distro_version) == ("debian", "12")
    assert facts.distro_name == "Debian GNU/Linux 12 (bookworm)"
    # Only the GPU is a display device: the audio function, the NVMe and the host bridge are not.
    assert bdfs(facts.display_devices) == ["0000:0a:00.0"]
    gpu = facts.display_devices[0]
    assert (gpu.vendor, gpu.device, gpu.pci_class) == (0x1002, 0x731F, 0x030000)
    assert gpu.driver == "amdgpu"
    assert gpu.boot_vga is True
    assert gpu.iommu_group == 14
    assert gpu.group_members == ("0000:0a:00.1",)  # the audio goes with it, the GPU itself is not listed
    assert gpu.reset_method == ("bus",)
    assert bdfs(facts.rdna1_devices) == ["0000:0a:00.0"]
    assert facts.target == gpu
    assert facts.headers_path == "/lib/modules/6.1.0-56-amd64/build"
    assert facts.headers_present is True
    assert facts.dkms_version is None  # not asked of the host when reading a fixture
    assert (facts.secure_boot_enabled, facts.secure_boot_state) == (True, "enabled")
    assert facts.iommu_enabled is True
    assert facts.kvm_present is True


def test_rx5700xt_bios_no_iommu_unbound(tmp_path):
    fx.rx5700xt(tmp_path)
    facts = host_facts.detect(tmp_path)
    assert facts.kernel_release == "5.10.0-28-amd64"
    assert (facts.distro_id, facts.distro_version) == ("ubuntu", "22.04")  # the tree's, not this host's
    assert bdfs(facts.display_devices) == ["0000:03:00.0"]
    gpu = facts.display_devices[0]
    assert gpu.driver is None
    assert gpu.iommu_group is None
    assert gpu.group_members == ()
    assert gpu.reset_method is None  # no reset_method file (kernels before 5.15)
    # The RX 5700 XT shares 0x731F with the RX 5600 XT, so it is the default target too.
    assert bdfs(facts.rdna1_devices) == ["0000:03:00.0"]
    assert facts.target.bdf == "0000:03:00.0"
    assert facts.headers_present is False
    assert (facts.secure_boot_enabled, facts.secure_boot_state) == (False, "unsupported (BIOS boot)")
    assert facts.iommu_enabled is False
    assert facts.kvm_present is False


def test_non_amd_gpu_is_listed_but_not_rdna1(tmp_path):
    fx.nvidia(tmp_path)
    facts = host_facts.detect(tmp_path)
    assert bdfs(facts.display_devices) == ["0000:01:00.0"]
    gpu = facts.display_devices[0]
    assert (gpu.vendor, gpu.device, gpu.driver) == (0x10DE, 0x2484, "nouveau")
    assert gpu.group_members == ("0000:01:00.1",)
    assert facts.rdna1_devices == ()
    assert facts.target is None
    assert (facts.secure_boot_enabled, facts.secure_boot_state) == (False, "disabled")
    assert facts.iommu_enabled is True


def test_two_gpus_target_is_the_5600xt_not_the_first(tmp_path):
    fx.two_gpus(tmp_path)
    facts = host_facts.detect(tmp_path)
    assert facts.kernel_release == "6.12.95+deb12-amd64"
    assert facts.headers_present is True
    assert bdfs(facts.display_devices) == ["0000:03:00.0", "0000:0b:00.0"]
    assert bdfs(facts.rdna1_devices) == ["0000:03:00.0", "0000:0b:00.0"]
    assert facts.target.bdf == "0000:0b:00.0"
    first, second = facts.display_devices
    assert first.group_members == ("0000:03:00.1",)
    assert second.group_members == ("0000:0b:00.1",)
    assert (second.driver, second.boot_vga) == ("vfio-pci", False)
    assert second.reset_method == ("device_specific", "bus")
    assert (facts.secure_boot_enabled, facts.secure_boot_state) == (False, "unsupported (no SecureBoot variable)")

    # Another RDNA1 board can be the target.
    other = host_facts.detect(tmp_path, target=0x7340)
    assert other.target.bdf == "0000:03:00.0"
    # An RDNA1 id no board here has: no target, and no failure.
    assert host_facts.detect(tmp_path, target=0x7310).target is None


def test_no_gpu(tmp_path):
    fx.no_gpu(tmp_path)
    facts = host_facts.detect(tmp_path)
    assert facts.display_devices == ()
    assert facts.rdna1_devices == ()
    assert facts.target is None
    assert facts.iommu_enabled is False
    assert facts.to_json()["rdna1_gpus"] == []
    assert facts.to_json()["target"] == {"device_id": "0x731F", "chip": "navi10", "bdf": None}


def test_json_shape_of_a_device(tmp_path):
    fx.rx5600xt(tmp_path)
    out = host_facts.detect(tmp_path).to_json()
    assert out["display_devices"] == [
        {
            "bdf": "0000:0a:00.0",
            "vendor": "0x1002",
            "device": "0x731F",
            "class": "0x030000",
            "driver": "amdgpu",
            "boot_vga": True,
            "iommu_group": 14,
            "group_members": ["0000:0a:00.1"],
            "reset_method": ["bus"],
            "rdna1": True,
            "chip": "navi10",
            "target": True,
        }
    ]
    assert out["target"]["bdf"] == "0000:0a:00.0"
    assert out["headers"] == {"path": "/lib/modules/6.1.0-56-amd64/build", "present": True}
    assert out["secure_boot"] == {"enabled": True, "state": "enabled"}
    json.dumps(out)  # serialisable as is


def test_headers_link_is_followed_inside_the_sysroot_only(tmp_path):
    fx.FakeSysroot(tmp_path).kernel("6.1.0-56-amd64")
    build = tmp_path / "lib/modules/6.1.0-56-amd64/build"
    build.parent.mkdir(parents=True)
    # Debian's absolute link. Its target exists on this host (linux-headers-6.1.0-56-amd64), not in the tree.
    build.symlink_to("/usr/src/linux-headers-6.1.0-56-amd64")
    assert host_facts.detect(tmp_path).headers_present is False
    (tmp_path / "usr/src/linux-headers-6.1.0-56-amd64").mkdir(parents=True)
    assert host_facts.detect(tmp_path).headers_present is True


def test_read_device_and_errors(tmp_path):
    fx.rx5600xt(tmp_path)
    audio = sysfs.read_device("0000:0a:00.1", tmp_path)
    assert (audio.pci_class, audio.is_display, audio.group_members) == (0x040300, False, ("0000:0a:00.0",))
    assert audio.boot_vga is None
    assert bdfs(sysfs.list_devices(tmp_path)) == ["0000:00:00.0", "0000:01:00.0", "0000:0a:00.0", "0000:0a:00.1"]
    with pytest.raises(HostError, match="no PCI device 0000:0c:00.0"):
        sysfs.read_device("0000:0c:00.0", tmp_path)


def test_target_must_be_rdna1(tmp_path):
    fx.no_gpu(tmp_path)
    with pytest.raises(UsageError, match="0x73BF is not an RDNA1 device id"):
        host_facts.detect(tmp_path, target=0x73BF)  # an RX 6800 (RDNA2)


def test_tree_without_kernel_release_is_a_host_error(tmp_path):
    with pytest.raises(HostError, match="osrelease is missing"):
        host_facts.detect(tmp_path)


# ---- the real machine ----------------------------------------------------------------------------------


def real_display_bdfs() -> list[str]:
    """The oracle, read without rdna1_kmgr: every PCI function whose class byte is 0x03."""
    root = Path("/sys/bus/pci/devices")
    if not root.is_dir():
        return []
    return sorted(d.name for d in root.iterdir() if (d / "class").read_text().startswith("0x03"))


def real_rdna1_bdfs() -> list[str]:
    ids = {"0x7310", "0x7312", "0x7318", "0x7319", "0x731a", "0x731b", "0x731e", "0x731f",
           "0x7340", "0x7341", "0x7347", "0x734f", "0x7360", "0x7362"}  # fmt: skip
    root = Path("/sys/bus/pci/devices")
    return [
        bdf
        for bdf in real_display_bdfs()
        if (root / bdf / "vendor").read_text().strip() == "0x1002"
        and (root / bdf / "device").read_text().strip() in ids
    ]


def test_real_host():
    facts = host_facts.detect()
    assert facts.kernel_release == os.uname().release
    assert facts.distro_id == platform.freedesktop_os_release()["ID"]
    assert facts.distro_version == platform.freedesktop_os_release().get("VERSION_ID", "")
    assert bdfs(facts.display_devices) == real_display_bdfs()
    assert bdfs(facts.rdna1_devices) == real_rdna1_bdfs()
    assert facts.headers_present == os.path.exists(f"/lib/modules/{os.uname().release}/build")
    assert facts.kvm_present == os.path.exists("/dev/kvm")
    assert facts.iommu_enabled == bool(os.listdir("/sys/kernel/iommu_groups") or os.listdir("/sys/class/iommu"))
    assert facts.secure_boot_enabled is False or os.path.isdir("/sys/firmware/efi")
    if shutil.which("dkms"):
        out = subprocess.run(["dkms", "--version"], capture_output=True, text=True, check=True).stdout
        assert facts.dkms_version and facts.dkms_version in out
    else:
        assert facts.dkms_version is None


def test_real_cli_json_exits_0():
    result = CliRunner().invoke(main, ["detect", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["kernel_release"] == os.uname().release
    assert out["rdna1_gpus"] == real_rdna1_bdfs()  # none on this machine
    assert out["kvm_present"] == os.path.exists("/dev/kvm")


def test_real_cli_text_says_when_there_is_no_rdna1_gpu():
    result = CliRunner().invoke(main, ["detect"])
    assert result.exit_code == 0
    assert os.uname().release in result.stdout
    assert ("no RDNA1 GPU found" in result.stdout) == (real_rdna1_bdfs() == [])


def test_installed_console_script_runs():
    script = shutil.which("rdna1-kmgr") or str(Path(sys.executable).parent / "rdna1-kmgr")
    proc = subprocess.run([script, "detect", "--json"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["kernel_release"] == os.uname().release


# ---- the command line on fixtures and bad input --------------------------------------------------------


def test_cli_json_on_a_fixture(tmp_path):
    fx.two_gpus(tmp_path)
    result = CliRunner().invoke(main, ["detect", "--json", "--sysroot", str(tmp_path), "--target", "0x7340"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["target"] == {"device_id": "0x7340", "chip": "navi14", "bdf": "0000:03:00.0"}
    assert [d["target"] for d in out["display_devices"]] == [True, False]


def test_cli_text_on_a_fixture(tmp_path):
    fx.rx5600xt(tmp_path)
    result = CliRunner().invoke(main, ["detect", "--sysroot", str(tmp_path)])
    assert result.exit_code == 0, result.output
    gpu_line = next(line for line in result.stdout.splitlines() if "0000:0a:00.0" in line)
    assert "1002:731f" in gpu_line and "amdgpu" in gpu_line and "0000:0a:00.1" in gpu_line
    assert "TARGET" in gpu_line and "RDNA1 navi10" in gpu_line
    assert "no RDNA1 GPU" not in result.stdout
    assert re.search(r"^target .*: 0000:0a:00\.0$", result.stdout, re.M)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--target", "0x1234"], "0x1234 is not an RDNA1 device id"),
        (["--target", "zz"], "invalid PCI device id 'zz'"),
        (["--sysroot", "/nonexistent/root"], "sysroot '/nonexistent/root' is not a directory"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(args, says):
    result = CliRunner().invoke(main, ["detect", "--json", *args])
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rdna1-kmgr: error: ") and says in lines[0]
    # --json: the same error, as the reference's error object (tests/test_json_errors.py checks its schema)
    assert says in json.loads(result.stdout)["error"]["what"]


def test_the_default_devices_are_every_id_of_the_rdna1_chips_found(tmp_path):
    # ids from amdgpu's pciidlist (host/rdna1_boards.py): navi14 0x7340 0x7341 0x7347 0x734F, navi10 eight ids
    both = host_facts.board_devices(fx.two_gpus(tmp_path / "two").root)
    assert both.ids == (0x7310, 0x7312, 0x7318, 0x7319, 0x731A, 0x731B, 0x731E, 0x731F, 0x7340, 0x7341, 0x7347, 0x734F)
    assert [d.bdf for d in both.found] == ["0000:03:00.0", "0000:0b:00.0"]
    # no RDNA1 board (an NVIDIA one, none at all): the RX 5600 XT's id, a build host's default
    for fixture in (fx.nvidia, fx.no_gpu):
        none = host_facts.board_devices(fixture(tmp_path / fixture.__name__).root)
        assert none.ids == (0x731F,) and none.found == ()
        assert none.describe().startswith("devices 0x731F (no RDNA1 board found here")
