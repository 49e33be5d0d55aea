"""dracut: `rdna1-kmgr install` and `rollback` regenerate a dracut initramfs that carries the installed module,
then the stock one again.

dracut replaces initramfs-tools, so it is never installed on this host: the tests debootstrap a throwaway
Debian root with Debian's dracut package (once per machine, into the persistent test cache, from the archive
the system's apt uses) and copy it per test. The install runs with RDNA1_KMGR_ROOT at that copy; rdna1-kmgr
finds dracut installed there and runs it, and its lsinitrd, inside the root with chroot. The module is the
DKMS-built stand-in of test_module_install (its `pristine` fixture), the stock amdgpu its unsigned twin.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import distro
import pytest
from conftest import persistent_cache_root
from install_checks import verdict_record
from install_system import AMD_TREE, CLI, pristine  # noqa: F401 (pristine: a fixture)
from sysfs_fixtures import FakeSysroot

from rdna1_kmgr.install import initramfs, stock_loader
from rdna1_kmgr.install import journal as jr
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.source import apt_sources
from rdna1_kmgr.vm import verdict

pytestmark = [
    pytest.mark.realsource,  # debootstraps from the system's archive (once per machine)
    pytest.mark.skipif(os.geteuid() != 0, reason="debootstrap, chroot and dkms install need root"),
    pytest.mark.skipif(
        shutil.which("debootstrap") is None, reason="needs debootstrap (./install.sh --test installs it)"
    ),
]

DRACUT_CONF = """# The throwaway root's dracut: a generic image that carries amdgpu, as for early KMS.
hostonly="no"
add_drivers+=" amdgpu "
omit_dracutmodules+=" plymouth "
"""


def dracut_root_template() -> Path:
    """A minimal Debian root of the host's release with dracut installed (debootstrapped once per machine)."""
    codename = distro.codename()
    final = persistent_cache_root() / "roots" / f"{codename}-dracut"
    if (final / "usr/bin/dracut").is_file():
        return final
    staging = final.with_name(f".staging-{final.name}")
    shutil.rmtree(staging, ignore_errors=True)
    entry = apt_sources.archive_for(codename, codename)  # the system's own archive (mirror), not a named host
    env = dict(os.environ)
    proxy = subprocess.run(
        ["apt-config", "shell", "P", "Acquire::http::Proxy"], capture_output=True, text=True
    ).stdout.strip()
    if proxy.startswith("P="):
        env["http_proxy"] = proxy[2:].strip("'")
    proc = subprocess.run(
        [
            "debootstrap",
            "--variant=minbase",
            "--include=dracut,kmod,zstd,cpio,xz-utils,systemd",
            codename,
            str(staging),
            entry.uri,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=3000,
    )
    if proc.returncode != 0:
        pytest.fail(f"debootstrap failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    staging.rename(final)
    return final


@pytest.fixture
def dracut_system(tmp_path, monkeypatch, pristine):  # noqa: F811
    """A copy of the dracut root holding kernel `pristine.kernel` with the stock amdgpu and a dracut image of
    it; DKMS trees with the stand-in built and a passing verdict for it."""
    template = dracut_root_template()
    pristine.reset()
    root, state = tmp_path / "root", tmp_path / "state"
    subprocess.run(["cp", "-a", str(template), str(root)], check=True)
    kernel = pristine.kernel
    FakeSysroot(root).kernel(kernel)
    modules = root / "usr/lib/modules" / kernel
    (modules / "kernel" / AMD_TREE / "amdgpu").mkdir(parents=True)
    shutil.copy2(pristine.stock_module, modules / "kernel" / AMD_TREE / "amdgpu/amdgpu.ko")
    (modules / "modules.order").write_text(f"kernel/{AMD_TREE}/amdgpu/amdgpu.ko\n")
    subprocess.run(["depmod", "-b", str(root), kernel], check=True, capture_output=True)
    (root / "etc/dracut.conf.d").mkdir(exist_ok=True)
    (root / "etc/dracut.conf.d/50-rdna1-kmgr-test.conf").write_text(DRACUT_CONF)
    env = {**os.environ, **pristine.env, "RDNA1_KMGR_ROOT": str(root), "RDNA1_KMGR_STATE": str(state)}
    env.pop(jr.ABORT_ENV, None)
    for key in ("RDNA1_KMGR_ROOT", "RDNA1_KMGR_STATE", *pristine.env):
        monkeypatch.setenv(key, env[key])
    tool = initramfs.detect(TargetRoot(root))
    tool.regenerate(kernel)  # the image the system had before: dracut's own, of the stock module
    os.environ["RDNA1_KMGR_STATE"] = str(state)
    verdict.write(verdict_record(pristine.module_sha256, kernel))
    return {"root": root, "kernel": kernel, "env": env, "tool": tool, "pristine": pristine}


def cli(system, *args):
    return subprocess.run(
        [str(CLI), *args, "--kernel", system["kernel"], "--yes"],
        capture_output=True,
        text=True,
        env=system["env"],
        timeout=1800,
    )


def test_dracut_install_and_rollback_regenerate_the_image_with_the_built_then_the_stock_module(dracut_system):
    s = dracut_system
    kernel, tool, stock = s["kernel"], s["tool"], s["pristine"].stock_module
    assert isinstance(tool, initramfs.Dracut)
    image = s["root"] / "boot" / f"initramfs-{kernel}.img"
    before = tool.carried_module(kernel, "amdgpu")
    assert before.sha256 == jr.sha256_file(stock) and "/kernel/" in before.resolved

    installed = cli(s, "install", "--json", "--cert", str(s["pristine"].keys.cert))
    assert installed.returncode == 0, installed.stderr
    result = json.loads(installed.stdout)
    assert any(
        f"chroot {s['root']} dracut --force --kver {kernel} /boot/initramfs-{kernel}.img" in line
        for line in result["plan"]
    )
    carried = tool.carried_module(kernel, "amdgpu")  # read back from the new image with dracut's lsinitrd
    assert carried.sha256 == s["pristine"].module_sha256 and "/updates/dkms/" in carried.resolved
    assert result["verified"]["initramfs_module"] == carried.resolved
    files = tool.list_files(image)
    assert "dev/console" in files and carried.entries == [
        e for e in files if e.endswith("/amdgpu.ko.xz") or e.endswith("/amdgpu.ko")
    ]
    # Not asserted: etc/modprobe.d/rdna1-kmgr.conf. dracut carries /etc/modprobe.d only in host-only mode,
    # which needs /proc and /sys mounted; this chroot builds the generic image, where the module's own
    # parameter defaults apply at early boot.
    # The host's own initramfs-tools reads dracut's image the same way: two tools agree.
    host_list = subprocess.run(["lsinitramfs", str(image)], capture_output=True, text=True, check=True).stdout
    assert carried.entries[0] in host_list.split()

    rolled = cli(s, "rollback")
    assert rolled.returncode == 0, rolled.stderr
    after = tool.carried_module(kernel, "amdgpu")
    assert after.sha256 == jr.sha256_file(stock) and after.resolved == before.resolved
    assert after.entries == before.entries
    assert not (s["root"] / "usr/lib/modules" / kernel / "updates/dkms").exists() or not any(
        (s["root"] / "usr/lib/modules" / kernel / "updates/dkms").iterdir()
    )


def test_dracut_commands_run_inside_a_root_that_has_dracut(tmp_path):
    plain = initramfs.Dracut(TargetRoot(Path("/")))
    assert plain.regenerate_command("6.11.4-301.fc41.x86_64") == [
        "dracut",
        "--force",
        "--kver",
        "6.11.4-301.fc41.x86_64",
        "/boot/initramfs-6.11.4-301.fc41.x86_64.img",
    ]
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/dracut").write_text("")
    inside = initramfs.detect(TargetRoot(tmp_path))
    assert isinstance(inside, initramfs.Dracut)
    assert inside.regenerate_command("K") == [
        "chroot",
        str(tmp_path),
        "dracut",
        "--force",
        "--kver",
        "K",
        "/boot/initramfs-K.img",
    ]


def test_dracut_image_carries_the_stock_loader_and_both_amdgpu_files(dracut_system):
    """The stock-amdgpu loader's dracut module (install/initramfs.py) in a real dracut run: the image gets the
    modprobe rule (dracut's generic image carries no /etc/modprobe.d of its own), its program, and the
    distribution's amdgpu beside the installed one, so a fallback boot can load it before the root is mounted."""
    s = dracut_system
    kernel, tool = s["kernel"], s["tool"]
    installed = cli(s, "install", "--cert", str(s["pristine"].keys.cert))
    assert installed.returncode == 0, installed.stderr
    root = TargetRoot(s["root"])
    for path, (text, mode) in stock_loader.files(root, tool).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
    tool.regenerate(kernel)
    files = tool.list_files(s["root"] / "boot" / f"initramfs-{kernel}.img")
    assert stock_loader.LOADER in files and stock_loader.RULE in files, [f for f in files if "rdna1" in f]
    amdgpu = sorted(f for f in files if f.endswith(("/amdgpu.ko", "/amdgpu.ko.xz")))
    assert len(amdgpu) == 2 and any("/updates/dkms/" in f for f in amdgpu), amdgpu
    assert any(f"/{stock_loader.STOCK_DIR}/" in f for f in amdgpu), amdgpu
    # the carried index still gives the installed module: the stock file is only for the loader's insmod
    assert "/updates/dkms/" in tool.carried_module(kernel, "amdgpu").resolved
