"""The stock-amdgpu loader: a fallback boot never opens the rdna1-kmgr module file, and a boot whose rdna1-kmgr
file the kernel refuses ends on the distribution's own amdgpu in that same boot.

Switching the quirks off (`amdgpu.rdna1_quirks=0`) is no fallback when the file itself cannot load: a signing
key the firmware no longer trusts, a symbol whose version the kernel does not export, an init that fails before
any parameter matters. Every boot would try the same file again and the owner would have no display driver.

How, with what every distribution has: a modprobe `install` rule. modprobe (the one in the initramfs, udev's
libkmod, a later `modprobe amdgpu`) runs our program instead of loading amdgpu itself, with the module's
options (those of modprobe.d and of the kernel command line) as arguments:

    rdna1_kmgr.boot=fallback on /proc/cmdline   insmod the distribution's file (its dependencies first,
                                                 by name); the rdna1-kmgr file is not opened
    any other boot                               modprobe --ignore-install amdgpu (the index gives the
                                                 rdna1-kmgr file); when the kernel refuses it, the
                                                 distribution's file at once
    the program is gone                          the rule itself loads the distribution's file the same
                                                 way (the index's only when that is not there either)

Why this and not another tool: depmod's search order and a second initramfs decide per kernel, not per boot,
and after the root file system is mounted the installed module index would pick the rdna1-kmgr file again;
a blacklist names a module, not a file. The rule is read in the initramfs (initramfs-tools and dracut copy
modprobe.d) and after it, so one decision serves both; and it asks the kernel itself whether the file loads,
so it covers causes nobody listed. The initramfs gets the program and, when it carries amdgpu, the
distribution's amdgpu file beside ours (the initramfs tool's hook, install/initramfs.py).

The program writes what it did to the kernel log with the prefix `rdna1-kmgr:` (MARK); `status` and the
boot-check read it from there. It uses only sh, cat, uname and kmod's programs: the initramfs has no more.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.host import kmsg
from rdna1_kmgr.install.initramfs import InitramfsTool
from rdna1_kmgr.install.target_root import TargetRoot

LOADER = "usr/local/lib/rdna1-kmgr/amdgpu-loader"
RULE = "etc/modprobe.d/rdna1-kmgr-loader.conf"
MARK = "rdna1-kmgr: "
STOCK_DIR = "kernel/drivers/gpu/drm/amd/amdgpu"
# Where DKMS keeps the distribution's amdgpu while ours is installed, when it moved it out of STOCK_DIR (its
# "original module" archive, per kernel and machine: DKMS moves a same-named module it finds once in the kernel's
# tree; measured with Debian 13's DKMS 3.2.2, which took amdgpu.ko.xz away) and puts it back on uninstall.
ORIGINAL_DIR = "var/lib/dkms/rdna1-amdgpu/original_module"
# The loader's lines, as the kernel log keeps them (the program below writes them).
FALLBACK_LOAD = "loading the distribution's amdgpu"
REFUSED = "the rdna1-kmgr amdgpu did not load"
# What the kernel says when it refuses a module file: about amdgpu by name (a symbol version or a symbol it
# does not have, an init or probe that failed), or about a signature, where 6.1 names no module ("Loading of
# module with unavailable key is rejected", lockdown's "unsigned module loading is restricted").
_AMDGPU_REFUSAL = re.compile(
    r"module verification failed|disagrees about version of symbol|Unknown symbol|probe of \S+ failed|"
    r"Fatal error during GPU init|initialization failed|failed to load",
    re.IGNORECASE,
)
_SIGNATURE_REFUSAL = re.compile(r"Loading of .*module.* is rejected|Key was rejected|module loading is restricted")


def _is_refusal(message: str) -> bool:
    return bool(_SIGNATURE_REFUSAL.search(message)) or ("amdgpu" in message and bool(_AMDGPU_REFUSAL.search(message)))


def _say_line() -> str:
    return f'say() {{ echo "<4>{MARK}$*" > /dev/kmsg 2>/dev/null || :; }}'


# The stock module has no rdna1_quirks: leave it out rather than have the kernel warn about it.
_OPTIONS = (
    'options=""',
    'for option in "$@"; do',
    'case "$option" in rdna1_quirks=*) ;; *) options="$options $option" ;; esac',
    "done",
)
# The distribution's file (where the kernel package put it, or where DKMS keeps it), loaded as modprobe would
# load it: its dependencies by name first, then the file with $options. Shared by the loader and the rule (for
# a loader gone missing); it falls through when the file is not there, and the caller says what then.
_STOCK_LOAD = (
    f'for file in /lib/modules/"$(uname -r)"/{STOCK_DIR}/amdgpu.ko*'
    f' /{ORIGINAL_DIR}/"$(uname -r)"/"$(uname -m)"/amdgpu.ko*; do',
    '[ -f "$file" ] || continue',
    f'say "{FALLBACK_LOAD} ($file): $reason"',
    'deps=$(/sbin/modinfo -F depends "$file") || deps=""',
    "IFS=,",
    "set -- $deps",
    "IFS=' '",
    '[ $# -eq 0 ] || /sbin/modprobe --ignore-install -a "$@" || :',
    "set -f",  # the options are words, not file patterns
    'exec /sbin/insmod "$file" $options',
    "done",
)


def _block(lines: tuple[str, ...], indent: str) -> str:
    """The lines as a program's, a loop's body one tab in."""
    depth, out = 0, []
    for line in lines:
        depth -= line == "done"
        out.append(indent + "\t" * depth + line)
        depth += line.endswith("; do")
    return "\n".join(out)


def _one_line(lines: tuple[str, ...]) -> str:
    """The lines as one sh command line (a modprobe.d rule is one line): `do` takes no `;` after it."""
    return "".join(line + (" " if line.endswith("; do") else "; ") for line in lines).removesuffix("; ")


_PROGRAM = f"""\
#!/bin/sh
# Written by `rdna1-kmgr install`; `rdna1-kmgr rollback` removes it. modprobe runs it to load amdgpu (the
# `install amdgpu` rule in /{RULE}), in the initramfs and after it, with the module's
# options as arguments. On a fallback boot (rdna1_kmgr.boot=fallback, put there by GRUB) it loads the
# distribution's amdgpu and never opens the rdna1-kmgr file; on any other boot the file the module index gives,
# and the distribution's at once when the kernel refuses that one. Only sh, cat, uname and kmod: the initramfs
# has no more. What it did goes to the kernel log (`rdna1-kmgr status` reads it there).

