"""The boot guard's reading of a boot and its refusals, on a scratch root (fast). The whole mechanism, GRUB and
all, is proven in test_boot_guard.py on a whole system."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.install import boot_guard, stock_loader
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.render.quirk_mask import QuirkMask

CLI = Path(sys.executable).parent / "rdna1-kmgr"


def scratch(tmp_path: Path, cmdline: str, guard: bool = True) -> TargetRoot:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cmdline").write_text(cmdline + "\n")
    if guard:
        script = tmp_path / boot_guard.GRUB_SCRIPT
        script.parent.mkdir(parents=True)
        script.write_text("#!/bin/sh\n")
    return TargetRoot(tmp_path)


@pytest.mark.parametrize(
    "cmdline, kind",
    [
        ("BOOT_IMAGE=/vmlinuz ro amdgpu.rdna1_quirks=0x3 rdna1_kmgr.boot=trial", "trial"),
        ("ro amdgpu.rdna1_quirks=0 rdna1_kmgr.boot=fallback quiet", "fallback"),
        ("ro quiet", None),
    ],
)
def test_boot_guard_reads_the_kind_of_boot_from_the_command_line(tmp_path, cmdline, kind):
    assert boot_guard.this_boot(scratch(tmp_path, cmdline)) == kind


def test_boot_guard_confirm_refuses_a_boot_that_is_no_trial(tmp_path):
    root = scratch(tmp_path, "ro amdgpu.rdna1_quirks=0 rdna1_kmgr.boot=fallback")
    with pytest.raises(UsageError, match="not a trial .*fallback"):
        boot_guard.confirm(root)
    # the timer's automatic run says so and changes nothing
    assert "nothing to confirm" in boot_guard.confirm(root, auto=True)


def test_boot_guard_fallback_boot_says_so_at_login(tmp_path):
    root = scratch(tmp_path, "ro amdgpu.rdna1_quirks=0 rdna1_kmgr.boot=fallback")
    said = boot_guard.boot_check(root)
    assert "the distribution's amdgpu" in said and "retry" in said
    for rel in (boot_guard.ISSUE, boot_guard.MOTD):
        assert (tmp_path / rel).read_text().strip() == said


def _kernel_log(root: Path, *messages: str) -> None:
    """A /dev/kmsg fixture: one record a message, as the device gives them (priority,seq,usec,flags;text)."""
    (root / "dev").mkdir(exist_ok=True)
    (root / "dev/kmsg").write_text("".join(f"4,{n},{n * 1000},-;{m}\n" for n, m in enumerate(messages, 1)))


def _amdgpu_loaded(root: Path, rdna1_kmgr_file: bool) -> None:
    (root / "sys/module/amdgpu/parameters").mkdir(parents=True)
    if rdna1_kmgr_file:
        (root / "sys/module/amdgpu/parameters/rdna1_quirks").write_text("3\n")


# What Debian's 6.1 kernel logs when lockdown refuses a module signed with a key it does not trust, then what
# the loader writes (install/stock_loader.py's program).
REFUSED_UNDER_LOCKDOWN = (
    "Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7",
    "rdna1-kmgr: the rdna1-kmgr amdgpu did not load (/lib/modules/6.1.0-56-amd64/updates/dkms/amdgpu.ko, "
    "modprobe exit status 1)",
    "rdna1-kmgr: loading the distribution's amdgpu "
    "(/lib/modules/6.1.0-56-amd64/kernel/drivers/gpu/drm/amd/amdgpu/amdgpu.ko): the kernel refused the "
    "rdna1-kmgr file (its reason is in the lines before)",
)


def test_boot_guard_a_refused_file_turns_later_boots_into_fallback_boots(tmp_path, monkeypatch):
    """A confirmed boot whose rdna1-kmgr file the kernel refused ran the distribution's amdgpu: the boot-check
    says so with the kernel's reason, and writes `refused` so the next boots never try the file again."""
    root = scratch(tmp_path, "ro amdgpu.rdna1_quirks=0x3 rdna1_kmgr.boot=confirmed")
    _kernel_log(tmp_path, "amdgpu: something else", *REFUSED_UNDER_LOCKDOWN)
    _amdgpu_loaded(tmp_path, rdna1_kmgr_file=False)
    written = []
    monkeypatch.setattr(boot_guard, "env_values", lambda root: {boot_guard.STATE: "confirmed"})
    monkeypatch.setattr(boot_guard.runner, "run", lambda argv, **kw: written.append(argv))
    said = boot_guard.boot_check(root)
    assert written == [boot_guard.editenv(root, "set", "rdna1_kmgr=refused")]
    assert "refused the rdna1-kmgr amdgpu this boot" in said and "unsigned module loading is restricted" in said
    assert (tmp_path / boot_guard.ISSUE).read_text().strip() == said
    # the boot after it: a fallback boot that says why
    (tmp_path / "proc/cmdline").write_text("ro amdgpu.rdna1_quirks=0 rdna1_kmgr.boot=fallback\n")
    monkeypatch.setattr(boot_guard, "env_values", lambda root: {boot_guard.STATE: "refused"})
    assert "refused the rdna1-kmgr amdgpu in an earlier boot" in boot_guard.boot_check(root)
    assert len(written) == 1


