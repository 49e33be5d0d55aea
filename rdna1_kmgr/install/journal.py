"""The journal: what a run is about to change, with a backup first, so that `rollback` can undo it exactly.

Layout under state_dir() (/var/lib/rdna1-kmgr):

    lock                          an fcntl lock keeping two runs apart; holds the holder's pid, command, start
    journal/<KREL>/journal.jsonl  the active journal of one kernel: one JSON record per line, append-only
    journal/<KREL>/backups/       a copy of every file a step replaces, taken before the step
    history/<KREL>-<stamp>.jsonl  journals of installs that were rolled back (their backups are dropped)

Each record carries `sum`, the sha256 of its other fields as canonical JSON. A line that does not parse or
whose sum does not match is corruption: the journal is refused, since undoing from a wrong record could do
harm. A last line without its newline is a write the process did not finish; nothing was acted on for it
(a step starts only once its intent is on disk), so it is dropped.

Records (field `kind`: begin, intent, done, commit, program, rollback, undone, rollback-step, rolled-back,
kernel-removed, handed-over) are typed in journal_records.py, which spells their JSON; `records()` reads them
back, refusing in one line a record no release writes.

Every write (backup, record) is fsynced, and so is its directory, before the step it protects starts.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rdna1_kmgr import __version__
from rdna1_kmgr.core import tool_env, user_input
from rdna1_kmgr.core.errors import Exit, HostError, KmgrError
from rdna1_kmgr.core.files import create_new, fsync_dir, make_dirs, move_into_place, sha256_file
from rdna1_kmgr.core.paths import state_dir
from rdna1_kmgr.core.trust import untrusted
from rdna1_kmgr.install.journal_json import JsonObject, NotARecord
from rdna1_kmgr.install.journal_records import (
    Backup,
    Begin,
    Begun,
    Entry,
    HandedOver,
    Intent,
    Record,
    WasAbsent,
    WasFile,
    WasLink,
)
from rdna1_kmgr.install.journal_state import State, summarize

# Test-only: `RDNA1_KMGR_TEST_ABORT_AFTER=<step>` makes install or rollback die like `kill -9` (exit 137)
# right after that step's record is on disk, so the tests can prove recovery from a crash at every step.
# Not for users: it leaves the system half changed on purpose.
ABORT_ENV = tool_env.ABORT_AFTER


class JournalError(KmgrError):
    """The journal cannot be trusted or is in a state that forbids the command (corrupted, unfinished)."""

    exit_code = Exit.JOURNAL


class RecordRefused(JournalError):
    """A journal record replay cannot trust: one no release writes (journal_records), or not what its step
    writes (journal_checks)."""


def refused(path: Path, seq: int, kind: str, problem: str) -> RecordRefused:
    """The one line that refuses a record."""
    return RecordRefused(
        f"refusing the journal {path}: record {seq} ({kind}) {problem}",
        "nothing was stopped or undone and the journal was kept; rdna1-kmgr did not write it as it stands: "
        "check it by hand",
    )


class Busy(KmgrError):
    """Another rdna1-kmgr run holds the lock."""

    exit_code = Exit.BUSY


def abort_point(step: str) -> None:
    """Test-only crash switch (see ABORT_ENV), honoured in a test run root set up only (core/tool_env.py)."""
    if tool_env.test_switch(ABORT_ENV) == step:
        os._exit(137)


def journal_root() -> Path:
    return state_dir() / "journal"


def history_dir() -> Path:
    return state_dir() / "history"


def lock_path() -> Path:
    return state_dir() / "lock"


# --- durable writes -----------------------------------------------------------------------------------


def copy_durably(src: Path, dst: Path, like: os.stat_result | None = None) -> str:
    """Copy a file's bytes to a new `dst` (fsynced with its directory); the sha256 of what was copied. `dst` is
    created 0600, never through a link (whatever was at its name, a leftover of a crashed run or a planted link,
    is removed first); `like`: then given that file's owner and mode (a backup keeps its original's)."""
    digest = hashlib.sha256()
    dst.unlink(missing_ok=True)
    with open(src, "rb") as inp, os.fdopen(create_new(dst), "wb") as out:
        for block in iter(lambda: inp.read(1 << 20), b""):
            digest.update(block)
            out.write(block)
        out.flush()
        if like is not None:
            _own_like(out.fileno(), like.st_uid, like.st_gid, like.st_mode & 0o7777)
        os.fsync(out.fileno())
    fsync_dir(dst.parent)
    return digest.hexdigest()


def _own_like(fd: int, uid: int, gid: int, mode: int) -> None:
    """Give an open file an owner and mode (owner first: chown clears set-id bits). Only root may give a file
    away; anyone else keeps its own (the tests' runs as a user)."""
    if os.geteuid() == 0:
        os.fchown(fd, uid, gid)
    os.fchmod(fd, mode)


def check_writable() -> None:
    """Refuse early, before any change, when the state directory cannot hold a journal."""
    root = state_dir()
    probe = root
    while not probe.exists():
        probe = probe.parent
    problem = None
    if not probe.is_dir():
        problem = f"{probe} is not a directory"
    elif not os.access(probe, os.W_OK | os.X_OK):
        problem = f"{probe} is not writable"
    if problem:
        raise HostError(
            f"cannot keep the journal under {root}: {problem}",
            "run as root, or point RDNA1_KMGR_STATE at a writable directory",
        )


def _state_error(err: OSError) -> HostError:
    return HostError(
        f"cannot keep the journal under {state_dir()}: {err.strerror or err}",
        "run as root, or point RDNA1_KMGR_STATE at a writable directory",
    )


# --- the lock -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Holder:
    pid: int | None
    command: str
    since: str

    def describe(self) -> str:
        pid = f"pid {self.pid}" if self.pid else "a process that has not said who it is yet"
        return f"{pid} (`rdna1-kmgr {self.command}`, since {self.since})" if self.command else pid


def lock_holder() -> Holder | None:
    """Who holds the lock now (None when nobody does)."""
    path = lock_path()
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    with os.fdopen(fd) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(path)
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None


def _read_holder(path: Path) -> Holder:
    try:
        data = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        data = {}
    return Holder(data.get("pid"), data.get("command", ""), data.get("since", "?"))


def refuse_if_busy() -> None:
    """Say at once that another run is at work, before judging its half-written journal as unfinished."""
    holder = lock_holder()
    if holder is not None:
        raise Busy(
            f"another rdna1-kmgr run holds {lock_path()}: {holder.describe()}",
            "wait for it to finish; nothing was changed",
        )


@contextmanager
def locked(command: str) -> Iterator[None]:
    """Hold the run lock for the block. A second run is refused at once, naming the holder."""
    try:
        make_dirs(state_dir())
        fd = os.open(lock_path(), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise _state_error(err) from None
    handle = os.fdopen(fd, "r+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            refuse_if_busy()
            raise Busy(
                f"another rdna1-kmgr run holds {lock_path()}", "wait for it to finish; nothing was changed"
            ) from None
        # The kernel drops the lock when the process dies, however it dies: no stale lock to clean up.
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "command": command, "since": _now()}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
        yield
    finally:
        handle.close()


# --- records --------------------------------------------------------------------------------------------


class RecordedUndo(Protocol):
    """An intent's undo (install/undo.py's kinds, which reach modprobe_conf, which imports this module)."""

    def to_json(self) -> dict[str, Any]: ...


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _canonical(fields: JsonObject) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def _sum(fields: JsonObject) -> str:
    return hashlib.sha256(_canonical(fields)).hexdigest()


class Journal:
    """The active journal of one kernel release."""

    def __init__(self, kernel: str):
        self.kernel = user_input.kernel_release(kernel)
        self.dir = journal_root() / self.kernel
        self.path = self.dir / "journal.jsonl"
        self.backups = self.dir / "backups"

    @staticmethod
    def kernels() -> list[str]:
        """Kernel releases with an active journal."""
        return [
            release
            for release, entry in user_input.named_by_release(journal_root())
            if (entry / "journal.jsonl").is_file()
        ]

    def exists(self) -> bool:
        return self.path.is_file()

    def records(self) -> list[Entry]:
        """Every record, checked and typed; JournalError on the first corrupted one, RecordRefused on the first
        no release writes."""
        entries = []
        for fields in self._lines()[0]:
            try:
                entries.append(Entry.from_json(fields))
            except NotARecord as err:
                raise refused(self.path, fields["seq"], str(fields["kind"]), str(err)) from None
        return entries

    def _lines(self) -> tuple[list[dict[str, Any]], int]:
        """Each line's fields (its sum checked and dropped) and the length of the file's whole lines (a torn last
        write is not one of them)."""
        try:
            with os.fdopen(os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as handle:
                raw = handle.read()  # never through a link planted at its name
        except (FileNotFoundError, NotADirectoryError):
            return [], 0  # no journal (NotADirectoryError: the state path runs through a file; writing says so)
        except OSError as err:
            raise JournalError(
                f"cannot read the journal {self.path}: {err.strerror}", "check the state directory"
            ) from None
        lines = raw.split(b"\n")
        torn = lines.pop()  # b"" when the file ends with a newline; else a write cut short by a crash
        records: list[dict[str, Any]] = []
        for number, line in enumerate(lines, 1):
            record = self._check(line, number)
            if record["seq"] != len(records) + 1:
                self._corrupt(number, f"record {record['seq']} where {len(records) + 1} was expected")
            records.append(record)
        return records, len(raw) - len(torn)

    def _check(self, line: bytes, number: int) -> dict[str, Any]:
        try:
            record = json.loads(line)
        except ValueError:
            self._corrupt(number, "not a JSON record")
        if not isinstance(record, dict) or not isinstance(record.get("seq"), int) or "kind" not in record:
            self._corrupt(number, "not a journal record")
        fields = {k: v for k, v in record.items() if k != "sum"}
        if record.get("sum") != _sum(fields):
            self._corrupt(number, "its checksum does not match")
        return fields

    def _corrupt(self, number: int, why: str):
        raise JournalError(
            f"the journal {self.path} is corrupted at line {number} ({why}); refusing to act on it",
            f"nothing was changed; restore it from a backup, or check {self.kernel} by hand with "
            f"`rdna1-kmgr status` and move the journal aside",
        )

    def state(self) -> State:
        return summarize(self.records())

    def append(self, record: Record) -> Entry:
        """Write one record and make it durable before returning. The lines before it are checked (sums, order),
        not read as records: the commands read them (`records`) before they act."""
        lines, whole = self._lines()
        entry = Entry(len(lines) + 1, _now(), record)
        fields = entry.to_json()
        try:
            creating = not self.path.exists()
            if creating:
                make_dirs(self.dir)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "ab") as out:
                if os.fstat(fd).st_size != whole:
                    os.ftruncate(fd, whole)  # drop a torn last write before appending after it
                out.write(_canonical({**fields, "sum": _sum(fields)}) + b"\n")
                out.flush()
                os.fsync(out.fileno())
            if creating:
                fsync_dir(self.dir)
        except OSError as err:
            raise _state_error(err) from None
        return entry

    def begin(self, begun: Begun) -> Entry:
        return self.append(Begin(begun, pid=os.getpid(), tool_version=__version__))

    def record_intent(
        self,
        step: str,
        command: list[str] | None,
        replaces: list[Path],
        dirs: list[Path],
        undo: RecordedUndo | None = None,
    ) -> Intent:
        """Back up every file the step will replace, then write its intent (all durable)."""
        seq = len(self._lines()[0]) + 1
        intent = Intent(
            step,
            tuple(command) if command is not None else None,
            tuple(self._backup(path, f"{seq:03d}-{index}") for index, path in enumerate(replaces)),
            tuple(str(d) for d in dirs if not d.exists()),
            undo.to_json() if undo is not None else None,
        )
        self.append(intent)
        return intent

    def _backup(self, path: Path, name: str) -> Backup:
        refuse_untrusted_folder(path)
        if path.is_symlink():
            return WasLink(str(path), os.readlink(path))
        if not path.exists():
            return WasAbsent(str(path))  # absent before: undoing means removing whatever the step made there
        if not path.is_file():
            raise HostError(f"{path} is not a regular file", "rdna1-kmgr only replaces files; move it aside")
        try:
            make_dirs(self.backups)
            stat = path.stat()
            digest = copy_durably(path, self.backups / name, like=stat)
        except OSError as err:
            raise _state_error(err) from None
        return WasFile(str(path), name, digest, stat.st_mode & 0o7777, stat.st_uid, stat.st_gid)

    def hand_over(self, of: int, entry: Backup, backups: Path) -> Entry:
        """Take `entry`, another journal's backup of a file that step `of` backed up too, as the step's own: that
        journal goes with its kernel (shared_files.py), and undoing the step must then put back what the other
        install found, not what it wrote. The backup is copied into this journal's folder first."""
        taken = entry
        if isinstance(entry, WasFile):
            source = backups / entry.backup
            taken = dataclasses.replace(entry, backup=f"{len(self._lines()[0]) + 1:03d}-0")
            try:
                make_dirs(self.backups)
                digest = copy_durably(source, self.backups / taken.backup)
            except OSError as err:
                raise _state_error(err) from None
            if digest != entry.sha256:
                raise JournalError(
                    f"the backup of {entry.path} ({source}) is damaged",
                    f"nothing was handed over; {entry.path} is left as it is: restore it by hand",
                )
        return self.append(HandedOver(of, taken))

    def restore(self, entry: Backup) -> str:
        """Put one backed-up path back as it was (idempotent); says what it did."""
        path = Path(entry.path)
        refuse_untrusted_folder(path)
        if isinstance(entry, WasLink):
            if path.is_symlink() and os.readlink(path) == entry.target:
                return f"kept the link {path}"
            _remove(path)
            path.symlink_to(entry.target)
            fsync_dir(path.parent)
            return f"restored the link {path}"
        if isinstance(entry, WasAbsent):
            if path.exists() or path.is_symlink():
                _remove(path)
                fsync_dir(path.parent)
                return f"removed {path}"
            return f"{path} already absent"
        backup = self.backups / entry.backup
        if not backup.is_file() or sha256_file(backup) != entry.sha256:
            raise JournalError(
                f"the backup of {path} ({backup}) is missing or damaged",
                f"{path} was left as it is; restore it by hand",
            )
        if path.is_file() and not path.is_symlink() and sha256_file(path) == entry.sha256:
            _set_owner_mode(path, entry)
            return f"{path} already as before"
        make_dirs(path.parent)
        tmp = path.with_name(f".{path.name}.rdna1-kmgr-restore")
        copy_durably(backup, tmp)
        _set_owner_mode(tmp, entry)
        move_into_place(tmp, path)
        return f"restored {path}"

    def archive(self) -> Path:
        """Move the finished journal to history/ and drop its backups."""
        make_dirs(history_dir())
        target = history_dir() / f"{self.kernel}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.jsonl"
        move_into_place(self.path, target)
        shutil.rmtree(self.dir, ignore_errors=True)
        fsync_dir(journal_root())
        return target


def refuse_untrusted_folder(path: Path) -> None:
    """Refuse, in one line, a path the journal writes or restores whose folder someone other than root could change
    or swap: a folder or a link on the way that is not root's, or a folder others may write (core/trust.py). A link
    root made in a folder of root's (/lib on a merged-/usr system) is followed; one a user planted, never
    (issue 49: a folder link swapped between `profile install` and `profile remove`)."""
    problem = untrusted(path.parent, frozenset({0, os.geteuid()}), links=True, missing_ok=True, folder=True)
    if problem:
        raise HostError(
            f"refusing to write {path}: {problem}",
            "nothing was changed there; make every folder on the way root's and not writable by others",
        )


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        raise JournalError(f"{path} is a directory where a file was", "move it aside, then run rollback again")
    path.unlink(missing_ok=True)


def _set_owner_mode(path: Path, entry: WasFile) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _own_like(fd, entry.uid, entry.gid, entry.mode)
    finally:
        os.close(fd)


def deepest_first(dirs: Iterable[str]) -> list[str]:
    """The order created folders are removed in (and a rollback's plan lists them): a folder before its parent."""
    return sorted(dirs, key=lambda d: d.count("/"), reverse=True)


def remove_created_dirs(dirs: Iterable[str]) -> list[str]:
    """Remove the directories a step created, deepest first, when they are empty again."""
    removed = []
    for folder in deepest_first(dirs):
        try:
            os.rmdir(folder)
        except FileNotFoundError:
            continue
        except OSError as err:
            if err.errno in (errno.ENOTEMPTY, errno.EEXIST):
                continue  # someone put something there since: leave it
            raise
        fsync_dir(Path(folder).parent)
        removed.append(folder)
    return removed
