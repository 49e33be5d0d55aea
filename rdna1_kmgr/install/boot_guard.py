"""The boot guard: the first boot with the patched code active is a trial; if it never confirms, the boots
after it run the distribution's own amdgpu, by themselves.

The decision is GRUB's, made before the kernel runs: Debian's initramfs loads amdgpu before the root file
system is mounted, so nothing in user space can change the quirks of that boot any more. GRUB reads its
environment block (/boot/grub/grubenv, which GRUB itself can write at boot, the same way `grub-reboot`'s
next_entry works) and puts `amdgpu.rdna1_quirks=` on every kernel command line; modprobe, in the initramfs
and later, takes module parameters from there.

    grubenv rdna1_kmgr   trial      the next boot is a trial: GRUB writes `trying`, then boots with the mask
                         trying     a trial started and never confirmed: a fallback boot
                         confirmed  boots with the mask
                         refused    the kernel refused the rdna1-kmgr file in a boot (the boot-check wrote
                                    it): fallback boots until `retry`
                         (unset)    as `trying`: fallback boots until `retry`

A fallback boot (`rdna1_kmgr.boot=fallback`) loads the distribution's own amdgpu file, in the initramfs and
after it, and never opens the rdna1-kmgr one; a trial or confirmed boot whose rdna1-kmgr file the kernel refuses
loads the distribution's in the same boot (install/stock_loader.py: a modprobe `install` rule).
    grubenv rdna1_kmgr_mask   the installed build's quirk mask

What a boot is, user space reads from /proc/cmdline: `rdna1_kmgr.boot=trial|confirmed|fallback`.

Files (install writes and journals them; rollback removes them, regenerates grub.cfg and unsets the
variables):

    /etc/grub.d/01_rdna1-kmgr                the GRUB script above (after 00_header's load_env)
    /etc/default/grub.d/rdna1-kmgr.cfg       appends ${rdna1_kmgr_args} to GRUB_CMDLINE_LINUX
    /etc/systemd/system/rdna1-kmgr-boot-check.service   every boot: on a fallback boot, or one whose
                                             rdna1-kmgr file the kernel refused, says so (console, journal,
                                             /etc/issue.d: the login prompt, /run/motd.d); after a refusal it
                                             writes `refused`, so later boots are fallback boots
    /etc/systemd/system/rdna1-kmgr-confirm.{timer,service}   a trial boot up for CONFIRM_AFTER seconds with
                                             the target reached and amdgpu loaded as installed confirms itself
    and the two `wants` links systemctl enable would make.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rdna1_kmgr.core import runner, trust
from rdna1_kmgr.core.errors import HostError, UsageError
from rdna1_kmgr.host import kmsg, rdna1_boards, sysfs, system_identity
from rdna1_kmgr.install import grub_commands, stock_loader
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.render.quirk_mask import QuirkMask

STATE = "rdna1_kmgr"
REFUSED = "refused"  # the state after a boot whose rdna1-kmgr file the kernel refused
MASK = "rdna1_kmgr_mask"
BOOT_PARAMETER = "rdna1_kmgr.boot"
CONFIRM_AFTER = 180  # seconds up before a trial boot confirms itself
TARGETS = ("graphical.target", "multi-user.target")
GRUB_SCRIPT = "etc/grub.d/01_rdna1-kmgr"
GRUB_DEFAULTS = "etc/default/grub.d/rdna1-kmgr.cfg"
UNITS = "etc/systemd/system"
CHECK_UNIT = "rdna1-kmgr-boot-check.service"
CONFIRM_UNIT = "rdna1-kmgr-confirm.service"
CONFIRM_TIMER = "rdna1-kmgr-confirm.timer"
# agetty reads /etc/issue.d next to /etc/issue (/run/issue.d only where /etc/issue is missing), so the login
# prompt's line lives in /etc: install journals it (absent), rollback removes it, a boot that is no fallback too.
ISSUE = "etc/issue.d/rdna1-kmgr.issue"
MOTD = "run/motd.d/rdna1-kmgr"
# The kernel's driver core says this when amdgpu's probe of a board fails.
_PROBE_FAILED = re.compile(r"amdgpu[ :].*(probe of \S+ failed with error|Fatal error during GPU init)")

_GRUB_SCRIPT = """\
#!/bin/sh
# Written by `rdna1-kmgr install`; `rdna1-kmgr rollback` removes it. The RDNA1 boot guard: GRUB starts a trial
# boot once (it writes `trying` before the kernel runs); until a trial confirms, boots are fallback boots
# (the distribution's amdgpu; rdna1_quirks=0 too, should anything load the rdna1-kmgr file all the same).
cat <<'EOF'
if [ "${rdna1_kmgr}" = "trial" ]; then
  set rdna1_kmgr=trying
  save_env rdna1_kmgr
  set rdna1_kmgr_args="amdgpu.rdna1_quirks=${rdna1_kmgr_mask} rdna1_kmgr.boot=trial"
