"""Debian 13 end to end: the release whose default kernel needs the fix, on a whole trixie system.

The image (tests/wholesystem.py, kind "debian13") is debootstrap trixie with trixie-security's current kernel
(6.12.x+deb13), GRUB, and the tool installed by the README's `./install.sh` in a chroot. One copy per module,
driven in order, each test the next chapter:

    1. `rdna1-kmgr build` for the 6.12 kernel, natively: the copy's root mounted on this machine and entered
       with chroot (/proc, /sys, /dev bound), so trixie's own gcc-14, dkms and Python 3.13 do it at this
       machine's speed. cwsr-size is carried (the kernel checks the CWSR mapping's end exactly and has no SVM).
       Then `rdna1-kmgr vm-test` from the same chroot (its QEMU guest boots the 6.12 kernel against that root).
    2. `rdna1-kmgr install`, natively too: update-initramfs and update-grub in the chroot, not under TCG (they
       cost 100-190 s a run there). Then the one boot of the story, under TCG, because what it proves needs a
       boot: GRUB's trial (the boot guard), the initramfs loading the patched module (its build id is the
       build's), the mask on in /sys/module/amdgpu/parameters/rdna1_quirks, the confirm timer confirming, and
       `doctor` reading the running kernel as an owner's machine has it (no board in the guest: its queue note
       says the kernel needs cwsr-size and the loaded amdgpu carries it).
    3. `follow` to trixie-backports' 7.x kernel: apt installs it in the chroot, the kernel hooks run follow, which
       compiles the 7.x amdgpu with trixie's gcc-14 (the first compile of a 7.x tree with its own toolchain)
       and vm-tests it (its vm-test boots 7.x: the module loads and its self-test passes there). No whole-
       system boot of 7.x (2-3 min of TCG): with no board, what tells an owner it is not affected is the
       kernel's config (CONFIG_HSA_AMD_SVM=y), which doctor reads from /boot whether 7.x runs or not; doctor
       is run on a sysroot whose running release is 7.x. The boot guard and the initramfs path were proven by
       chapter 2's boot, the same code for any kernel. The touched 7.x objects are compiled with W=1 there
       too (tests/kernel_style.py), against the stock tree, with 7.x's headers and gcc-14. cwsr-size
       stays inert there: 7.x still checks a BO mapping's end exactly, so the build carries the quirk (on by
       default), but with the SVM API libhsakmt puts the CWSR area in SVM memory, a path the quirk does not
       touch (kmod/quirks/cwsr-size/quirk.toml); what the test can see of that is doctor's "not affected".
       Chapter 3 is an opt-in tier (RDNA1_KMGR_TEST_DEBIAN13_7X=1; CI leaves it out with that reason): with
       empty caches its compile is the longest job of the whole suite. CI covers 7.x by rendering and checkpatch
       on a real 7.x tree (tests/render).
    4. `rollback --all`, the 7.x packages purged (the hooks drop their build): /boot, /lib/modules, /etc and
       grubenv as they were before `install` (initramfs images compared by their file lists: initramfs-tools
       does not make them byte-reproducible).

The kernels used are in the test ids' output (-rA) and in the logs under the module's tmp folder. Everything
skips with the reason when the archive lacks trixie-security's kernel or trixie-backports' 7.x one.
"""

from __future__ import annotations

import json
import lzma
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import cache_warmer
import pytest
from install_checks import assert_same_system, initramfs_list, tree_digest
from kernel_style import touched_objects, w1_new_warnings
from wholesystem import (
    ROOT_LOGIN_ENV,
    STEP_DIR,
    System,
    facts,
    install_by_readme,
    new_system,
    trixie_build_cache,
)

from rdna1_kmgr.render.patch_series import render

pytestmark = [pytest.mark.realbuild, pytest.mark.vm, pytest.mark.debian13]

CONFIRM_AFTER = 20
FULL_7X_ENV = cache_warmer.FULL_7X_ENV


@dataclass
class Trixie:
    system: System
    kernel: str  # trixie-security's 6.12
    seen: dict = field(default_factory=dict)  # what earlier chapters found, for the later ones

    def run(self, script: str, name: str, timeout: float = 5400) -> subprocess.CompletedProcess:
        """`script` natively in the powered-off system, as a root login shell would run it (a clean environment);
        its output kept in the logs as `name`.log."""
        return self.system.chroot(["/bin/bash", "-c", script], timeout, ROOT_LOGIN_ENV, trixie_build_cache(), name)


