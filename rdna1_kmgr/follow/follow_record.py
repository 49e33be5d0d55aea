"""What `rdna1-kmgr follow` decided for each kernel the package manager installed: patched, or stock and why.

Written by kernel_follow and the hooks, read by `status` (status.py beside it). Layout under state_dir():

    follow/<KREL>.json      the last word on that kernel: state, reason, stage, log, times
    follow/pending/<KREL>   an empty marker: a kernel hook saw KREL installed and the work has not run yet
                            (apt's DPkg::Post-Invoke hook and the boot unit look for these with a plain `ls`)

States: pending (noted by a hook, runs after dpkg or at the next boot), running, patched (built, signed,
VM-verified and installed), stock (the kernel keeps its own amdgpu; `reason` says why, `stage` where).

A record is a FollowRecord; its file has the keys the release before it wrote (only those set), and a file of
another release is read for the keys it shares with this one.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rdna1_kmgr.core import user_input
from rdna1_kmgr.core.files import make_dirs, write_json
from rdna1_kmgr.core.paths import state_dir

STATES = ("pending", "running", "patched", "stock")
UNREADABLE = "unreadable"  # read's word for a file it cannot use (the reason says why); never written
# The keys a patched record always has, null when unknown (a kernel installed already by hand, its verdict skipped).
PATCHED_KEYS = ("package", "package_version", "module_sha256", "verdict")


@dataclass(frozen=True)
class FollowRecord:
    """follow/<KREL>.json: the file's keys are these fields, each optional one only when it is set."""

    kernel: str
    state: str  # one of STATES (or UNREADABLE, from read)
    updated: str | None = None  # when write wrote it; None for one not written yet or a stand-in (status)
    reason: str | None = None  # stock: why; unreadable: what is wrong with the file; patched: "installed already"
    stage: str | None = None  # stock: the stage that failed, as follow names its stages
    log: str | None = None  # running, stock, patched: the whole story
    pid: int | None = None  # running: the follow process
    package: str | None = None  # patched: the DKMS package, its version, the module's sha256 and its VM verdict
    package_version: str | None = None
    module_sha256: str | None = None
    verdict: str | None = None
    verdict_record: str | None = None  # patched by follow: the verdict's file
    quirks: tuple[str, ...] | None = None  # patched by follow: the quirks it was built with

    def __post_init__(self) -> None:
        assert self.state in STATES or self.state == UNREADABLE, self.state

    def to_json(self) -> dict[str, Any]:
        always = PATCHED_KEYS if self.state == "patched" else ()
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None or f.name in always:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_json(cls, data: object) -> FollowRecord:
        """A record file's object; keys it does not know are left alone (a later release's). ValueError: the
        object is not a record."""
        if not isinstance(data, dict):
            raise ValueError("not an object")
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            value = data.get(f.name)
            if f.name == "quirks" and isinstance(value, list) and all(isinstance(q, str) for q in value):
                value = tuple(value)
            wanted, said = _FIELD_TYPES.get(f.name, (str, "a string"))
            if value is None and f.name in ("kernel", "state"):
                raise ValueError(f"it has no {f.name!r}")
            if value is not None and (not isinstance(value, wanted) or isinstance(value, bool)):
                raise ValueError(f"its {f.name!r} is not {said}: {value!r}")
            values[f.name] = value
        if values["state"] not in STATES:
            raise ValueError(f"its state {values['state']!r} is none of {', '.join(STATES)}")
        return cls(**values)


# The fields that are no string: their type once read (a JSON list of names becomes a tuple) and its words.
_FIELD_TYPES: dict[str, tuple[type, str]] = {"pid": (int, "a whole number"), "quirks": (tuple, "a list of names")}


def follow_dir() -> Path:
    return state_dir() / "follow"


def pending_dir() -> Path:
    return follow_dir() / "pending"


def _record_path(kernel: str) -> Path:
    return follow_dir() / f"{user_input.kernel_release(kernel)}.json"


def read(kernel: str) -> FollowRecord | None:
    """The kernel's record; None when it has none; state UNREADABLE, with the reason, when its file is no record."""
    try:
        return FollowRecord.from_json(json.loads(_record_path(kernel).read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:  # json's errors are ValueErrors too
        return FollowRecord(kernel, UNREADABLE, None, reason=str(err))


def kernels() -> list[str]:
    """Kernels with a record or a pending marker."""
    found = set(pending())
    found.update(release for release, _ in user_input.named_by_release(follow_dir(), ".json"))
    return sorted(found)


def write(record: FollowRecord) -> FollowRecord:
    """Replace the kernel's record (atomically, durably) with `record`, stamped now; returns what was written.
    The marker stays while the work is pending or running (a run killed half way is done again by the next hook
    or boot) and goes with its outcome."""
    assert record.state in STATES, record.state
    record = dataclasses.replace(
        record, kernel=user_input.kernel_release(record.kernel), updated=time.strftime("%Y-%m-%dT%H:%M:%S%z")
    )
    make_dirs(follow_dir())
    write_json(_record_path(record.kernel), record.to_json(), indent=2, sort_keys=True)
    marker = pending_dir() / record.kernel
    if record.state in ("pending", "running"):
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


def describe(record: FollowRecord | None) -> str | None:
    """One line for status and the hook's last line."""
    if record is None:
        return None
    if record.state == "pending":
        return (
            f"pending since {record.updated}: runs once the package manager is done, or at the next "
            f"boot (rdna1-kmgr-follow.service); until then {record.kernel} keeps the stock amdgpu"
        )
    if record.state == "running":
        return f"running since {record.updated} (pid {record.pid}), log {record.log}"
    if record.state == "patched":
        return (
            f"patched: {record.package}/{record.package_version} installed, VM verdict "
            f"{record.verdict} ({record.updated})"
        )
    if record.state == "stock":
        return f"keeps the stock amdgpu: {record.reason} (at {record.stage}; log {record.log})"
    return f"{record.state}: {record.reason}"