elif [ "${rdna1_kmgr}" = "confirmed" ]; then
  set rdna1_kmgr_args="amdgpu.rdna1_quirks=${rdna1_kmgr_mask} rdna1_kmgr.boot=confirmed"
else
  set rdna1_kmgr_args="amdgpu.rdna1_quirks=0 rdna1_kmgr.boot=fallback"
fi
export rdna1_kmgr_args
EOF
"""

_GRUB_DEFAULTS = """\
# Written by `rdna1-kmgr install`; `rdna1-kmgr rollback` removes it. GRUB fills ${rdna1_kmgr_args} at boot
# (see /etc/grub.d/01_rdna1-kmgr): the RDNA1 quirk mask of this boot.
GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX \\${rdna1_kmgr_args}"
"""


@dataclass(frozen=True)
class Settings:
    mask: QuirkMask
    confirm_after: int = CONFIRM_AFTER
    target: str = "multi-user.target"

    def to_json(self) -> dict:
        """As the journal and install's result have always carried it: the mask as a number."""
        return {"mask": self.mask.bits, "confirm_after": self.confirm_after, "target": self.target}


def settings(
    root: TargetRoot, mask: QuirkMask | None, confirm_after: int, target: str | None
) -> tuple[Settings | None, str | None]:
    """The guard an install sets up for a build with quirk mask `mask`, or why there is none."""
    if confirm_after < 0:
        raise UsageError(f"--confirm-after {confirm_after} is negative", "give seconds, 0 or more")
    target = target or default_target(root)
    if target not in TARGETS:
        raise UsageError(f"--confirm-target {target!r} is not one the guard knows", f"use one of: {', '.join(TARGETS)}")
    why = unavailable(root)
    if why:
        return None, why
    if mask is None:
        return None, "the build's manifest names no quirk mask"
    return Settings(mask, confirm_after, target), None


def grubenv(root: TargetRoot) -> Path:
    return root.boot_dir / "grub/grubenv"


class BootLoader(Protocol):
    """What puts the guard's words on a kernel command line at boot, as a platform record names it. GRUB is the
    one there is: its files and commands (grub.d, update-grub, grub-editenv) are written out in this module."""

    def unavailable(self, root: TargetRoot) -> str | None:
        """Why this machine's boot loader cannot carry the guard (None: it can)."""
        ...


class Grub:
    """Debian's GRUB (Ubuntu's too): update-grub regenerates grub.cfg, GRUB saves its grubenv at boot."""

    def unavailable(self, root: TargetRoot) -> str | None:
        if not (root.boot_dir / "grub/grub.cfg").is_file():
            return f"GRUB is not the boot loader here ({root.boot_dir / 'grub/grub.cfg'} does not exist)"
        missing = [tool for tool in ("update-grub", "grub-editenv", "grub-probe") if runner.which(tool) is None]
        if missing:
            return f"{' and '.join(missing)} not found"
        return env_not_writable(root)


# By the name in the platform record (host/platforms.toml `boot_loader`).
BOOT_LOADERS: dict[str, BootLoader] = {"grub": Grub()}


