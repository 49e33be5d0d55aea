"""Every record a journal holds, typed: one frozen dataclass per kind, its JSON spelled here only.

Each kind's `to_json` writes it (journal.Journal.append, the one writer of a journal's lines); `from_json` reads
it back and takes only what `to_json` writes, to the field: a record no release writes is refused when the
journal is read (NotARecord, worded to follow "record N (kind) "), before anything acts on it. Whether a
record's values are the ones its step writes is journal_checks.py's.

Two shapes live beside their writers and are reused here: the install's begin (install_begin.InstallBegin)
and an intent's undo (install/undo.py, kept here as the JSON it writes: undo.py reaches modprobe_conf, which
reads journals, so it cannot be imported here; rollback and journal_checks read it with undo.from_json).

    begin          operation, pid, tool_version, and what was begun: an install (install_begin.py), a profile,
                   a kernel parameter, the experiment's kernel-cell boots
    intent         step, command, backups (what each path was before: absent, a link, a file copied), dirs
                   (folders absent before that the step may create), undo
    done           step
    commit         the install finished and was verified (verified: install's; a profile's or a parameter's
                   commit has none)
    program        session, start_time, boot_id, argv: a program the run started (journal_programs.py)
    rollback       a rollback started (reason, keep_build)
    undone         step, of (the intent's seq): reversed; a rollback run again skips it
    rollback-step  remove-package or depmod, done by rollback after the steps
    rolled-back    everything reversed; the journal then moves to history/
    kernel-removed the kernel's package went (follow removed); the journal then moves to history/
    handed-over    of (an intent's seq), entry: another journal's backup of a file that step backed up too,
                   taken as the step's own when that journal went with its kernel (install/shared_files.py)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from rdna1_kmgr.install.install_begin import InstallBegin
from rdna1_kmgr.install.journal_json import (
    Json,
    JsonObject,
    NotARecord,
    command,
    fields,
    flag,
    obj,
    or_none,
    text,
    texts,
    whole,
)

_SHA256 = re.compile(r"[0-9a-f]{64}")
_OWNER_TOP = 2**32 - 2  # the largest uid or gid: -1 (2**32 - 1) means "leave it" to chown


# --- what a path was before a step: an intent's backups ------------------------------------------------------


@dataclass(frozen=True)
class WasAbsent:
    """Nothing was there: undoing the step removes whatever it made."""

    path: str

    def to_json(self) -> JsonObject:
        return {"path": self.path, "backup": None}


@dataclass(frozen=True)
class WasLink:
    """A symbolic link was there, to `target`."""

    path: str
    target: str

    def to_json(self) -> JsonObject:
        return {"path": self.path, "backup": None, "symlink": self.target}


@dataclass(frozen=True)
class WasFile:
    """A file was there: copied to `backup` in the journal's backups folder, with its sha256, mode and owner."""

    path: str
    backup: str
    sha256: str
    mode: int
    uid: int
    gid: int

    def to_json(self) -> JsonObject:
        return {
            "path": self.path,
            "backup": self.backup,
            "sha256": self.sha256,
            "mode": self.mode,
            "uid": self.uid,
            "gid": self.gid,
        }


Backup = WasAbsent | WasLink | WasFile


def backup_from_json(value: Json) -> Backup:
    entry = obj(value, "backup")
    path = text(entry.get("path"), "path")
    if entry.get("backup") is None and "symlink" in entry:
        link = fields(entry, ("path", "backup", "symlink"))["symlink"]
        if not isinstance(link, str) or "\0" in link:
            raise NotARecord(f"has a bad link for {path}")
        return WasLink(path, link)
    if entry.get("backup") is None:
        fields(entry, ("path", "backup"))
        return WasAbsent(path)
    fields(entry, ("path", "backup", "sha256", "mode", "uid", "gid"))
    sha256 = entry["sha256"]
    if not (isinstance(sha256, str) and _SHA256.fullmatch(sha256)):
        raise NotARecord(f"has no sha256 for the backup of {path}")
    mode, uid, gid = (_whole_up_to(entry[key], top, f"{key} for {path}") for key, top in _OWNER_FIELDS)
    return WasFile(path, text(entry["backup"], "backup name"), sha256, mode, uid, gid)


_OWNER_FIELDS = (("mode", 0o7777), ("uid", _OWNER_TOP), ("gid", _OWNER_TOP))


def _whole_up_to(value: Json, top: int, what: str) -> int:
    if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= top):
        raise NotARecord(f"has no valid {what}")
    return value


# --- begin: what was begun, beside install_begin.InstallBegin ------------------------------------------------


@dataclass(frozen=True)
class ProfileBegin:
    """`profile install` (install/user_profile.py): the profile, and the root its files went under."""

    OPERATION: ClassVar[str] = "profile-install"

    profile: str
    root: str

    def to_json(self) -> JsonObject:
        return {"profile": self.profile, "root": self.root}

    @classmethod
    def from_json(cls, value: Json) -> ProfileBegin:
        record = fields(value, ("profile", "root"))
        return cls(text(record["profile"], "profile"), text(record["root"], "root"))