{_say_line()}

# The stock module has no rdna1_quirks: leave it out rather than have the kernel warn about it.
{_block(_OPTIONS, "")}

# The distribution's amdgpu, its dependencies first (by name, as modprobe would).
stock() {{
	reason=$1
{_block(_STOCK_LOAD, chr(9))}
	say "the distribution's amdgpu is not in /lib/modules/$(uname -r)/{STOCK_DIR}"
	exit 1
}}

read -r cmdline < /proc/cmdline
case " $cmdline " in
*" rdna1_kmgr.boot=fallback "*) stock "a fallback boot (rdna1_kmgr.boot=fallback)" ;;
esac
/sbin/modprobe --ignore-install amdgpu "$@" && exit 0
status=$?
say "{REFUSED} ($(/sbin/modinfo -n amdgpu 2>/dev/null), modprobe exit status $status)"
stock "the kernel refused the rdna1-kmgr file (its reason is in the lines before)"
"""
# Without the loader (deleted by hand, an initramfs made without it, a rollback cut short) the rule loads the
# distribution's file itself, the options split as words (set -f: not file patterns); where that file is not
# there either (an initramfs that carries only the rdna1-kmgr one), what the module index gives: a missing file
# must not leave the owner without a display driver.
_WITHOUT_LOADER = (
    _say_line(),
    "set -f",
    "set -- $CMDLINE_OPTS",
    "set +f",
    *_OPTIONS,
    f'reason="/{LOADER} is missing"',
    *_STOCK_LOAD,
    f"say \"/{LOADER} is missing and the distribution's amdgpu is not in /lib/modules/$(uname -r)/{STOCK_DIR}:"
    ' loading what the module index gives"',
    "exec /sbin/modprobe --ignore-install amdgpu $CMDLINE_OPTS",
)


def rule_text() -> str:
    """The rule modprobe runs (through sh, `$CMDLINE_OPTS` replaced by the module's options) instead of loading
    amdgpu: the loader, or without it the distribution's amdgpu (`_WITHOUT_LOADER`)."""
    return (
        "# Written by `rdna1-kmgr install`; `rdna1-kmgr rollback` removes it. amdgpu loads through rdna1-kmgr's\n"
        "# loader: the distribution's own amdgpu on a fallback boot, or when the kernel refuses the rdna1-kmgr one;\n"
        "# without the loader, the distribution's amdgpu.\n"
        f"install amdgpu if [ -x /{LOADER} ]; then exec /{LOADER} $CMDLINE_OPTS; fi; {_one_line(_WITHOUT_LOADER)}\n"
    )


def program_text() -> str:
    return _PROGRAM


def files(root: TargetRoot, tool: InitramfsTool) -> dict[Path, tuple[str, int]]:
    """The rule, the program and the initramfs tool's hook that puts them in its images: path -> (content,
    mode)."""
    return {
        root.path / LOADER: (program_text(), 0o755),
        root.path / RULE: (rule_text(), 0o644),
        **tool.loader_hooks(LOADER, RULE, STOCK_DIR, ORIGINAL_DIR),
    }


@dataclass(frozen=True)
class LoadedAmdgpu:
    """Which amdgpu file this boot runs, and the loader's and the kernel's words on why."""

    which: str  # "rdna1-kmgr", "distribution" or "none"
    loader_lines: tuple[str, ...]  # what the loader wrote to the kernel log this boot
    refusal_lines: tuple[str, ...]  # the kernel's reasons for refusing a module file this boot

    @property
    def refused(self) -> bool:
        """The rdna1-kmgr file was tried this boot and the kernel did not take it."""
        return any(REFUSED in line for line in self.loader_lines)

    def to_json(self) -> dict:
        return {"file": self.which, "loader": list(self.loader_lines), "kernel": list(self.refusal_lines)}

    @property
    def reason(self) -> str:
        """The kernel's words on why it refused a module file this boot (its last two lines)."""
        return "; ".join(self.refusal_lines[-2:]) or "the kernel log says no more"

    def describe(self) -> str:
        if self.which == "none":
            return "amdgpu is not loaded"
        if self.which == "rdna1-kmgr":
            return "the rdna1-kmgr amdgpu (it has rdna1_quirks)"
        if self.refused:
            return f"the distribution's amdgpu: the kernel refused the rdna1-kmgr file ({self.reason})"
        if any(FALLBACK_LOAD in line for line in self.loader_lines):
            return "the distribution's amdgpu: a fallback boot does not load the rdna1-kmgr file"
        return "the distribution's amdgpu"


def loaded(root: TargetRoot) -> LoadedAmdgpu:
    module = root.sys_module / "amdgpu"
    if not module.is_dir():
        which = "none"
    elif (module / "parameters/rdna1_quirks").is_file():
        which = "rdna1-kmgr"  # only the rdna1-kmgr build has this parameter
    else:
        which = "distribution"
    records = kmsg.records(root.path)
    ours = tuple(r.message[len(MARK) :] for r in records if r.message.startswith(MARK))
    refusals = tuple(r.message for r in records if _is_refusal(r.message) and not r.message.startswith(MARK))
    return LoadedAmdgpu(which, ours, refusals)