def unavailable(root: TargetRoot) -> str | None:
    """Why this machine cannot have the guard (None: it can): its platform's boot loader must be one of
    BOOT_LOADERS, and able to carry it here."""
    if not root.is_system:
        return "the target is not this machine's root file system"
    record = system_identity.read().platform
    loader = BOOT_LOADERS.get(record.boot_loader or "")
    if loader is None:
        return (
            f"{record.name}'s boot loader ({record.boot_loader or 'none known'}) is not one rdna1-kmgr drives "
            "(GRUB through update-grub)"
        )
    return loader.unavailable(root)


# What GRUB cannot write its environment block on (grub-mkconfig's 00_header keeps recordfail off there too):
# save_env would fail at boot, a trial would never turn into `trying`, and every boot would run the quirks.
_READ_ONLY_FILE_SYSTEMS = {"btrfs", "cpiofs", "newc", "odc", "romfs", "squash4", "tarfs", "zfs"}


def env_not_writable(root: TargetRoot) -> str | None:
    """Why GRUB could not save its environment at boot on this machine (None: it can), as update-grub's own
    grub-probe sees /boot/grub: a file system GRUB cannot write, LVM or RAID under it (GRUB writes no
    diskfilter), or /boot/grub on the EFI system partition (Debian and Ubuntu keep it on ext4 /boot or /)."""
    folder = root.boot_dir / "grub"
    probe = {
        target: runner.run(["grub-probe", f"--target={target}", str(folder)], check=False)
        for target in ("fs", "abstraction")
    }
    fs = probe["fs"].stdout.strip()
    if probe["fs"].returncode != 0 or not fs:
        return f"grub-probe cannot tell the file system of {folder}"
    if fs in _READ_ONLY_FILE_SYSTEMS:
        return f"{folder} is on {fs}, where GRUB cannot save its environment at boot (the trial could never end)"
    layers = probe["abstraction"].stdout.split()
    if any(layer in ("diskfilter", "lvm", "mdraid09", "mdraid1x", "raid5rec", "raid6rec") for layer in layers):
        return (
            f"{folder} is on {' '.join(layers)}, where GRUB cannot save its environment at boot (the trial "
            "could never end)"
        )
    if fs == "fat" and folder.resolve().is_relative_to(root.boot_dir / "efi"):
        return f"{folder} lies on the EFI system partition; the boot guard needs it on the ext4 /boot or / file system"
    return None


def default_target(root: TargetRoot) -> str:
    """graphical.target when the machine boots to a desktop, else multi-user.target."""
    for folder in ("etc/systemd/system", "lib/systemd/system", "usr/lib/systemd/system"):
        link = root.path / folder / "default.target"
        if link.is_symlink():
            return "graphical.target" if Path(os.readlink(link)).name == "graphical.target" else "multi-user.target"
    return "multi-user.target"


CHECK_TIMEOUT = 120  # seconds the boot-check unit may take before systemd stops it and the boot goes on


def tool_path() -> str:
    """The rdna1-kmgr the units run as root: the one running now (its venv's console script), when nobody but
    root can change it (core/trust.py; else a HostError in one line)."""
    return str(trust.this_command())


_CHECK_UNIT_TEXT = """\
[Unit]
Description=rdna1-kmgr boot guard: says whether this boot runs the RDNA1 quirks
After=local-fs.target
Before=getty-pre.target systemd-user-sessions.service
Wants=getty-pre.target

[Service]
Type=oneshot
ExecStart={tool} boot-check
StandardOutput=journal+console
# It only reads the kernel log and writes two small files; a check that hangs must not hold up the boot.
TimeoutStartSec={timeout}

[Install]
WantedBy=multi-user.target
"""
_CONFIRM_TIMER_TEXT = """\
[Unit]
Description=rdna1-kmgr boot guard: confirm a good trial boot once it has been up {seconds} s

[Timer]
OnBootSec={seconds}
AccuracySec=1s

[Install]
WantedBy=timers.target
"""
_CONFIRM_UNIT_TEXT = """\
[Unit]
Description=rdna1-kmgr boot guard: confirm this trial boot if it is good
After={target}

[Service]
Type=oneshot
ExecStart={tool} confirm --auto --target {target}
StandardOutput=journal+console
"""


