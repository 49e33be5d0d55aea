"""Secure Boot on a whole Debian 12 system, then a Debian 13 one: OVMF with Microsoft's keys, the release's shim,
signed GRUB and kernel (the "uefi-sb" images of tests/wholesystem.py), and the Machine Owner Key flow as an owner
meets it.

One system per module, driven through its boots in order, each test the next chapter of the same story:

    1. Secure Boot is on (mokutil, the kernel's lockdown) and the boot went through shim (its MOK variables);
       `rdna1-kmgr keys enroll` queues the DKMS certificate with a one-time password
    2. the next boot stops in MokManager: Enroll MOK, Continue, Yes, the password, Reboot (over the serial
       console, tests/secure_boot_console.py; a screenshot of its menu); then the certificate is enrolled
       (mokutil, `keys status`) and `rdna1-kmgr install --dry-run` passes its Secure Boot gate; install runs natively
    3. the trial boot: the patched module (signed with that key) loaded under lockdown, and confirmed;
       `mokutil --delete` queues the key's removal
    4. MokManager again: Delete MOK
    5. the kernel refuses the patched module (its own message): the distribution's amdgpu loads in that same
       boot (the boot guard's loader, install/stock_loader.py), and the boot says so (status, login prompt)
    6. the next boot, by itself: a fallback boot that never opens the patched file, and says why at the login
       prompt and in `status`; `rollback` leaves nothing of the tool in /etc, /boot, the EFI system partition,
       grubenv or the initramfs

Boots run under TCG with OVMF's SMM: ~2-4 min each; the two MokManager boots end in the firmware.

`install` itself runs natively between the boots (`System.chroot`, as in the boot guard's story): its Secure
Boot gate reads the firmware's state and the enrolled keys (mokutil, EFI variables), which a chroot on this
machine does not have, so chapter 1 proves the refusal and chapter 2 the gate passed, each in a boot, with the
real install and its dry run (which checks the gate and changes nothing). `rollback` stays in the last boot: it
proves it in a running system (systemd up, the EFI system partition mounted, which this machine's kernel
cannot mount: no FAT).
"""

from __future__ import annotations

import contextlib
import lzma
import re
import subprocess
from pathlib import Path

import cache_warmer
import pytest
from build_fixtures import MOK_CERT, copy_build_into
from secure_boot_console import MokManager
from wholesystem import (
    ROOT_LOGIN_ENV,
    UEFI_SB,
    Boot,
    System,
    facts,
    install_by_readme,
    install_tool,
    new_system,
    trixie_build_cache,
)

pytestmark = [pytest.mark.vm, pytest.mark.realbuild]

CONFIRM_AFTER = 20
PASSWORD = "rdna1test"  # the one-time MOK password the owner chooses; typed again into MokManager
CERT = str(MOK_CERT)
# What the kernel says when it refuses a module whose signing key it does not trust (lockdown or enforcement).
REFUSED = re.compile(
    r"Loading of (unsigned module|module with unavailable key) is rejected|Key was rejected"
    r"|unsigned module loading is restricted|module verification failed"
)

FACTS = """
echo "FACT sb_state=$(mokutil --sb-state 2>&1 | tr '\\n' ' ')"
echo "FACT lockdown=$(cat /sys/kernel/security/lockdown)"
# shim hands the kernel its MOK list in a config table, and leaves the *RT variables behind: only shim does
echo "FACT mok_variables=$(ls /sys/firmware/efi/mok-variables 2>/dev/null | tr '\\n' ' ')"
echo "FACT shim_vars=$(ls /sys/firmware/efi/efivars | grep -c -e '^MokListRT-' -e '^SbatLevelRT-')"
echo "FACT removable_is_shim=$(cmp -s /boot/efi/EFI/BOOT/BOOTX64.EFI /usr/lib/shim/shimx64.efi.signed && echo yes)"
echo "FACT quirks=$(cat /sys/module/amdgpu/parameters/rdna1_quirks 2>/dev/null || echo none)"
echo "FACT loaded_buildid=$(od -An -tx1 /sys/module/amdgpu/notes/.note.gnu.build-id 2>/dev/null \
    | tr -d ' \\n' | tail -c 40)"
echo "FACT module_file=$(modinfo -k {kernel} -n amdgpu)"
# Debian 13's DKMS installs the module xz-compressed, as its kernel's own modules are
module=$(modinfo -k {kernel} -n amdgpu); case $module in *.xz) xz -dc "$module" > /run/amdgpu.ko; module=/run/amdgpu.ko;; esac
echo "FACT file_buildid=$(readelf -n $module | sed -n 's/.*Build ID: //p')"
echo "FACT grubenv=$(grub-editenv /boot/grub/grubenv list | tr '\\n' ' ')"
echo "FACT cmdline=$(cat /proc/cmdline)"
echo "FACT enrollment=$(mokutil --test-key {cert} 2>&1 | tr '\\n' ' ')"
echo "KERNEL-LOG-START"; dmesg | grep -i -e secure -e lockdown -e 'x.509' -e 'mok' -e 'module' -e amdgpu; \
echo "KERNEL-LOG-END"
"""


