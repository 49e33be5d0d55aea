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

Records (field `kind`):
    begin       operation, kernel, package, version, module_sha256, vm_check, parameters, ...
    intent      step, command, backups [{path, backup (null: absent before), sha256, mode, ...}],
                dirs (directories absent before that the step may create), undo (what is not a file)
    done        step
    commit      the install finished and was verified
    program     session, start_time, boot_id, argv: a program the run started (install/journal_programs.py)
    rollback    a rollback started (reason)
    undone      step, of (the intent's seq): reversed; a rollback run again skips it
    handed-over of (an intent's seq), entry: another journal's backup of a file that step backed up too, taken
                as the step's own when that journal went with its kernel (install/shared_files.py)
    rolled-back everything reversed; the journal then moves to history/

Every write (backup, record) is fsynced, and so is its directory, before the step it protects starts.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rdna1_kmgr import __version__
from rdna1_kmgr.core import tool_env, user_input
from rdna1_kmgr.core.errors import Exit, HostError, KmgrError
from rdna1_kmgr.core.files import create_new, fsync_dir, make_dirs, move_into_place, sha256_file
from rdna1_kmgr.core.paths import state_dir
from rdna1_kmgr.core.trust import untrusted

# Test-only: `RDNA1_KMGR_TEST_ABORT_AFTER=<step>` makes install or rollback die like `kill -9` (exit 137)
# right after that step's record is on disk, so the tests can prove recovery from a crash at every step.
# Not for users: it leaves the system half changed on purpose.
ABORT_ENV = tool_env.ABORT_AFTER


class JournalError(KmgrError):
    """The journal cannot be trusted or is in a state that forbids the command (corrupted, unfinished)."""

    exit_code = Exit.JOURNAL


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


def _canonical(fields: dict) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def _sum(fields: dict) -> str:
    return hashlib.sha256(_canonical(fields)).hexdigest()


@dataclass
class StepState:
    seq: int
    step: str
    intent: dict
    done: bool = False
    undone: bool = False


@dataclass
class State:
    """What a journal says happened."""

    begin: dict | None
    steps: list[StepState] = field(default_factory=list)
    committed: bool = False
    rollback_started: bool = False
    rolled_back: bool = False

    @property
    def description(self) -> str:
        if self.rolled_back:
            return "rolled back"
        if self.rollback_started:
            return "rollback unfinished"
        if self.committed:
            return "installed"
        return "install unfinished"


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

    def records(self) -> list[dict]:
        """Every record, checked; JournalError on the first corrupted one."""
        return self._read()[0]

    def _read(self) -> tuple[list[dict], int]:
        """The records and the length of the file's whole lines (a torn last write is not one of them)."""
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
        records: list[dict] = []
        for number, line in enumerate(lines, 1):
            record = self._check(line, number)
            if record["seq"] != len(records) + 1:
                self._corrupt(number, f"record {record['seq']} where {len(records) + 1} was expected")
            records.append(record)
        return records, len(raw) - len(torn)

    def _check(self, line: bytes, number: int) -> dict:
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

    def append(self, kind: str, **fields) -> dict:
        """Write one record and make it durable before returning."""
        records, whole = self._read()
        record = {"seq": len(records) + 1, "kind": kind, "time": _now(), **fields}
        line = dict(record, sum=_sum(record))
        try:
            creating = not self.path.exists()
            if creating:
                make_dirs(self.dir)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "ab") as out:
                if os.fstat(fd).st_size != whole:
                    os.ftruncate(fd, whole)  # drop a torn last write before appending after it
                out.write(_canonical(line) + b"\n")
                out.flush()
                os.fsync(out.fileno())
            if creating:
                fsync_dir(self.dir)
        except OSError as err:
            raise _state_error(err) from None
        return record

    def begin(self, operation: str, **fields) -> dict:
        return self.append("begin", operation=operation, pid=os.getpid(), tool_version=__version__, **fields)

    def record_intent(
        self,
        step: str,
        command: list[str] | None,
        replaces: list[Path],
        dirs: list[Path],
        undo: RecordedUndo | None = None,
        **extra,
    ) -> dict:
        """Back up every file the step will replace, then write its intent (all durable)."""
        seq = len(self.records()) + 1
        backups = [self._backup(path, f"{seq:03d}-{index}") for index, path in enumerate(replaces)]
        return self.append(
            "intent",
            step=step,
            command=command,
            backups=backups,
            dirs=[str(d) for d in dirs if not d.exists()],
            undo=undo.to_json() if undo is not None else None,
            **extra,
        )

    def _backup(self, path: Path, name: str) -> dict:
        refuse_untrusted_folder(path)
        entry = {"path": str(path), "backup": None}
        if path.is_symlink():
            return {**entry, "symlink": os.readlink(path)}
        if not path.exists():
            return entry  # absent before: undoing means removing whatever the step made there
        if not path.is_file():
            raise HostError(f"{path} is not a regular file", "rdna1-kmgr only replaces files; move it aside")
        try:
            make_dirs(self.backups)
            stat = path.stat()
            digest = copy_durably(path, self.backups / name, like=stat)
        except OSError as err:
            raise _state_error(err) from None
        return {
            **entry,
            "backup": name,
            "sha256": digest,
            "mode": stat.st_mode & 0o7777,
            "uid": stat.st_uid,
            "gid": stat.st_gid,
        }

    def hand_over(self, of: int, entry: dict, backups: Path) -> dict:
        """Take `entry`, another journal's backup of a file that step `of` backed up too, as the step's own: that
        journal goes with its kernel (shared_files.py), and undoing the step must then put back what the other
        install found, not what it wrote. The backup is copied into this journal's folder first."""
        seq = len(self.records()) + 1
        taken = dict(entry)
        if entry["backup"] is not None:
            source, taken["backup"] = backups / entry["backup"], f"{seq:03d}-0"
            try:
                make_dirs(self.backups)
                digest = copy_durably(source, self.backups / taken["backup"])
            except OSError as err:
                raise _state_error(err) from None
            if digest != entry["sha256"]:
                raise JournalError(
                    f"the backup of {entry['path']} ({source}) is damaged",
                    f"nothing was handed over; {entry['path']} is left as it is: restore it by hand",
                )
        return self.append("handed-over", of=of, entry=taken)

    def restore(self, entry: dict) -> str:
        """Put one backed-up path back as it was (idempotent); says what it did."""
        path = Path(entry["path"])
        refuse_untrusted_folder(path)
        if "symlink" in entry:
            if path.is_symlink() and os.readlink(path) == entry["symlink"]:
                return f"kept the link {path}"
            _remove(path)
            path.symlink_to(entry["symlink"])
            fsync_dir(path.parent)
            return f"restored the link {path}"
        if entry["backup"] is None:
            if path.exists() or path.is_symlink():
                _remove(path)
                fsync_dir(path.parent)
                return f"removed {path}"
            return f"{path} already absent"
        backup = self.backups / entry["backup"]
        if not backup.is_file() or sha256_file(backup) != entry["sha256"]:
            raise JournalError(
                f"the backup of {path} ({backup}) is missing or damaged",
                f"{path} was left as it is; restore it by hand",
            )
        if path.is_file() and not path.is_symlink() and sha256_file(path) == entry["sha256"]:
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


def _set_owner_mode(path: Path, entry: dict) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _own_like(fd, entry["uid"], entry["gid"], entry["mode"])
    finally:
        os.close(fd)


def deepest_first(dirs: list[str]) -> list[str]:
    """The order created folders are removed in (and a rollback's plan lists them): a folder before its parent."""
    return sorted(dirs, key=lambda d: d.count("/"), reverse=True)


def remove_created_dirs(dirs: list[str]) -> list[str]:
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


def summarize(records: list[dict]) -> State:
    state = State(begin=None)
    by_seq: dict[int, StepState] = {}
    for record in records:
        kind = record["kind"]
        if kind == "begin" and state.begin is None:
            state.begin = record
        elif kind == "intent":
            step = StepState(record["seq"], record["step"], record)
            state.steps.append(step)
            by_seq[record["seq"]] = step
        elif kind == "done":
            for step in reversed(state.steps):
                if step.step == record["step"]:
                    step.done = True
                    break
        elif kind == "commit":
            state.committed = True
        elif kind == "rollback":
            state.rollback_started = True
        elif kind == "handed-over" and record.get("of") in by_seq and isinstance(record.get("entry"), dict):
            # a malformed one is not applied here; journal_checks refuses it before anything acts on the journal
            step, taken = by_seq[record["of"]], record["entry"]
            backups = [taken if b.get("path") == taken.get("path") else b for b in step.intent["backups"]]
            step.intent = {**step.intent, "backups": backups}
        elif kind == "undone" and record.get("of") in by_seq:
            by_seq[record["of"]].undone = True
        elif kind == "rolled-back":
            state.rolled_back = True
    return state