def files(root: TargetRoot, settings: Settings) -> dict[Path, str]:
    """Every file the guard writes, with its content."""
    tool = tool_path()
    units = root.path / UNITS
    return {
        root.path / GRUB_SCRIPT: _GRUB_SCRIPT,
        root.path / GRUB_DEFAULTS: _GRUB_DEFAULTS,
        units / CHECK_UNIT: _CHECK_UNIT_TEXT.format(tool=tool, timeout=CHECK_TIMEOUT),
        units / CONFIRM_TIMER: _CONFIRM_TIMER_TEXT.format(seconds=settings.confirm_after),
        units / CONFIRM_UNIT: _CONFIRM_UNIT_TEXT.format(tool=tool, target=settings.target),
    }


def runtime_files(root: TargetRoot) -> list[Path]:
    """Files the boot-check writes on fallback boots: journaled (absent) at install so rollback removes them."""
    return [root.path / ISSUE]


def links(root: TargetRoot) -> dict[Path, str]:
    """The `wants` links `systemctl enable` would make (made by hand: it works in a chroot too)."""
    units = root.path / UNITS
    return {
        units / "multi-user.target.wants" / CHECK_UNIT: f"/{UNITS}/{CHECK_UNIT}",
        units / "timers.target.wants" / CONFIRM_TIMER: f"/{UNITS}/{CONFIRM_TIMER}",
    }


def editenv(root: TargetRoot, *args: str) -> list[str]:
    return ["grub-editenv", str(grubenv(root)), *args]


def arm_commands(root: TargetRoot, settings: Settings) -> list[list[str]]:
    """After the files: GRUB's configuration regenerated, the first trial armed."""
    return [["update-grub"], editenv(root, "set", f"{STATE}=trial", f"{MASK}={settings.mask}")]


def undo_commands(root: TargetRoot) -> list[list[str]]:
    """After rollback removed the files: GRUB's configuration without the guard, its variables gone."""
    return [["update-grub"], editenv(root, "unset", STATE, MASK)]


def menu_entry_missing(root: TargetRoot, kernel: str) -> str | None:
    """Why GRUB's menu would not boot `kernel` (None: an entry's linux line loads its image). update-grub
    succeeds writing no entry at all where 10_linux cannot name the root device (a root on a loop device): a
    trial armed on such a menu would boot some other kernel, or none."""
    cfg = root.boot_dir / "grub/grub.cfg"
    text = cfg.read_text(errors="replace") if cfg.is_file() else ""
    if re.search(rf"^\s*linux(?:16|efi)?\s+\S*/vmlinuz-{re.escape(kernel)}(?:\s|$)", text, re.M):
        return None
    return f"GRUB's menu {cfg} has no entry that boots {kernel} after update-grub"


def install(root: TargetRoot, settings: Settings, write, kernel: str) -> None:
    """Write the files and links (`write(path, text)` writes durably), regenerate GRUB's configuration, check
    that its menu boots `kernel`, then arm the first trial."""
    for path, text in files(root, settings).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path, text, 0o755 if path.name == Path(GRUB_SCRIPT).name else 0o644)
    for link, target in links(root).items():
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    regenerate, arm = arm_commands(root, settings)
    hint = "the boot guard could not be set up"
    runner.run(regenerate, error=HostError, hint=hint)
    missing = menu_entry_missing(root, kernel)
    if missing:
        raise HostError(missing, "check update-grub's output and /etc/default/grub; nothing of the install stays")
    # The checkpoint covers update-grub's grub.cfg too: one file system's journal, wherever in it
    grub_commands.run([arm], lambda c: runner.run(c, error=HostError, hint=hint))
    if Path("/run/systemd/system").is_dir() and root.is_system:
        runner.run(["systemctl", "daemon-reload"], check=False)


# --- state ---------------------------------------------------------------------------------------------------


def env_values(root: TargetRoot) -> dict[str, str]:
    """GRUB's environment block as `grub-editenv list` reads it ({} when there is none)."""
    if not grubenv(root).is_file():
        return {}
    result = runner.run(editenv(root, "list"), error=HostError, hint="check /boot/grub/grubenv")
    return dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)


def this_boot(root: TargetRoot) -> str | None:
    """trial, confirmed or fallback, from this boot's command line (None: the guard did not start it)."""
    return cmdline_value(root, BOOT_PARAMETER)