def kernel_log(out: str) -> str:
    return out.split("KERNEL-LOG-START", 1)[-1].split("KERNEL-LOG-END", 1)[0]


class Story:
    def __init__(self, system: System, kernel: str, stock_buildid: str, cert_subject: str):
        self.system = system
        self.kernel = kernel
        self.stock_buildid = stock_buildid
        self.cert_subject = cert_subject
        self.chapters: dict[str, tuple[Boot, dict]] = {}
        self.screenshots: list[Path] = []

    def step(self, name: str, body: str, timeout: float = 900) -> tuple[Boot, dict]:
        script = FACTS.format(kernel=self.kernel, cert=CERT) + "set -e\n" + body
        boot = self.system.boot(script, timeout=timeout)
        self.chapters[name] = (boot, facts(boot.step_out))
        assert not boot.timed_out, f"the boot did not finish in {timeout} s:\n{boot.tail()}"
        assert boot.step_rc == 0, f"the step failed ({boot.step_rc}):\n{boot.step_out[-4000:]}\n{boot.tail(30)}"
        return self.chapters[name]

    def chapter(self, name: str) -> tuple[Boot, dict]:
        if name not in self.chapters:
            pytest.fail(f"the boot {name!r} of an earlier chapter did not run")
        return self.chapters[name]

    def mokmanager(self, action: str, screenshot: Path) -> MokManager:
        """A boot that stops in MokManager, answered as the owner would; it ends with MokManager's reboot."""
        manager = MokManager(action, PASSWORD, screenshot=screenshot)
        self.screenshots.append(screenshot)
        boot = self.system.boot(None, timeout=600, driver=manager)
        assert not boot.timed_out, f"MokManager did not reboot in time:\n{boot.tail()}"
        return manager


def stock_build_id(root: Path, kernel: str, tmp: Path) -> str:
    """The GNU build id of the distribution's amdgpu (Debian 13's modules are xz-compressed)."""
    stock_file = root / "lib/modules" / kernel / "kernel/drivers/gpu/drm/amd/amdgpu/amdgpu.ko"
    if not stock_file.is_file():
        plain = tmp / "stock-amdgpu.ko"
        plain.write_bytes(lzma.decompress(stock_file.with_suffix(".ko.xz").read_bytes()))
        stock_file = plain
    notes = subprocess.run(["readelf", "-n", str(stock_file)], capture_output=True, text=True, check=True).stdout
    return notes.split("Build ID:")[1].split()[0]


def debian12_system(request, tmp: Path) -> tuple[System, str]:
    """Debian 12's Secure Boot image with the module `build` made on this machine for its 6.1 kernel (its DKMS
    package, built tree and DKMS's signing certificate) and this checkout's tool."""
    built = request.getfixturevalue("built_module_61")
    kernel = built["kernel"]
    system = new_system(request.getfixturevalue("wholesystem_uefi_sb_image_61"), tmp, UEFI_SB)
    with system.files() as root:
        install_tool(root)
        copy_build_into(root, built)
    return system, kernel