def build_id(module: Path) -> str:
    """The GNU build id of a module file (.ko or .ko.xz), read by binutils on this machine."""
    data = module.read_bytes()
    if module.suffix == ".xz":
        data = lzma.decompress(data)
    plain = module.parent / ".buildid-probe.ko"
    plain.write_bytes(data)
    try:
        notes = subprocess.run(["readelf", "-n", str(plain)], capture_output=True, text=True, check=True).stdout
        comment = subprocess.run(["readelf", "-p", ".comment", str(plain)], capture_output=True, text=True).stdout
    finally:
        plain.unlink()
    return notes.split("Build ID:")[1].split()[0] + "\n" + comment


def system_state(root: Path) -> dict:
    """What install, follow and rollback may touch: /boot (initramfs images by their file lists), every kernel's
    /lib/modules, /etc, and GRUB's environment block."""
    boot = tree_digest(root / "boot")
    initrds = {}
    for name in sorted(boot):
        if name.startswith("initrd.img-") and not name.endswith(".bak"):
            initrds[name] = initramfs_list(root / "boot" / name)
            boot[name] = "initramfs (by its file list)"
    return {
        "boot": boot,
        "initramfs": initrds,
        "modules": tree_digest(root / "lib/modules"),
        "etc": tree_digest(root / "etc"),
        "grubenv": {"grubenv": (root / "boot/grub/grubenv").read_text()},
    }


@pytest.fixture(scope="module")
def trixie(wholesystem_image_trixie, tmp_path_factory) -> Trixie:
    image, kernel = wholesystem_image_trixie
    cache_warmer.wait_for("trixie-builds")  # then the compiles below are the cache's (its docstring says why)
    print(f"\nDebian 13 story: trixie-security's kernel {kernel}, image {image.name}")
    tmp = tmp_path_factory.mktemp("debian13")
    system = new_system(image, tmp)
    story = Trixie(system, kernel)
    # The tool as this checkout has it (the cached image holds the one it was built with): the README's
    # ./install.sh again, in the chroot; the system packages are there already.
    with system.entered(trixie_build_cache()) as root:
        install_by_readme(root, ROOT_LOGIN_ENV)
    # grub.cfg as the native steps write it (root=/dev/vda1, no device hints) from the start: the state rollback
    # must return to is the one the last update-grub before `install` left
    proc = story.run("update-grub", "update-grub")
    assert proc.returncode == 0, proc.stderr
    proc = story.run("rdna1-kmgr --version; python3 --version; gcc --version | head -1; dkms --version", "versions")
    assert proc.returncode == 0, proc.stderr
    story.seen["versions"] = proc.stdout
    print(proc.stdout)
    return story


def test_trixie_612_builds_natively_with_cwsr_size_and_passes_vm_test(trixie):
    k = trixie.kernel
    build = trixie.run(f"rdna1-kmgr build --kernel {k} --yes", "build-6.12")
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    said = build.stdout + build.stderr
    # what build prints: "on by default: cwsr-size; compiled in, off until switched on: crat-mem ..."
    default_on = [line for line in build.stdout.splitlines() if line.strip().startswith("on by default:")]
    assert default_on and "cwsr-size" in default_on[0].split(";")[0], build.stdout
    module = Path(re.search(r"^(/var/lib/dkms/\S+/amdgpu\.ko(?:\.xz)?) \(built in", said, re.M).group(1))
    with trixie.system.files() as root:
        ident = build_id(root / module.relative_to("/"))
        manifest = json.loads(next(root.glob("usr/src/rdna1-amdgpu-*/rdna1-manifest.json")).read_text())
        config = (root / f"boot/config-{k}").read_text().splitlines()
    assert "GCC: (Debian 14." in ident, ident  # trixie's own compiler built it
    # carried because the kernel checks the CWSR mapping's end exactly, and needed because it has no SVM
    (cwsr,) = [q for q in manifest["quirks"] if q["id"] == "cwsr-size"]
    assert any("user_addr + size - 1 != mapping->last" in fact for fact in cwsr["facts"]), cwsr
    assert "cwsr-size" in manifest["active_by_default"], manifest
    assert "# CONFIG_DEVICE_PRIVATE is not set" in config
    trixie.seen.update(buildid=ident.split()[0], mask=manifest["quirks_mask"], cases=manifest["selftest_cases"])

    test = trixie.run(f"rdna1-kmgr vm-test --kernel {k} --yes", "vm-test-6.12", timeout=1800)
    assert test.returncode == 0, test.stdout[-3000:] + test.stderr[-3000:]
    said = test.stdout + test.stderr
    assert f"verdict pass (emulated, {k}" in said, said[-3000:]
    counts = re.search(r"selftest\s+(\d+) passed, 0 failed", said)
    assert counts and int(counts.group(1)) == manifest["selftest_cases"], said[-3000:]
    with trixie.system.files() as root:
        trixie.seen["before_install"] = system_state(root)