def cmdline_value(root: TargetRoot, name: str) -> str | None:
    """The value of `name=` on this boot's command line, the last one (None: not there)."""
    try:
        words = root.proc_cmdline.read_text().split()
    except OSError:
        return None
    found = [w.split("=", 1)[1] for w in words if w.startswith(name + "=")]
    return found[-1] if found else None


def installed(root: TargetRoot) -> bool:
    return (root.path / GRUB_SCRIPT).is_file()


def describe(root: TargetRoot) -> dict:
    """The guard's state for `status`."""
    if not installed(root):
        return {"installed": False}
    env = env_values(root)
    state = env.get(STATE)
    boot = this_boot(root)
    next_boot = {"trial": "trial (quirks on, once)", "confirmed": "quirks on"}.get(
        state or "", "fallback (the distribution's amdgpu)"
    )
    amdgpu = stock_loader.loaded(root)
    return {
        "installed": True,
        "state": state,
        "mask": env.get(MASK),
        "this_boot": boot,
        "next_boot": next_boot,
        "loaded": {**amdgpu.to_json(), "says": amdgpu.describe()},
        "message": message(boot, state, amdgpu),
    }


def _loader_said(amdgpu: stock_loader.LoadedAmdgpu) -> str:
    """The loader's last kernel-log line this boot, without its mark."""
    return amdgpu.loader_lines[-1].removeprefix(stock_loader.MARK)


def _refused_message(amdgpu: stock_loader.LoadedAmdgpu) -> str:
    # what this boot runs as the module list has it: the loader's fallback can fail too (no stock file)
    instead = (
        "so the distribution's amdgpu was loaded instead"
        if amdgpu.which == "distribution"
        else f"and the distribution's amdgpu did not load either ({_loader_said(amdgpu)}): this boot has no amdgpu"
    )
    return (
        f"rdna1-kmgr: the kernel refused the rdna1-kmgr amdgpu this boot ({amdgpu.reason}), {instead}, and "
        "the next boots load the distribution's. Fix the cause (`rdna1-kmgr keys status` if it is the signing "
        "key), then `rdna1-kmgr retry`."
    )


def message(boot: str | None, state: str | None, amdgpu: stock_loader.LoadedAmdgpu | None = None) -> str:
    if boot in ("trial", "confirmed") and amdgpu is not None and amdgpu.refused:
        return _refused_message(amdgpu)
    if boot == "fallback" and state == REFUSED:
        return (
            "rdna1-kmgr: the kernel refused the rdna1-kmgr amdgpu in an earlier boot, so this boot runs the "
            "distribution's amdgpu (`journalctl -k -b -1 | grep -e amdgpu -e rdna1-kmgr` shows why). Fix the cause, "
            "then `rdna1-kmgr retry`; `rdna1-kmgr rollback` removes the patched driver."
        )
    if boot == "fallback" and state == "trying":
        return (
            "rdna1-kmgr: the last trial boot with the RDNA1 amdgpu quirks did not confirm, so this boot runs "
            "the distribution's amdgpu. `rdna1-kmgr retry` tries once more at the "
            "next boot; `rdna1-kmgr rollback` removes the patched driver."
        )
    if boot == "fallback":
        return (
            "rdna1-kmgr: this boot runs the distribution's amdgpu. "
            "`rdna1-kmgr retry` makes the next boot a trial with the quirks on."
        )
    if boot == "trial" and state == "confirmed":
        return "rdna1-kmgr: this trial boot is confirmed: later boots run the RDNA1 amdgpu quirks on."
    if boot == "trial":
        return (
            "rdna1-kmgr: this is a trial boot with the RDNA1 amdgpu quirks on; it confirms itself once "
            "it has been up a while, or run `rdna1-kmgr confirm`. If it does not, the next boot "
            "runs them off."
        )
    if boot == "confirmed":
        return "rdna1-kmgr: the RDNA1 amdgpu quirks are on (confirmed)."
    return "rdna1-kmgr: this boot was not started by the boot guard."


# --- the commands ---------------------------------------------------------------------------------------------