def test_boot_guard_status_names_the_loaded_file(tmp_path):
    root = scratch(tmp_path, "ro amdgpu.rdna1_quirks=0x3 rdna1_kmgr.boot=confirmed")
    _kernel_log(tmp_path, "amdgpu: kernel modesetting enabled.")
    assert stock_loader.loaded(root).describe() == "amdgpu is not loaded"
    _amdgpu_loaded(tmp_path, rdna1_kmgr_file=True)
    loaded = stock_loader.loaded(root)
    assert loaded.which == "rdna1-kmgr" and not loaded.refused and loaded.refusal_lines == ()


def test_boot_guard_commands_without_a_guard_are_one_clear_error(tmp_path):
    scratch(tmp_path, "ro", guard=False)
    for command in (["confirm"], ["retry"]):
        proc = subprocess.run(
            [str(CLI), *command],
            capture_output=True,
            text=True,
            env={"RDNA1_KMGR_ROOT": str(tmp_path), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and "boot guard is not installed" in proc.stderr


def test_boot_guard_is_not_offered_where_grub_is_not_the_boot_loader(tmp_path):
    assert "not this machine's root" in boot_guard.unavailable(TargetRoot(tmp_path))


def test_boot_guard_confirm_target_follows_the_default_target(tmp_path):
    units = tmp_path / "etc/systemd/system"
    units.mkdir(parents=True)
    assert boot_guard.default_target(TargetRoot(tmp_path)) == "multi-user.target"
    (units / "default.target").symlink_to("/lib/systemd/system/graphical.target")
    assert boot_guard.default_target(TargetRoot(tmp_path)) == "graphical.target"


def test_boot_guard_grub_script_consumes_the_trial_before_the_kernel_runs(tmp_path):
    """The generated GRUB code: `trial` is rewritten to `trying` and saved before a kernel line uses the mask;
    anything but `confirmed` after that means quirks off."""
    files = boot_guard.files(TargetRoot(tmp_path), boot_guard.Settings(mask=QuirkMask(3)))
    script = files[tmp_path / boot_guard.GRUB_SCRIPT]
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    trial = out.index('= "trial"')
    assert (
        out.index("set rdna1_kmgr=trying", trial)
        < out.index("save_env rdna1_kmgr", trial)
        < out.index("rdna1_kmgr.boot=trial", trial)
    )
    assert "amdgpu.rdna1_quirks=0 rdna1_kmgr.boot=fallback" in out and "export rdna1_kmgr_args" in out
    assert "OnBootSec=180" in files[tmp_path / boot_guard.UNITS / boot_guard.CONFIRM_TIMER]


@pytest.mark.parametrize(
    "fs, abstraction, refused",
    [
        ("ext2", "", None),  # grub-probe says ext2 for ext4: Debian's and Ubuntu's /boot
        ("btrfs", "", "on btrfs, where GRUB cannot save"),
        ("zfs", "", "on zfs, where GRUB cannot save"),
        ("ext2", "lvm", "on lvm, where GRUB cannot save"),
        ("ext2", "diskfilter mdraid1x", "on diskfilter mdraid1x"),
    ],
)
def test_boot_guard_refuses_where_grub_cannot_save_its_environment(tmp_path, monkeypatch, fs, abstraction, refused):
    """GRUB's save_env writes the block in place and cannot on these (grub-mkconfig's 00_header turns Ubuntu's
    recordfail off for the same file systems): a trial there would never become `trying`."""
    tools = tmp_path / "bin"
    tools.mkdir()
    probe = tools / "grub-probe"
    probe.write_text(
        f'#!/bin/sh\ncase "$1" in --target=fs) echo {fs};; --target=abstraction) echo {abstraction};; ' "esac\n"
    )
    probe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    why = boot_guard.env_not_writable(TargetRoot(tmp_path))
    assert why is None if refused is None else refused in why, why


def test_boot_guard_refuses_grub_on_the_efi_system_partition(tmp_path, monkeypatch):
    (tmp_path / "boot/efi/grub").mkdir(parents=True)
    (tmp_path / "boot/grub").symlink_to("efi/grub")  # an ESP-only layout: /boot/grub lives on the ESP
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "grub-probe").write_text('#!/bin/sh\ncase "$1" in --target=fs) echo fat;; esac\n')
    (tools / "grub-probe").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    assert "EFI system partition" in boot_guard.env_not_writable(TargetRoot(tmp_path))


def test_the_boot_check_unit_has_a_start_timeout_systemd_reads(tmp_path):
    """The review: the boot-check unit (Type=oneshot, ordered before the login prompts) had no start timeout, so
    a check that hung would hold the boot. systemd's own parser reads the value as a finite time."""
    files = boot_guard.files(TargetRoot(tmp_path), boot_guard.Settings(mask=QuirkMask(3)))
    unit = files[tmp_path / boot_guard.UNITS / boot_guard.CHECK_UNIT]
    (timeout,) = [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("TimeoutStartSec=")]
    assert timeout.isdigit() and 0 < int(timeout) <= 300
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    analyze = subprocess.run(["systemd-analyze", "timespan", timeout], capture_output=True, text=True)
    assert f"μs: {int(timeout) * 1000000}" in analyze.stdout, analyze.stdout + analyze.stderr


# GRUB's menu as grub-mkconfig's 10_linux writes an entry (util/grub.d/10_linux.in: `linux ${rel_dirname}/${basename}
# root=... ro ${args}`, the path relative to the file system /boot is on), and as it writes none at all when it
# cannot name the root device (a root on a loop device: only 00_header's settings and 30_os-prober/41_custom).
ENTRY = """menuentry 'Debian GNU/Linux' --class debian --class gnu-linux --class gnu --class os $menuentry_id_option 'gnulinux-simple-1' {{
	load_video
	insmod gzio
	insmod part_msdos
	insmod ext2
	echo	'Loading Linux {kernel} ...'
	linux	{prefix}/vmlinuz-{kernel} root=UUID=0b7e0ae5-3a6f-4c53-9b1a-5b0b5d6a2b1c ro  quiet
	echo	'Loading initial ramdisk ...'
	initrd	{prefix}/initrd.img-{kernel}
}}
"""
HEADER = "set default=0\nif [ -s $prefix/grubenv ]; then\n  load_env\nfi\n### BEGIN /etc/grub.d/10_linux ###\n"


@pytest.mark.parametrize(
    "menu, missing",
    [
        (HEADER + ENTRY.format(prefix="/boot", kernel="6.12.118+deb13-amd64"), False),
        (HEADER + ENTRY.format(prefix="", kernel="6.12.118+deb13-amd64"), False),  # /boot a file system of its own
        (HEADER + "### END /etc/grub.d/10_linux ###\n", True),  # update-grub found no root device to name
        (HEADER + ENTRY.format(prefix="/boot", kernel="6.12.118+deb13-amd64-rt"), True),  # another flavour only
        (HEADER + ENTRY.format(prefix="/boot", kernel="6.1.0-56-amd64"), True),
    ],
)
def test_boot_guard_needs_a_menu_entry_that_boots_the_kernel(tmp_path, menu, missing):
    (tmp_path / "boot/grub").mkdir(parents=True)
    (tmp_path / "boot/grub/grub.cfg").write_text(menu)
    said = boot_guard.menu_entry_missing(TargetRoot(tmp_path), "6.12.118+deb13-amd64")
    assert (said is not None) == missing
    if missing:
        assert (
            said
            == f"GRUB's menu {tmp_path}/boot/grub/grub.cfg has no entry that boots 6.12.118+deb13-amd64 after update-grub"
        )


@pytest.mark.parametrize("which", ["distribution", "none"])
def test_boot_guard_message_after_a_refusal_says_what_this_boot_runs(which):
    # the loader's kernel-log lines as install/stock_loader.py's program writes them (REFUSED, then the fallback's
    # line: it loaded the distribution's file, or found none)
    fallback = (
        f"rdna1-kmgr: {stock_loader.FALLBACK_LOAD} (/lib/modules/6.12.118+deb13-amd64/kernel/drivers/gpu/drm/amd/amdgpu/"
        "amdgpu.ko.xz): the kernel refused the rdna1-kmgr file"
        if which == "distribution"
        else "rdna1-kmgr: the distribution's amdgpu is not in /lib/modules/6.12.118+deb13-amd64/kernel/drivers/gpu/drm/amd/amdgpu"
    )
    amdgpu = stock_loader.LoadedAmdgpu(
        which,
        (
            f"rdna1-kmgr: {stock_loader.REFUSED} (/lib/modules/6.12.118+deb13-amd64/updates/dkms/amdgpu.ko.xz, modprobe exit status 1)",
            fallback,
        ),
        ("Loading of module with unavailable key is rejected",),
    )
    said = boot_guard.message("confirmed", "confirmed", amdgpu)
    assert said.startswith("rdna1-kmgr: the kernel refused the rdna1-kmgr amdgpu this boot (Loading of module with")
    if which == "distribution":
        assert "so the distribution's amdgpu was loaded instead" in said
    else:
        assert "did not load either" in said and "is not in" in said and "this boot has no amdgpu" in said
        assert "was loaded instead" not in said