FACTS = """
echo "FACT kernel=$(uname -r)"
echo "FACT cmdline=$(cat /proc/cmdline)"
echo "FACT quirks=$(cat /sys/module/amdgpu/parameters/rdna1_quirks 2>/dev/null || echo none)"
echo "FACT loaded_buildid=$(od -An -tx1 /sys/module/amdgpu/notes/.note.gnu.build-id | tr -d ' \\n' | tail -c 40)"
echo "FACT grubenv=$(grub-editenv /boot/grub/grubenv list | tr '\\n' ' ')"
"""


def test_trixie_install_natively_then_the_trial_boot_confirms_with_the_patched_module(trixie):
    k = trixie.kernel
    proc = trixie.run(f"rdna1-kmgr install --kernel {k} --yes --confirm-after {CONFIRM_AFTER}", "install")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    env = trixie.run("grub-editenv /boot/grub/grubenv list", "grubenv-after-install").stdout
    assert "rdna1_kmgr=trial" in env, env
    boot = trixie.system.boot(
        FACTS
        + """
for i in $(seq 150); do
    grub-editenv /boot/grub/grubenv list | grep -q '^rdna1_kmgr=confirmed' && break
    sleep 2
done
echo "FACT grubenv_after=$(grub-editenv /boot/grub/grubenv list | tr '\\n' ' ')"
rdna1-kmgr status
rdna1-kmgr doctor --json > /var/lib/wholesystem/doctor.json
rdna1-kmgr doctor
""",
        timeout=1200,
    )
    assert not boot.timed_out and boot.step_rc == 0, f"{boot.step_out[-4000:]}\n{boot.tail(30)}"
    found = facts(boot.step_out)
    assert found["kernel"] == k and "rdna1_kmgr.boot=trial" in found["cmdline"], found
    assert int(found["quirks"], 0) == trixie.seen["mask"], found
    assert found["loaded_buildid"] == trixie.seen["buildid"], found
    assert "rdna1_kmgr=confirmed" in found["grubenv_after"], boot.step_out[-3000:]
    with trixie.system.files() as root:
        report = json.loads((root / STEP_DIR / "doctor.json").read_text())
    (queue,) = [f for f in report["findings"] if f["check"] == "queue"]
    assert f"kernel {k}" in queue["seen"] and "offers no SVM API" in queue["seen"], queue
    assert "an RDNA1 board needs cwsr-size" in queue["seen"], queue
    assert f"the loaded amdgpu carries cwsr-size, on (rdna1_quirks=0x{trixie.seen['mask']:x})" in queue["seen"], queue
    assert "an RDNA1 board needs cwsr-size" in boot.step_out  # the text report an owner reads says it too


def backports_kernel(trixie: Trixie) -> str | None:
    """The release trixie-backports' linux-image-amd64 points to (7.x), or None."""
    proc = trixie.run("apt-cache depends -t trixie-backports linux-image-amd64", "backports-kernel")
    match = re.search(r"Depends: linux-image-(\d+\.\d+\.\d+[^\s]*-amd64)", proc.stdout)
    return match.group(1) if match else None


