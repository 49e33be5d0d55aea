"""What `rdna1-kmgr follow` decided for each kernel the package manager installed: patched, or stock and why.

Written by kernel_follow and the hooks, read by `status` (status.py beside it). Layout under state_dir():

    follow/<KREL>.json      the last word on that kernel: state, reason, stage, log, times
    follow/pending/<KREL>   an empty marker: a kernel hook saw KREL installed and the work has not run yet
                            (apt's DPkg::Post-Invoke hook and the boot unit look for these with a plain `ls`)

States: pending (noted by a hook, runs after dpkg or at the next boot), running, patched (built, signed,
VM-verified and installed), stock (the kernel keeps its own amdgpu; `reason` says why, `stage` where).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rdna1_kmgr.core import user_input
from rdna1_kmgr.core.files import make_dirs, write_json
from rdna1_kmgr.core.paths import state_dir

STATES = ("pending", "running", "patched", "stock")


def follow_dir() -> Path:
    return state_dir() / "follow"


def pending_dir() -> Path:
    return follow_dir() / "pending"


def _record_path(kernel: str) -> Path:
    return follow_dir() / f"{user_input.kernel_release(kernel)}.json"


def read(kernel: str) -> dict | None:
    try:
        data = json.loads(_record_path(kernel).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        return {"kernel": kernel, "state": "unreadable", "reason": str(err)}
    return data if isinstance(data, dict) else {"kernel": kernel, "state": "unreadable", "reason": "not an object"}


def kernels() -> list[str]:
    """Kernels with a record or a pending marker."""
    found = set(pending())
    found.update(release for release, _ in user_input.named_by_release(follow_dir(), ".json"))
    return sorted(found)


def write(kernel: str, state: str, **fields) -> dict:
    """Replace the kernel's record (atomically, durably). The marker stays while the work is pending or
    running (a run killed half way is done again by the next hook or boot) and goes with its outcome."""
    assert state in STATES, state
    record = {
        "kernel": user_input.kernel_release(kernel),
        "state": state,
        "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **fields,
    }
    make_dirs(follow_dir())
    write_json(_record_path(kernel), record, indent=2, sort_keys=True)
    marker = pending_dir() / record["kernel"]
    if state in ("pending", "running"):
        make_dirs(pending_dir())
        marker.touch()
    else:
        marker.unlink(missing_ok=True)
    return record


def pending() -> list[str]:
    return [release for release, _ in user_input.named_by_release(pending_dir())]


def forget(kernel: str) -> bool:
    """Drop the kernel's record and marker; whether there was anything."""
    kernel = user_input.kernel_release(kernel)
    had = False
    for path in (_record_path(kernel), pending_dir() / kernel):
        if path.exists():
            path.unlink()
            had = True
    return had


def describe(record: dict | None) -> str | None:
    """One line for status and the hook's last line."""
    if not record:
        return None
    state, kernel = record.get("state"), record.get("kernel")
    if state == "pending":
        return (
            f"pending since {record.get('updated')}: runs once the package manager is done, or at the next "
            f"boot (rdna1-kmgr-follow.service); until then {kernel} keeps the stock amdgpu"
        )
    if state == "running":
        return f"running since {record.get('updated')} (pid {record.get('pid')}), log {record.get('log')}"
    if state == "patched":
        return (
            f"patched: {record.get('package')}/{record.get('package_version')} installed, VM verdict "
            f"{record.get('verdict')} ({record.get('updated')})"
        )
    if state == "stock":
        return f"keeps the stock amdgpu: {record.get('reason')} (at {record.get('stage')}; log {record.get('log')})"
    return f"{state}: {record.get('reason')}"