def debian13_system(request, tmp: Path) -> tuple[System, str]:
    """Debian 13's Secure Boot image (trixie's shim, signed GRUB and kernel, mokutil) with this checkout's tool
    put in by the README's ./install.sh, and the module built there natively for trixie-security's 6.12: trixie's
    gcc-14 and DKMS, which makes its own signing key on the first build and signs with it."""
    image, kernel = request.getfixturevalue("wholesystem_uefi_sb_image_trixie")
    cache_warmer.wait_for("trixie-builds")
    system = new_system(image, tmp, UEFI_SB)
    with system.entered(trixie_build_cache()) as root:
        install_by_readme(root, ROOT_LOGIN_ENV)
    build = system.chroot(
        ["rdna1-kmgr", "build", "--kernel", kernel, "--yes"], 5400, ROOT_LOGIN_ENV, trixie_build_cache(), "build"
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return system, kernel


@pytest.fixture(scope="module", params=["debian12", pytest.param("debian13", marks=pytest.mark.debian13)])
def story(request, tmp_path_factory, pytestconfig) -> Story:
    """The story on Debian 12's system, then on Debian 13's (each a module-wide run of every chapter)."""
    tmp = tmp_path_factory.mktemp(f"secure_boot_{request.param}")
    system, kernel = (debian12_system if request.param == "debian12" else debian13_system)(request, tmp)
    with system.files() as root:
        stock = stock_build_id(root, kernel, tmp)
        cert = (root / CERT.lstrip("/")).read_bytes()
    subject = subprocess.run(
        ["openssl", "x509", "-inform", "DER", "-noout", "-subject", "-nameopt", "multiline"],
        input=cert,
        capture_output=True,
        check=True,
    ).stdout.decode()
    cn = re.search(r"commonName\s*=\s*(.+)", subject).group(1).strip()
    story = Story(system, kernel, stock, cn)
    yield story
    summary = f"Secure Boot story ({request.param}, {kernel}), seconds per boot: " + ", ".join(
        f"{b.seconds:.0f}" for b in system.boots
    )
    summary += "; MokManager screenshots: " + ", ".join(str(s) for s in story.screenshots if s.is_file())
    (system.logs / "boot-seconds.txt").write_text(summary + "\n")
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print(f"\n{summary} ({system.logs})")  # shown whether or not pytest captures output


def test_secure_boot_is_on_and_the_boot_went_through_shim(story):
    _, found = story.step(
        "first",
        f"""
rdna1-kmgr keys status
# what is there of the tool before any install: the files the tool's own installation put in /etc (Debian 13's
# by ./install.sh: shell completion), which neither install nor rollback touches
find /etc /boot -iname '*rdna1*' | sort > /root/tool-files-before
# before the key is enrolled, install refuses and changes nothing
rdna1-kmgr install --kernel {story.kernel} --skip-vm-check --yes > /tmp/install-refused 2>&1 && exit 9 || :
echo "FACT refused=$(tail -1 /tmp/install-refused)"
echo "FACT refused_left=$( (find /etc /boot -iname '*rdna1*'; find /lib/modules/{story.kernel}/updates -name 'amdgpu.ko*') \
    2>/dev/null | sort | comm -13 /root/tool-files-before - | tr '\\n' ' ')"
# the owner's enrollment: the tool asks for a one-time password, mokutil reads it twice (from stdin here)
printf '%s\\n%s\\n' {PASSWORD} {PASSWORD} | rdna1-kmgr keys enroll
echo "FACT pending=$(mokutil --list-new | grep -c 'SHA1 Fingerprint' || true)"
echo "FACT status_after=$(rdna1-kmgr keys status | grep enrollment)"
""",
    )
    assert "SecureBoot enabled" in found["sb_state"], found
    assert re.search(r"\[(integrity|confidentiality)\]", found["lockdown"]), found
    assert "MokListRT" in found["mok_variables"] and int(found["shim_vars"]) >= 1, found
    assert found["removable_is_shim"] == "yes", found
    boot, _ = story.chapter("first")
    log = kernel_log(boot.step_out)
    assert "Kernel is locked down from EFI Secure Boot" in log and "secureboot: Secure boot enabled" in log, log
    assert "UEFI:MokListRT (MOKvar table)" in log, log  # the kernel read the MOK list from shim's config table
    # the stock module, signed by Debian, loads under lockdown
    assert found["loaded_buildid"] == story.stock_buildid, found


def test_secure_boot_install_refuses_before_the_key_is_enrolled(story):
    _, found = story.chapter("first")
    assert "Secure Boot is on" in found["refused"] and "nothing was changed" in found["refused"], found
    assert found["refused_left"] == "", found


def test_secure_boot_keys_enroll_queues_the_certificate(story):
    boot, found = story.chapter("first")
    assert "is not enrolled" in found["enrollment"], found
    assert "one-time password" in boot.step_out
    assert int(found["pending"]) == 1, boot.step_out[-3000:]
    assert "pending" in found["status_after"], found


def test_secure_boot_mokmanager_enrolls_and_install_passes_the_gate(story, tmp_path):
    shot = tmp_path / "mokmanager-enroll.png"
    manager = story.mokmanager("Enroll MOK", shot)
    print(f"MokManager screenshot: {shot} ({shot.stat().st_size if shot.exists() else 0} bytes)")
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", manager.seen
    boot, found = story.step(
        "enrolled",
        f"""
mokutil --list-enrolled | grep -e 'Subject:' -e 'CN='
rdna1-kmgr keys status
echo "FACT status=$(rdna1-kmgr keys status | grep enrollment)"
# the gate reads this boot's firmware (Secure Boot on, the certificate now enrolled): the dry run passes it
rdna1-kmgr install --kernel {story.kernel} --skip-vm-check --dry-run --confirm-after {CONFIRM_AFTER}
""",
    )
    assert "is already enrolled" in found["enrollment"], found
    assert found["status"].split() == ["enrollment", "enrolled"], found
    assert story.cert_subject in boot.step_out.split("rdna1-kmgr keys status")[0], boot.step_out[:3000]
    # the kernel took the enrolled key from shim's MOK list into its keyring
    assert re.search(rf"Loaded X\.509 cert '{re.escape(story.cert_subject)}", kernel_log(boot.step_out)), kernel_log(
        boot.step_out
    )
    assert "WITHOUT a passing VM verdict" in boot.step_out, boot.step_out[-3000:]  # the plan, past the gate
    # The install itself natively, between the boots (its update-initramfs and update-grub cost minutes under
    # TCG): the gate it reads there is this machine's, which is why the boot above proved it with the dry run.
    install = story.system.chroot(
        ["rdna1-kmgr", "install", "--kernel", story.kernel, "--skip-vm-check", "--yes"]
        + ["--confirm-after", str(CONFIRM_AFTER)],
        env=ROOT_LOGIN_ENV,
        name="install",
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    grubenv = story.system.chroot(["grub-editenv", "/boot/grub/grubenv", "list"], name="grubenv-after-install")
    assert "rdna1_kmgr=trial" in grubenv.stdout, grubenv.stdout


def test_secure_boot_trial_loads_the_signed_module_under_lockdown(story):
    boot, found = story.step(
        "trial",
        f"""
for i in $(seq 150); do
    grub-editenv /boot/grub/grubenv list | grep -q '^rdna1_kmgr=confirmed' && break
    sleep 2
done
echo "FACT grubenv_after=$(grub-editenv /boot/grub/grubenv list | tr '\\n' ' ')"
echo "FACT signer=$(modinfo -k {story.kernel} -F signer amdgpu)"
# the owner takes the key back: mokutil --delete asks for a one-time password as --import does
printf '%s\\n%s\\n' {PASSWORD} {PASSWORD} | mokutil --delete {CERT}
echo "FACT delete_pending=$(mokutil --list-delete | grep -c 'SHA1 Fingerprint' || true)"
""",
    )
    assert "rdna1_kmgr.boot=trial" in found["cmdline"], found
    assert re.search(r"\[(integrity|confidentiality)\]", found["lockdown"]), found
    assert re.search(r"/updates/dkms/amdgpu\.ko(\.xz)?$", found["module_file"]), found
    assert len(found["loaded_buildid"]) == 40, found
    assert found["loaded_buildid"] == found["file_buildid"] != story.stock_buildid, found
    assert found["signer"] == story.cert_subject, found
    assert not REFUSED.search(kernel_log(boot.step_out)), kernel_log(boot.step_out)
    assert "rdna1_kmgr=confirmed" in found["grubenv_after"], boot.step_out[-3000:]
    assert int(found["delete_pending"]) == 1, boot.step_out[-2000:]


def test_secure_boot_mokmanager_deletes_the_key(story, tmp_path):
    manager = story.mokmanager("Delete MOK", tmp_path / "mokmanager-delete.png")
    assert "Delete the key(s)?" in manager.seen


def test_secure_boot_revoked_key_the_kernel_refuses_the_patched_module(story):
    boot, found = story.step(
        "revoked",
        f"""
echo "FACT status=$(rdna1-kmgr keys status | grep enrollment)"
# the file itself, past modprobe's rules: the kernel checks the signature before anything else
echo "FACT insmod=$(insmod $(modinfo -k {story.kernel} -n amdgpu) 2>&1 || true)"
echo "FACT loader=$(dmesg | grep 'rdna1-kmgr:' | tr '\\n' '|')"
rdna1-kmgr status
cat /etc/issue.d/rdna1-kmgr.issue
""",
    )
    log = kernel_log(boot.step_out)
    assert "is not enrolled" in found["enrollment"] and "not enrolled" in found["status"], found
    assert re.search(
        r"/updates/dkms/amdgpu\.ko(\.xz)?$", found["module_file"]
    ), found  # still installed: the kernel refused it
    assert REFUSED.search(log), f"no refusal in the kernel's log:\n{log}"
    assert "Key was rejected by service" in found["insmod"], found
    assert "rdna1_kmgr.boot=confirmed" in found["cmdline"], found


def test_secure_boot_revoked_key_the_stock_amdgpu_takes_over_in_the_same_boot(story):
    boot, found = story.chapter("revoked")
    assert found["loaded_buildid"] == story.stock_buildid != found["file_buildid"], found
    assert "did not load" in found["loader"] and "loading the distribution's amdgpu" in found["loader"], found
    said = "refused the rdna1-kmgr amdgpu this boot"
    assert boot.step_out.count(said) >= 2, boot.step_out[-3000:]  # status and the login prompt's file
    assert "rdna1_kmgr=refused" in boot.step_out, boot.step_out[-3000:]  # status: later boots are fallback boots


def test_secure_boot_the_next_boot_is_a_fallback_boot_by_itself(story):
    boot, found = story.step(
        "after-refusal",
        f"""
echo "FACT loader=$(dmesg | grep 'rdna1-kmgr:' | tr '\\n' '|')"
rdna1-kmgr status
rdna1-kmgr rollback --kernel {story.kernel} --yes
echo "FACT etc_boot=$(find /etc /boot -iname '*rdna1*' | sort | comm -13 /root/tool-files-before - | tr '\\n' ' ')"
echo "FACT esp=$(mountpoint /boot/efi), $(find /boot/efi -iname '*rdna1*' | wc -l) files of the tool"
echo "FACT grubcfg=$(grep -c rdna1 /boot/grub/grub.cfg || true)"
echo "FACT grubenv_rolled_back=$(grub-editenv /boot/grub/grubenv list | tr '\\n' ' ')"
echo "FACT initramfs_updates=$(lsinitramfs /boot/initrd.img-{story.kernel} | grep -c -e updates/dkms -e rdna1 || true)"
""",
        timeout=1200,
    )
    assert "rdna1_kmgr.boot=fallback" in found["cmdline"], found
    assert found["loaded_buildid"] == story.stock_buildid, found
    assert "a fallback boot" in found["loader"] and "did not load" not in found["loader"], found
    assert not REFUSED.search(kernel_log(boot.step_out)), "the patched file was opened on a fallback boot"
    assert "refused the rdna1-kmgr amdgpu in an earlier boot" in boot.step_out  # status
    # agetty's banner: /etc/issue, then /etc/issue.d, then the prompt
    prompt = boot.console.rindex("login:")
    assert "refused the rdna1-kmgr amdgpu in an earlier boot" in boot.console[:prompt][-3000:], boot.tail()


def test_secure_boot_rollback_leaves_nothing_of_the_tool(story):
    _, found = story.chapter("after-refusal")
    assert found["etc_boot"] == "", found  # /boot/efi, the EFI system partition, included
    assert found["esp"] == "/boot/efi is a mountpoint, 0 files of the tool", found
    assert found["grubcfg"] == "0" and "rdna1" not in found["grubenv_rolled_back"], found
    assert found["initramfs_updates"] == "0", found