def _require_installed(root: TargetRoot) -> None:
    if not installed(root):
        raise UsageError(
            "the boot guard is not installed here",
            "it comes with `rdna1-kmgr install` on a machine that boots with GRUB",
        )


def retry(root: TargetRoot, dry_run: bool = False) -> str:
    """Arm one more trial: the next boot runs the quirks on, once."""
    _require_installed(root)
    command = editenv(root, "set", f"{STATE}=trial")
    if dry_run:
        return " ".join(command)
    grub_commands.run([command], lambda c: runner.run(c, error=HostError, hint="nothing was changed"))
    return "the next boot is a trial with the RDNA1 quirks on; it confirms itself, or the boot after it runs them off"


def confirm(root: TargetRoot, auto: bool = False, target: str | None = None, dry_run: bool = False) -> str:
    """Confirm this trial boot: every later boot runs the quirks on. `auto` first checks that it is good."""
    _require_installed(root)
    boot, env = this_boot(root), env_values(root)
    if boot != "trial" or env.get(STATE) != "trying":
        if auto:
            return f"rdna1-kmgr: not a trial boot ({boot or 'not started by the guard'}): nothing to confirm"
        raise UsageError(
            f"this boot is not a trial (it is {boot or 'not started by the boot guard'}, "
            f"state {env.get(STATE) or 'unset'})",
            "`rdna1-kmgr retry` makes the next boot a trial; confirm during that boot",
        )
    if auto:
        mask = QuirkMask.parse(env[MASK]) if env.get(MASK) else None
        problems = check_good(root, mask, target or "multi-user.target")
        if problems:
            return (
                "rdna1-kmgr: this trial boot does not confirm ("
                + "; ".join(problems)
                + "): the next boot runs the distribution's amdgpu"
            )
    command = editenv(root, "set", f"{STATE}=confirmed")
    if dry_run:
        return " ".join(command)
    grub_commands.run([command], lambda c: runner.run(c, error=HostError, hint="nothing was changed"))
    return "rdna1-kmgr: trial boot confirmed: later boots run the RDNA1 amdgpu quirks on"


def check_good(root: TargetRoot, mask: QuirkMask | None, target: str) -> list[str]:
    """What keeps this boot from counting as good (empty: it is good)."""
    problems = []
    params = root.sys_module / "amdgpu/parameters/rdna1_quirks"
    if not params.is_file():
        problems.append("amdgpu is not loaded with rdna1_quirks")
    elif mask is not None and int(params.read_text().strip(), 0) != mask.bits:
        problems.append(f"amdgpu runs rdna1_quirks={params.read_text().strip()}, not {mask}")
    result = runner.run(["systemctl", "is-active", target], check=False)
    if result.stdout.strip() != "active":
        problems.append(f"{target} is {result.stdout.strip() or 'unknown'}")
    failed = [r.message for r in kmsg.records(root.path) if _PROBE_FAILED.search(r.message)]
    if failed:
        problems.append(f"amdgpu probe failed: {failed[-1]}")
    for device in sysfs.list_display_devices(root.path):
        if rdna1_boards.is_rdna1(device.vendor, device.device) and device.driver != "amdgpu":
            problems.append(f"{device.bdf} is not bound to amdgpu")
    return problems


def boot_check(root: TargetRoot) -> str:
    """At every boot: what kind of boot this is; on a fallback boot, or one whose rdna1-kmgr file the kernel
    refused, said at the login prompt and in motd. After a refusal the later boots are fallback boots."""
    if not installed(root):
        return "rdna1-kmgr: the boot guard is not installed"
    boot, state = this_boot(root), env_values(root).get(STATE)
    amdgpu = stock_loader.loaded(root)
    refused_now = boot in ("trial", "confirmed") and amdgpu.refused
    if refused_now and state != REFUSED:
        runner.run(editenv(root, "set", f"{STATE}={REFUSED}"), error=HostError, hint="check /boot/grub/grubenv")
    text = message(boot, state, amdgpu)
    for rel in (ISSUE, MOTD):
        path = root.path / rel
        if boot == "fallback" or refused_now:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text + "\n")
        else:
            path.unlink(missing_ok=True)
    return text
