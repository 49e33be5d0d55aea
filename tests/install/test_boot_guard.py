"""The boot guard on a whole Debian 12 system in QEMU (tests/wholesystem.py): GRUB, the initramfs, systemd.

One system per module, driven through its boots in order, each test the next chapter of the same story:

    1. install into the powered-off system (the 6.1 build of the session, its DKMS tree copied in), run natively
       in a chroot of its disk (`System.chroot`): the image's own dkms, update-initramfs and update-grub
    2. the trial boot: GRUB put the mask on the command line, amdgpu came from the initramfs with the quirks
       on, the confirm timer confirmed it; then `retry` arms one more trial
    3. that trial is killed (the VM destroyed) once amdgpu has loaded in the initramfs
    4. the next boot, with no keyboard action: the distribution's amdgpu file, from the initramfs, and it says
       so (console, /etc/issue.d, the journal, `status`); `retry`
    5. the trial again: quirks on; `confirm` by hand; then `rollback` in a chroot of the powered-off system
    6. stock amdgpu, and nothing of the tool in /etc, /boot, the initramfs or GRUB

Install and rollback run in a chroot, not in a boot: they read nothing of the running system but what
`--kernel` gives them (the Secure Boot gate reads no EFI variables on this BIOS image, nor on this machine), and
under TCG each cost a boot plus 2-4 minutes of update-initramfs. What they wrote is proven by the boots after
them. The one difference from an owner's run: update-grub in a chroot of a loop-mounted disk is told the root
device (tests/wholesystem.py), so grub.cfg's linux lines say root=/dev/vda1. `rollback` in a booted system (a
running systemd) stays proven by the Secure Boot story, which rolls back in its last boot.

A file the kernel refuses (the stock file in that same boot, fallback boots after it) is the Secure Boot story's
(test_secure_boot.py: the key deleted from the MOK list); the loader's branches are test_stock_loader.py's.
Until 2026-11-25 this story also broke a symbol's CRC in the installed module for that: two more boots and an
initramfs remade under TCG, about 4 minutes of the suite's 60 for the same path.

Boots run under TCG: ~1-2 min each here.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from build_fixtures import copy_build_into
from wholesystem import System, facts, install_tool, new_system

pytestmark = [pytest.mark.vm, pytest.mark.realbuild]

CONFIRM_AFTER = 20  # seconds: the confirm timer fires while the boot is still reaching its target under TCG
AMDGPU_LOADED = "amdgpu kernel modesetting enabled"

# What each step prints about the boot it runs in, as `FACT name=value` lines.
FACTS = """
echo "FACT cmdline=$(cat /proc/cmdline)"
echo "FACT quirks=$(cat /sys/module/amdgpu/parameters/rdna1_quirks 2>/dev/null || echo none)"
# the loaded module's GNU build id (the last 20 bytes of its note) and the one of the file modprobe resolves
echo "FACT loaded_buildid=$(od -An -tx1 /sys/module/amdgpu/notes/.note.gnu.build-id | tr -d ' \n' | tail -c 40)"
echo "FACT module_file=$(modinfo -k {kernel} -n amdgpu)"
echo "FACT file_buildid=$(readelf -n $(modinfo -k {kernel} -n amdgpu) | sed -n 's/.*Build ID: //p')"
echo "FACT grubenv=$(grub-editenv /boot/grub/grubenv list | tr '\\n' ' ')"
echo "FACT initramfs_amdgpu=$(lsinitramfs /boot/initrd.img-{kernel} | grep '/amdgpu.ko' | tr '\\n' ' ')"
# amdgpu initialised before the initramfs mounted the root file system: loaded from the initramfs
echo "FACT amdgpu_line=$(dmesg | grep -n '{loaded}' | head -1 | cut -d: -f1)"
echo "FACT rootmount_line=$(dmesg | grep -n 'EXT4-fs (vda1): mounted' | head -1 | cut -d: -f1)"
# what the stock-amdgpu loader wrote to the kernel log
echo "FACT loader=$(dmesg | grep 'rdna1-kmgr:' | tr '\\n' '|')"
"""


class Story:
    def __init__(self, system: System, kernel: str, mask: str, stock_buildid: str):
        self.system = system
        self.kernel = kernel
        self.mask = mask
        self.stock_buildid = stock_buildid

    def step(self, body: str, timeout: float = 900, **kw):
        script = FACTS.format(kernel=self.kernel, loaded=AMDGPU_LOADED) + "set -e\n" + body
        boot = self.system.boot(script, timeout=timeout, **kw)
        assert not boot.timed_out, f"the boot did not finish in {timeout} s:\n{boot.tail()}"
        assert boot.step_rc == 0, f"the step failed ({boot.step_rc}):\n{boot.step_out[-4000:]}\n{boot.tail(30)}"
        return boot, facts(boot.step_out)

    def assert_stock_from_initramfs(self, found: dict) -> None:
        """The distribution's amdgpu file runs (its build id), loaded before the root file system was mounted."""
        assert found["quirks"] == "none", found
        assert found["loaded_buildid"] == self.stock_buildid != found["file_buildid"], found
        assert int(found["amdgpu_line"]) < int(found["rootmount_line"]), found

    def assert_active_from_initramfs(self, found: dict) -> None:
        assert int(found["quirks"], 0) == int(self.mask, 0), found
        assert found["module_file"].endswith("/updates/dkms/amdgpu.ko"), found
        assert len(found["loaded_buildid"]) == 40, found
        assert found["loaded_buildid"] == found["file_buildid"] != self.stock_buildid, found
        assert "updates/dkms/amdgpu.ko" in found["initramfs_amdgpu"], found
        assert int(found["amdgpu_line"]) < int(found["rootmount_line"]), found


