"""The record of devices a run moved to vfio-pci, so that a run killed with SIGKILL can still give them back.

One small JSON file per device, state_dir()/vfio/<bdf>.json, written and fsynced before the device is
touched and removed once it is back on its driver. Each names the run that made it (a token also put in the
environment of the VM's processes, so `vm-test restore` can find a QEMU the killed run left behind), the
process that owns it (pid, start time, boot id: a reused pid or a reboot does not look like a live owner)
and the last kernel log record before the bind (so "no probe error since the bind" can be checked later).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from rdna1_kmgr.core import user_input
from rdna1_kmgr.core.errors import Exit, KmgrError, UsageError
from rdna1_kmgr.core.files import fsync_dir, make_dirs, write_json
from rdna1_kmgr.core.paths import state_dir

RUN_ENV = "RDNA1_KMGR_VFIO_RUN"  # set in the VM's environment; names the run whose devices it holds


class RecordRefused(KmgrError):
    """A vfio record a run did not write: nothing is given back from it."""

    exit_code = Exit.JOURNAL


@dataclass(frozen=True)
class Binding:
    bdf: str
    vendor: int
    device: int
    driver: str | None  # the driver the device had before: it goes back there (None: no driver)
    driver_override: str | None  # the override it had before (None: unset)
    iommu_group: int
    run: str  # the run's token
    pid: int  # the rdna1-kmgr process that bound it
    pid_start: int  # its start time in clock ticks after boot (/proc/<pid>/stat field 22)
    boot_id: str
    kmsg_seq: int | None  # sequence number of the last kernel log record before the bind
    started: str  # ISO time of the bind

    def to_json(self) -> dict:
        return asdict(self)


def directory() -> Path:
    return state_dir() / "vfio"


def path_of(bdf: str) -> Path:
    return directory() / f"{user_input.pci_address(bdf)}.json"


def write(binding: Binding) -> Path:
    """Store the record durably: file fsynced, then renamed into place, then the folder fsynced."""
    path = path_of(binding.bdf)
    make_dirs(path.parent)
    write_json(path, binding.to_json(), indent=1, sort_keys=True)
    return path


def pending() -> list[Binding]:
    """Every device a run bound and has not given back yet, by address. A record that is not one a run wrote
    (a field of the wrong shape, a driver name that is a path, a file name that is not its device's) is
    refused in one line before any device is touched: giving a device back writes its fields into sysfs."""
    folder = directory()
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            binding = Binding(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            binding = None  # a torn file cannot exist (written by rename)
        problem = "is not a device record" if binding is None else _problem(binding, path)
        if problem or binding is None:
            raise RecordRefused(
                f"refusing the vfio record {path}: it {problem}",
                "no device was touched; remove it after checking the device by hand (`lspci -k`)",
            )
        found.append(binding)
    return found


_DRIVER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a name under /sys/bus/pci/drivers, never a path
_RUN = re.compile(r"[0-9A-Za-z_-]{1,64}")  # uuid4().hex (vm/passthrough.py): a plain token, matched in environ
_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|")


def _problem(binding: Binding, path: Path) -> str | None:
    """Why a record cannot be one `write` stored for its device (None: it can)."""
    if not isinstance(binding.bdf, str) or path.name != f"{binding.bdf}.json":
        return f"names the device {binding.bdf!r}, not the one its file is named for"
    try:
        user_input.pci_address(binding.bdf)
    except UsageError:
        return f"names {binding.bdf!r}, which is no PCI address"
    for name in ("driver", "driver_override"):
        value = getattr(binding, name)
        if value is not None and not (isinstance(value, str) and _DRIVER.fullmatch(value)):
            return f"names the {name.replace('_', ' ')} {value!r}, which is no driver's name"
    for name in ("vendor", "device", "iommu_group", "pid", "pid_start"):
        value = getattr(binding, name)
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return f"has no valid {name.replace('_', ' ')}"
    if binding.kmsg_seq is not None and not (isinstance(binding.kmsg_seq, int) and binding.kmsg_seq >= 0):
        return "has no valid kernel log sequence number"
    if not (isinstance(binding.run, str) and _RUN.fullmatch(binding.run)):
        return f"names the run {binding.run!r}, which is no run token"
    if not (isinstance(binding.boot_id, str) and _BOOT_ID.fullmatch(binding.boot_id)):
        return "has no valid boot id"
    return None


def forget(bdf: str) -> None:
    path_of(bdf).unlink(missing_ok=True)
    if directory().is_dir():
        fsync_dir(directory())


def me() -> tuple[int, int, str]:
    """(pid, start time, boot id) of this process, as a Binding records its owner."""
    pid = os.getpid()
    return pid, process_start(pid) or 0, boot_id()


def owner_alive(binding: Binding) -> bool:
    """Whether the process that made the record is still running (same boot, same pid, same start time)."""
    return binding.boot_id == boot_id() and process_start(binding.pid) == binding.pid_start


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: count fields after its closing parenthesis.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])  # field 22 of the whole line: starttime
