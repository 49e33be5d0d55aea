"""Checks for everything that comes from the user before it reaches a path or a command line."""

import re
from pathlib import Path

from rdna1_kmgr.core.errors import UsageError

# A kernel release as uname -r prints it: 6.1.0-56-amd64, 6.12.95+deb12-amd64, 7.2.0-rc3.
_KREL = re.compile(r"[0-9]+\.[0-9]+(\.[0-9]+)?[A-Za-z0-9.+_~-]*")
# domain:bus:device.function, as sysfs names PCI devices.
_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]")
# useradd's rule (shadow's is_valid_user_name), less a leading digit or dot: what SUDO_USER, --user or a plan
# may hold.
USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")
# One amdgpu parameter as the kernel command line takes it: nothing GRUB's shell-sourced defaults could read as code.
AMDGPU_PARAMETER = re.compile(r"amdgpu\.[a-z0-9_]+=(0x[0-9a-f]+|-?[0-9]+)")


def kernel_release(value: str) -> str:
    if not value or "/" in value or ".." in value or len(value) > 64 or not _KREL.fullmatch(value):
        raise UsageError(
            f"invalid kernel release {value!r}",
            "give a release as `uname -r` prints it, e.g. 6.1.0-56-amd64",
        )
    return value


def named_by_release(folder: Path, suffix: str = "") -> list[tuple[str, Path]]:
    """(release, entry) for each entry of `folder` named `<kernel release><suffix>`, sorted by name; anything
    else there is not ours and is skipped. A folder that does not exist has none."""
    if not folder.is_dir():
        return []
    found = []
    for entry in sorted(folder.iterdir()):
        if not entry.name.endswith(suffix):
            continue
        try:
            found.append((kernel_release(entry.name[: len(entry.name) - len(suffix)]), entry))
        except UsageError:
            continue
    return found


def pci_address(value: str) -> str:
    bdf = value.lower()
    if len(bdf) == 7:  # bus:dev.fn without the domain
        bdf = "0000:" + bdf
    if not _BDF.fullmatch(bdf):
        raise UsageError(
            f"invalid PCI address {value!r}", "give it as DDDD:BB:DD.F, e.g. 0000:03:00.0 (see `lspci -D`)"
        )
    return bdf


def pci_device_id(value: str) -> int:
    """A 16-bit PCI device id written as 0xNNNN or NNNN."""
    text = value.lower().removeprefix("0x")
    if not re.fullmatch(r"[0-9a-f]{4}", text):
        raise UsageError(f"invalid PCI device id {value!r}", "give four hex digits, e.g. 0x731F")
    return int(text, 16)


def existing_dir(value: str | Path, what: str) -> Path:
    path = Path(value)
    if not path.is_dir():
        raise UsageError(f"{what} {str(path)!r} is not a directory", "check the path")
    return path.resolve()


def user_name(value: str, what: str = "--user") -> str:
    if not USER_NAME.fullmatch(value):
        raise UsageError(f"{what} {value!r} is not a user name", "give a login name as /etc/passwd has it")
    return value


def positive_seconds(option: str, seconds: float) -> None:
    """A limit in seconds (--timeout, --cell-timeout) must be one: refused in one line before anything runs."""
    if seconds <= 0:
        raise UsageError(f"invalid {option} {seconds:g}", "give a number of seconds > 0")