@dataclass(frozen=True)
class ParameterBegin:
    """`experiment apply --kernel` (install/kernel_parameters.py): the parameter added to every boot."""

    OPERATION: ClassVar[str] = "kernel-parameter"

    parameter: str

    def to_json(self) -> JsonObject:
        return {"parameter": self.parameter}

    @classmethod
    def from_json(cls, value: Json) -> ParameterBegin:
        return cls(text(fields(value, ("parameter",))["parameter"], "parameter"))


@dataclass(frozen=True)
class ExperimentBegin:
    """The experiment's kernel-cell boots (experiment/kernel_run.py): its folder and its cells."""

    OPERATION: ClassVar[str] = "experiment-kernel"

    folder: str
    cells: tuple[str, ...]

    def to_json(self) -> JsonObject:
        return {"folder": self.folder, "cells": list(self.cells)}

    @classmethod
    def from_json(cls, value: Json) -> ExperimentBegin:
        record = fields(value, ("folder", "cells"))
        return cls(text(record["folder"], "folder"), texts(record["cells"], "cells"))


Begun = InstallBegin | ProfileBegin | ParameterBegin | ExperimentBegin
_BEGUN: dict[str, type[Begun]] = {
    kind.OPERATION: kind for kind in (InstallBegin, ProfileBegin, ParameterBegin, ExperimentBegin)
}


@dataclass(frozen=True)
class Begin:
    """A journal's first record: what was begun, by which process of which release."""

    KIND: ClassVar[str] = "begin"

    begun: Begun
    pid: int
    tool_version: str

    @property
    def operation(self) -> str:
        return self.begun.OPERATION

    def to_json(self) -> JsonObject:
        return {"operation": self.operation, "pid": self.pid, "tool_version": self.tool_version, **self.begun.to_json()}

    @classmethod
    def from_json(cls, value: Json) -> Begin:
        record = obj(value, "begin")
        missing = sorted({"operation", "pid", "tool_version"} - set(record))
        if missing:
            raise NotARecord(f"has no {', '.join(missing)}")
        operation = text(record["operation"], "operation")
        kind = _BEGUN.get(operation)
        if kind is None:
            raise NotARecord(f"begins {operation!r}, which rdna1-kmgr never begins")
        rest = {k: v for k, v in record.items() if k not in ("operation", "pid", "tool_version")}
        return cls(kind.from_json(rest), whole(record["pid"], "pid"), text(record["tool_version"], "tool version"))


# --- the records of a run ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Intent:
    """A step about to run: its command (None: none of its own), what each path it replaces was (backed up
    first), the folders it may create (absent before), and its undo beyond the files (install/undo.py's JSON)."""

    KIND: ClassVar[str] = "intent"

    step: str
    command: tuple[str, ...] | None
    backups: tuple[Backup, ...]
    dirs: tuple[str, ...]
    undo: JsonObject | None = None

    def to_json(self) -> JsonObject:
        return {
            "step": self.step,
            "command": list(self.command) if self.command is not None else None,
            "backups": [backup.to_json() for backup in self.backups],
            "dirs": list(self.dirs),
            "undo": self.undo,
        }

    @classmethod
    def from_json(cls, value: Json) -> Intent:
        record = fields(value, ("step", "command", "backups", "dirs", "undo"))
        backups = record["backups"]
        if not isinstance(backups, list):
            raise NotARecord("has no list of backups")
        return cls(
            text(record["step"], "step"),
            or_none(record["command"], command, "command"),
            tuple(backup_from_json(entry) for entry in backups),
            texts(record["dirs"], "folders"),
            or_none(record["undo"], obj, "undo"),
        )


@dataclass(frozen=True)
class Done:
    KIND: ClassVar[str] = "done"

    step: str

    def to_json(self) -> JsonObject:
        return {"step": self.step}

    @classmethod
    def from_json(cls, value: Json) -> Done:
        return cls(text(fields(value, ("step",))["step"], "step"))


@dataclass(frozen=True)
class Commit:
    """The run finished; an install's says how it was verified (install_result's JSON, kept as written)."""

    KIND: ClassVar[str] = "commit"

    verified: JsonObject | None = None  # None: a profile's or a parameter's commit (written without)

    def to_json(self) -> JsonObject:
        return {} if self.verified is None else {"verified": self.verified}

    @classmethod
    def from_json(cls, value: Json) -> Commit:
        record = fields(value, (), ("verified",))
        return cls(obj(record["verified"], "verification") if "verified" in record else None)