# Ubuntu's recordfail, in the shape of its GRUB scripts (00_header defines the function, each 10_linux entry
# calls it before the kernel line; grub-common's boot service unsets it once the system is up), so both save_env
# users share this image's grubenv as they do on Ubuntu. Left out: the 30 s menu wait a set recordfail causes.
UBUNTU_RECORDFAIL = """#!/bin/sh
cat <<'EOF'
function recordfail {
  set recordfail=1
  if [ -n "${have_grubenv}" ]; then if [ -z "${boot_once}" ]; then save_env recordfail; fi; fi
}
recordfail
EOF
"""


@pytest.fixture(scope="module")
def story(built_module_61, wholesystem_image_61, tmp_path_factory) -> Story:
    kernel = built_module_61["kernel"]
    version = built_module_61["package_version"]
    system = new_system(wholesystem_image_61, tmp_path_factory.mktemp("wholesystem"))
    with system.files() as root:
        install_tool(root)
        copy_build_into(root, built_module_61)
        recordfail = root / "etc/grub.d/05_ubuntu_recordfail"
        recordfail.write_text(UBUNTU_RECORDFAIL)
        recordfail.chmod(0o755)
        stock_file = root / "lib/modules" / kernel / "kernel/drivers/gpu/drm/amd/amdgpu/amdgpu.ko"
        notes = subprocess.run(["readelf", "-n", str(stock_file)], capture_output=True, text=True, check=True).stdout
        stock = notes.split("Build ID:")[1].split()[0]
    manifest = json.loads((Path("/usr/src") / f"rdna1-amdgpu-{version}" / "rdna1-manifest.json").read_text())
    return Story(system, kernel, f"0x{manifest['quirks_mask']:x}", stock)


def test_boot_guard_install_arms_a_trial(story):
    before = story.system.chroot(["grub-editenv", "/boot/grub/grubenv", "list"])
    assert before.returncode == 0 and "rdna1" not in before.stdout, before  # stock, no guard yet
    install = story.system.chroot(
        ["rdna1-kmgr", "install", "--kernel", story.kernel, "--skip-vm-check", "--yes"]
        + ["--confirm-after", str(CONFIRM_AFTER), "--json"]
    )
    assert install.returncode == 0, f"install failed ({install.returncode}):\n{install.stderr[-4000:]}"
    assert json.loads(install.stdout), install.stdout
    after = story.system.chroot(["grub-editenv", "/boot/grub/grubenv", "list"])
    assert "rdna1_kmgr=trial" in after.stdout and f"rdna1_kmgr_mask={story.mask}" in after.stdout, after
    with story.system.files() as root:
        linux_lines = [
            line for line in (root / "boot/grub/grub.cfg").read_text().splitlines() if re.match(r"\s*linux\s", line)
        ]
    assert len(linux_lines) >= 2 and all(
        "rdna1_kmgr_args" in line for line in linux_lines
    ), "every kernel line of grub.cfg (recovery ones too) carries ${rdna1_kmgr_args}"


def test_boot_guard_trial_boot_confirms_itself(story):
    boot, found = story.step("""
for i in $(seq 150); do
    grub-editenv /boot/grub/grubenv list | grep -q '^rdna1_kmgr=confirmed' && break
    sleep 2
done
echo "FACT grubenv_after=$(grub-editenv /boot/grub/grubenv list | tr '\\n' ' ')"
journalctl -b --no-pager -u rdna1-kmgr-confirm.service -u rdna1-kmgr-boot-check.service
rdna1-kmgr status
rdna1-kmgr retry
""")
    assert "amdgpu.rdna1_quirks=" + story.mask in found["cmdline"] and "rdna1_kmgr.boot=trial" in found["cmdline"]
    story.assert_active_from_initramfs(found)
    assert "rdna1_kmgr=confirmed" in found["grubenv_after"], boot.step_out[-3000:]
    assert "trial boot confirmed" in boot.step_out