def test_trixie_follow_to_backports_7x_compiles_natively_and_leaves_cwsr_size_inert(trixie):
    if os.environ.get(FULL_7X_ENV) != "1":
        pytest.skip(
            f"the native 7.x compile is the opt-in tier's ({FULL_7X_ENV}=1): with empty caches trixie's gcc-14 compile"
            " of a whole 7.x amdgpu (about 30 CPU-minutes here) does not fit CI's budget beside the rest"
        )
    new = backports_kernel(trixie)
    if new is None or not new.startswith("7."):
        pytest.skip(f"trixie-backports carries no 7.x kernel today (linux-image-amd64 -> {new})")
    print(f"\nfollow: trixie-backports' kernel {new}")
    apt = trixie.run(
        f"apt-get install -y -t trixie-backports --no-install-recommends linux-image-{new} linux-headers-{new}",
        "apt-install-7.x",
    )
    assert apt.returncode == 0, apt.stdout[-4000:] + apt.stderr[-3000:]
    assert re.search(rf"^rdna1-kmgr: {re.escape(new)}: patched: ", apt.stdout, re.M), apt.stdout[-4000:]
    status = json.loads(trixie.run("rdna1-kmgr status --json", "status-7.x").stdout)
    (entry,) = [e for e in status["kernels"] if e["kernel"] == new]
    assert entry["follow"]["state"] == "patched" and entry["journal"]["state"] == "installed", entry
    assert entry["module"]["verdict"]["verdict"] == "pass", entry
    # doctor as on a boot of that kernel without a board: a sysroot whose running release is the 7.x one, with
    # its config (what doctor reads for SVM when KFD's topology has no GPU node)
    with trixie.system.files() as root:
        module = Path(entry["module"]["path"]) if "path" in entry["module"] else None
        ident = build_id(root / module.relative_to("/")) if module else ""
        config = (root / f"boot/config-{new}").read_text()
        view = root / "var/tmp/sysroot-7x"
        (view / "proc/sys/kernel").mkdir(parents=True)
        (view / "proc/sys/kernel/osrelease").write_text(f"{new}\n")
        (view / "boot").mkdir()
        shutil.copy(root / f"boot/config-{new}", view / "boot" / f"config-{new}")
        manifest = json.loads(
            next(root.glob(f"usr/src/rdna1-amdgpu-{new.split('+')[0]}+p*/rdna1-manifest.json")).read_text()
        )
    assert not module or "GCC: (Debian 14." in ident, ident
    assert "CONFIG_HSA_AMD_SVM=y" in config
    doctor = trixie.run(
        "rdna1-kmgr doctor --json --sysroot /var/tmp/sysroot-7x; rm -r /var/tmp/sysroot-7x", "doctor-7.x"
    )
    (queue,) = [f for f in json.loads(doctor.stdout)["findings"] if f["check"] == "queue"]
    assert f"kernel {new}" in queue["seen"] and "CONFIG_HSA_AMD_SVM=y" in queue["seen"], queue
    assert "offers the SVM API" in queue["seen"] and "not affected unless HSA_USE_SVM=0" in queue["seen"], queue
    # cwsr-size is carried there too (7.x still checks a BO mapping's end exactly) and on by default: inert
    assert "cwsr-size" in manifest["active_by_default"], manifest
    trixie.seen["new"] = new
    # The 7.x objects the series touches, W=1 clean against the stock tree, compiled in the root with the
    # kernel's own headers and trixie's gcc-14: the source follow unpacked, rendered by this checkout.
    with trixie.system.entered() as root:
        src = root / "var/cache/rdna1-kmgr/src"
        (source,) = [p for p in src.iterdir() if p.name.startswith(new.split("+")[0])]
        work = root / "var/tmp/w1"
        render(source, work / "out")
        assert "../amdkfd/kfd_queue" in touched_objects(work / "out")  # cwsr-size carried on 7.x too
        try:
            assert w1_new_warnings(source, work / "out", new, work, chroot=root) == set()
        finally:
            shutil.rmtree(work)


def test_trixie_rollback_and_purge_leave_the_system_as_before(trixie):
    proc = trixie.run("rdna1-kmgr rollback --all --yes", "rollback")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    new = trixie.seen.get("new")
    if new:
        purge = trixie.run(f"apt-get purge -y linux-image-{new} linux-headers-{new}", "purge-7.x")
        assert purge.returncode == 0, purge.stdout[-3000:] + purge.stderr[-3000:]
        trixie.run("apt-get autoremove --purge -y", "autoremove")
    with trixie.system.files() as root:
        assert_same_system(trixie.seen["before_install"], system_state(root))