@dataclass(frozen=True)
class Program:
    """A program the run started (journal_programs.py): its session, start time and boot, its command line."""

    KIND: ClassVar[str] = "program"

    session: int
    start_time: int
    boot_id: str
    argv: tuple[str, ...]

    def to_json(self) -> JsonObject:
        return {
            "session": self.session,
            "start_time": self.start_time,
            "boot_id": self.boot_id,
            "argv": list(self.argv),
        }

    @classmethod
    def from_json(cls, value: Json) -> Program:
        record = fields(value, ("session", "start_time", "boot_id", "argv"))
        argv, session = record["argv"], record["session"]
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) and "\0" not in a for a in argv)):
            raise NotARecord("has no command line")
        if not isinstance(session, int) or isinstance(session, bool):
            raise NotARecord(f"names the session {session!r}, which is no program's")
        start, boot = record["start_time"], record["boot_id"]
        if not isinstance(start, int) or isinstance(start, bool):
            raise NotARecord(f"has no start time for session {session}")
        if not isinstance(boot, str):
            raise NotARecord(f"has no boot id for session {session}")
        return cls(session, start, boot, tuple(texts(argv, "command line")))


@dataclass(frozen=True)
class Rollback:
    KIND: ClassVar[str] = "rollback"

    reason: str
    keep_build: bool

    def to_json(self) -> JsonObject:
        return {"reason": self.reason, "keep_build": self.keep_build}

    @classmethod
    def from_json(cls, value: Json) -> Rollback:
        record = fields(value, ("reason", "keep_build"))
        return cls(text(record["reason"], "reason"), flag(record["keep_build"], "keep_build"))


@dataclass(frozen=True)
class Undone:
    """The intent `of` (its seq), step `step`, reversed."""

    KIND: ClassVar[str] = "undone"

    step: str
    of: int

    def to_json(self) -> JsonObject:
        return {"step": self.step, "of": self.of}

    @classmethod
    def from_json(cls, value: Json) -> Undone:
        record = fields(value, ("step", "of"))
        if not isinstance(record["of"], int) or isinstance(record["of"], bool):
            raise NotARecord("does not name the record it undid")
        return cls(text(record["step"], "step"), record["of"])


@dataclass(frozen=True)
class RollbackStep:
    """A part of a rollback after the steps (rollback.py: remove-package, depmod)."""

    KIND: ClassVar[str] = "rollback-step"

    step: str

    def to_json(self) -> JsonObject:
        return {"step": self.step}

    @classmethod
    def from_json(cls, value: Json) -> RollbackStep:
        return cls(text(fields(value, ("step",))["step"], "step"))


@dataclass(frozen=True)
class RolledBack:
    KIND: ClassVar[str] = "rolled-back"

    def to_json(self) -> JsonObject:
        return {}

    @classmethod
    def from_json(cls, value: Json) -> RolledBack:
        fields(value, ())
        return cls()


@dataclass(frozen=True)
class KernelRemoved:
    KIND: ClassVar[str] = "kernel-removed"

    def to_json(self) -> JsonObject:
        return {}

    @classmethod
    def from_json(cls, value: Json) -> KernelRemoved:
        fields(value, ())
        return cls()


@dataclass(frozen=True)
class HandedOver:
    """Another journal's backup (`entry`) taken as the own of the intent `of` (its seq)."""

    KIND: ClassVar[str] = "handed-over"

    of: int
    entry: Backup

    def to_json(self) -> JsonObject:
        return {"of": self.of, "entry": self.entry.to_json()}

    @classmethod
    def from_json(cls, value: Json) -> HandedOver:
        record = fields(value, ("of", "entry"))
        return cls(whole(record["of"], "step it hands over to"), backup_from_json(record["entry"]))


Record = (
    Begin
    | Intent
    | Done
    | Commit
    | Program
    | Rollback
    | Undone
    | RollbackStep
    | RolledBack
    | KernelRemoved
    | HandedOver
)
_KINDS: dict[str, type[Record]] = {
    kind.KIND: kind
    for kind in (
        Begin,
        Intent,
        Done,
        Commit,
        Program,
        Rollback,
        Undone,
        RollbackStep,
        RolledBack,
        KernelRemoved,
        HandedOver,
    )
}


@dataclass(frozen=True)
class Entry:
    """One line of a journal: its place (seq, from 1), when it was written, and its record."""

    seq: int
    time: str
    record: Record

    @property
    def kind(self) -> str:
        return self.record.KIND

    def to_json(self) -> JsonObject:
        """The line's fields but its `sum` (the journal's)."""
        return {"seq": self.seq, "kind": self.kind, "time": self.time, **self.record.to_json()}

    @classmethod
    def from_json(cls, value: JsonObject) -> Entry:
        """A line's fields (its sum checked and dropped); NotARecord for one no release writes."""
        kind = _KINDS.get(text(value.get("kind"), "kind"))
        if kind is None:
            raise NotARecord("is of a kind rdna1-kmgr never writes")
        rest = {k: v for k, v in value.items() if k not in ("seq", "kind", "time")}
        entry = cls(whole(value.get("seq"), "seq"), text(value.get("time"), "time"), kind.from_json(rest))
        if entry.to_json() != value:  # what survives the round trip is exactly what was written
            raise NotARecord("is not written the way rdna1-kmgr writes it")
        return entry