def test_boot_guard_killed_trial_is_followed_by_a_stock_boot(story):
    killed = story.system.boot(None, timeout=600, kill_on=AMDGPU_LOADED)
    assert killed.killed, f"amdgpu never loaded in the trial boot:\n{killed.tail()}"
    assert "rdna1_kmgr.boot=trial" in killed.console and f"amdgpu.rdna1_quirks={story.mask}" in killed.console

    boot, found = story.step("""
# what Ubuntu's grub-common service does once the system is up
grub-editenv /boot/grub/grubenv unset recordfail
echo "FACT grubenv_recordfail_cleared=$(grub-editenv /boot/grub/grubenv list | tr '\\n' ' ')"
cat /etc/issue.d/rdna1-kmgr.issue /run/motd.d/rdna1-kmgr
journalctl -b --no-pager -u rdna1-kmgr-boot-check.service
rdna1-kmgr status
rdna1-kmgr retry
# the manual confirm below must not race the timer: a test-only drop-in moves it out of the way
mkdir -p /etc/systemd/system/rdna1-kmgr-confirm.timer.d
printf '[Timer]\\nOnBootSec=\\nOnBootSec=3600\\n' > /etc/systemd/system/rdna1-kmgr-confirm.timer.d/test.conf
""")
    assert "amdgpu.rdna1_quirks=0 " in found["cmdline"] + " " and "rdna1_kmgr.boot=fallback" in found["cmdline"]
    story.assert_stock_from_initramfs(found)
    assert "a fallback boot" in found["loader"] and "did not load" not in found["loader"], found
    # both save_env users side by side in one grubenv (recordfail saved by this boot, `trying` by the killed one);
    # clearing recordfail, as Ubuntu does once up, keeps the guard's state
    assert "recordfail=1" in found["grubenv"] and "rdna1_kmgr=trying" in found["grubenv"], found
    cleared = found["grubenv_recordfail_cleared"]
    assert "recordfail" not in cleared and "rdna1_kmgr=trying" in cleared and f"rdna1_kmgr_mask={story.mask}" in cleared
    assert "did not confirm" in boot.step_out  # issue.d, motd, the journal and status all say it
    assert boot.step_out.count("did not confirm") >= 4, boot.step_out[-3000:]
    # agetty's banner: /etc/issue ("Debian GNU/Linux 12 <host> ttyS0"), then /etc/issue.d, then the prompt
    prompt = boot.console.rindex("wholesystem login:")
    banner = boot.console[boot.console.rindex("wholesystem ttyS0", 0, prompt) : prompt]
    assert "did not confirm" in banner, f"the login prompt does not say it:\n{banner}"


def test_boot_guard_retry_is_active_again_confirms_by_hand_and_rolls_back(story):
    _, found = story.step(
        """
rdna1-kmgr confirm
rm -r /etc/systemd/system/rdna1-kmgr-confirm.timer.d
echo "FACT grubenv_after=$(grub-editenv /boot/grub/grubenv list | tr '\\n' ' ')"
"""
    )
    assert "rdna1_kmgr.boot=trial" in found["cmdline"]
    story.assert_active_from_initramfs(found)
    assert "rdna1_kmgr=confirmed" in found["grubenv_after"]
    assert "did not load" not in found["loader"], found
    rollback = story.system.chroot(["rdna1-kmgr", "rollback", "--kernel", story.kernel, "--yes"])
    assert rollback.returncode == 0, f"rollback failed ({rollback.returncode}):\n{rollback.stderr[-4000:]}"


def test_boot_guard_rollback_leaves_stock_and_nothing_of_the_tool(story):
    _, found = story.step(f"""
echo "FACT etc_boot=$(find /etc /boot -iname '*rdna1*' | tr '\\n' ' ')"
echo "FACT grubcfg=$(grep -c rdna1 /boot/grub/grub.cfg)"
echo "FACT initramfs_updates=$(lsinitramfs /boot/initrd.img-{story.kernel} | grep -c -e updates/dkms -e rdna1)"
""")
    assert "rdna1" not in found["cmdline"], found
    assert found["quirks"] == "none"
    assert found["loaded_buildid"] == found["file_buildid"] == story.stock_buildid, found
    assert "/kernel/drivers/gpu/drm/amd/amdgpu/amdgpu.ko" in found["module_file"]
    assert int(found["amdgpu_line"]) < int(found["rootmount_line"]), "the stock amdgpu still comes from the initramfs"
    assert found["etc_boot"] == "", found
    assert found["grubcfg"] == "0" and "rdna1" not in found["grubenv"], found
    assert found["initramfs_updates"] == "0", found
