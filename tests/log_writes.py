"""Replays a dm-log-writes log, as QEMU's `blklogwrites` block driver records it, onto a copy of the disk it recorded.

For the crash-consistency test of issue 52: one whole-system run is recorded write by write, then the disk is
rebuilt at every point a crash could have left it (each flush) and each of those disks is checked on the host.

Sources of the format (read, not copied; the code here is written from the layout they document):

- Linux, Documentation/admin-guide/device-mapper/log-writes.rst (the dm-log-writes target, its ordering rules and
  its replay tool) and drivers/md/dm-log-writes.c (the "braindead simple" disk format comment, the structures).
- xfstests, src/log-writes/log-writes.h (the structures and flag values as userspace reads them),
  src/log-writes/log-writes.c and replay-log.c (the reference replayer: how it walks the log, what it refuses,
  what it does with a discard).
- QEMU, block/blklogwrites.c (7.2; what this module reads) and qapi/block-core.json (BlockdevOptionsBlklogwrites).

The layout, all little-endian, in units of one log sector (`sector_size` bytes: QEMU's `log-sector-size` option,
512 by default; a power of two from 32 bytes to under 16 MiB):

    log sector 0      super block: magic u64 (0x6a736677736872), version u64 (1), nr_entries u64,
                      sectorsize u32; 28 bytes, then zeros to the end of the sector
    then nr_entries times:
      1 log sector    entry header: sector u64, nr_sectors u64, flags u64, data_len u64; 32 bytes, then zeros
                      (a MARK entry's label, data_len bytes, sits in those zeros right after the header)
      nr_sectors      the data written, unless the entry is a DISCARD (a discard carries no data)

    flags: FLUSH 1, FUA 2, DISCARD 4, MARK 8 (and METADATA 16 in newer kernels, a hint with no effect on replay)

`sector` and `nr_sectors` count log sectors too: the write covered bytes sector * sector_size up to
(sector + nr_sectors) * sector_size of the disk (QEMU aligns every request to the log sector size for this).

What QEMU 7.2's blklogwrites does, which decides how the log is read here:

- Every write is logged after it completed on the disk image: the header and its data in one write to the log at
  a position reserved then, so entries are in completion order (not dm-log-writes' "held until the next flush"
  order). The disk at a flush entry therefore holds every write that completed before that flush completed: what
  the guest waited for, and perhaps writes still in flight that happened to land first (a state a real crash can
  leave too).
- A flush is an entry of its own: sector 0, nr_sectors 0, flags FLUSH. QEMU never sets FUA: the driver does not
  claim FUA support, so the block layer turns a FUA write into the write and then a flush (a FLUSH entry). A
  flush with no write since the previous one is not passed down, hence not logged.
- A "write zeroes" request is logged as a plain write (flags 0) whose data is zeros (written sparse in the log).
- A discard is a DISCARD entry without data (and reaches the driver only with discard=unmap on its node).
- The super block is rewritten, and the log file flushed, at every FLUSH entry and every
  `log-super-update-interval` entries (4096 by default). Entries logged after the last such update are in the file
  but not counted by nr_entries: like replay-log and QEMU's own log-append, this module reads exactly nr_entries
  entries and ignores what follows. A run with no flush at all and fewer entries than the interval leaves no
  super block (all zeros): it is refused as "not a dm-log-writes log".

Replaying (the `Replayer`): entries are applied in order onto a sparse copy of the disk the run started from; a
`Replayer` only moves forward, so visiting every crash point costs one pass over the log, not one pass per point.
A discard writes zeros: replay-log asks the replay device to discard (BLKDISCARD) and, where it cannot (a regular
file cannot), writes zeros instead; it skips zeroing a discard larger than 128 MiB, which would leave whatever the
disk held before, so here every discard is zeroed, whatever its size. Zeros are also what the recorded run's guest
read back: QEMU's file driver punches a hole for a discard. Zeros are written only where the copy holds something
else, so holes stay holes and the copy stays sparse.

Usage:

    log = read_log(Path("writes.log"))
    for point in crash_points(log, base=Path("base.img"), image=tmp / "replayed.img"):
        ...  # the image now holds the disk as it was right after entry `point`

Errors: a file that is not such a log, or is cut short, raises ValueError with one line saying what and where.
"""

from __future__ import annotations

import os
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

MAGIC = 0x6A736677736872  # b"rhswfsj" read as a little-endian u64, as the kernel defines WRITE_LOG_MAGIC
VERSION = 1

SUPER_BLOCK = struct.Struct("<QQQI")  # magic, version, nr_entries, sectorsize: 28 bytes, no padding
ENTRY_HEADER = struct.Struct("<QQQQ")  # sector, nr_sectors, flags, data_len: 32 bytes

FLUSH = 1 << 0
FUA = 1 << 1
DISCARD = 1 << 2
MARK = 1 << 3
METADATA = 1 << 4  # the kernel's REQ_META hint (xfstests knows it; QEMU never writes it)
KNOWN_FLAGS = FLUSH | FUA | DISCARD | MARK | METADATA

# After these the disk is in a state a crash could leave and a file system must cope with
CRASH_POINT_FLAGS = FLUSH | FUA | MARK

MAX_SECTOR_SIZE = 1 << 24  # QEMU refuses a log sector size of 16 MiB or more

# Data is moved in pieces of this size, so one huge write or discard never sits whole in memory
CHUNK = 1 << 20
_ZEROS = memoryview(bytes(CHUNK))


@dataclass(frozen=True)
class LogEntry:
    """One logged request. Offsets and lengths on the disk are in log sectors, as the log stores them."""

    index: int  # 0 for the first entry after the super block
    sector: int  # the first disk sector the request covered
    nr_sectors: int  # 0 for a flush or a mark
    flags: int
    data_offset: int  # byte offset in the log file of the data written (of the label, for a mark)
    data_len: int  # bytes of a mark's label; 0 for every entry QEMU writes

    @property
    def is_discard(self) -> bool:
        return bool(self.flags & DISCARD)

    @property
    def is_crash_point(self) -> bool:
        return bool(self.flags & CRASH_POINT_FLAGS)


@dataclass(frozen=True)
class Log:
    """A log's super block and the entries it counts."""

    path: Path
    magic: int
    version: int
    nr_entries: int
    sector_size: int
    entries: tuple[LogEntry, ...]

    def mark_label(self, entry: LogEntry) -> str:
        """The text a MARK entry carries ("" for any other entry)."""
        if not entry.flags & MARK:
            return ""
        with self.path.open("rb") as log_file:
            label = os.pread(log_file.fileno(), entry.data_len, entry.data_offset)
        return label.decode(errors="replace")


def read_log(path: Path) -> Log:
    """The super block and every entry it counts, each checked against the file (ValueError if it does not fit)."""
    with path.open("rb") as log_file:
        fd = log_file.fileno()
        file_size = os.fstat(fd).st_size
        magic, version, nr_entries, sector_size = _read_super_block(fd, path)
        entries = tuple(_read_entries(fd, path, file_size, nr_entries, sector_size))
    return Log(path, magic, version, nr_entries, sector_size, entries)


def _read_super_block(fd: int, path: Path) -> tuple[int, int, int, int]:
    raw = os.pread(fd, SUPER_BLOCK.size, 0)
    if len(raw) < SUPER_BLOCK.size:
        raise ValueError(f"{path}: not a dm-log-writes log: {len(raw)} bytes, less than its super block's 28")
    magic, version, nr_entries, sector_size = SUPER_BLOCK.unpack(raw)
    if magic != MAGIC:
        raise ValueError(f"{path}: not a dm-log-writes log: magic {magic:#x}, expected {MAGIC:#x}")
    if version != VERSION:
        raise ValueError(f"{path}: dm-log-writes log version {version}, only version {VERSION} is known")
    if not _valid_sector_size(sector_size):
        raise ValueError(
            f"{path}: dm-log-writes log sector size {sector_size}: not a power of two from 32 bytes to under 16 MiB"
        )
    return magic, version, nr_entries, sector_size


def _valid_sector_size(size: int) -> bool:
    # QEMU's own check: a power of two, room for the entry header, below 16 MiB
    return ENTRY_HEADER.size <= size < MAX_SECTOR_SIZE and size & (size - 1) == 0


def _read_entries(fd: int, path: Path, file_size: int, nr_entries: int, sector_size: int) -> Iterator[LogEntry]:
    """The entries in log order: each header takes one log sector, followed by its data unless it is a discard."""
    log_sector = 1  # sector 0 is the super block's
    for index in range(nr_entries):
        entry = _read_entry(fd, path, file_size, index, log_sector * sector_size, sector_size)
        _check_entry(path, entry, nr_entries, file_size, sector_size)
        log_sector += 1 if entry.is_discard else 1 + entry.nr_sectors
        yield entry


def _read_entry(fd: int, path: Path, file_size: int, index: int, offset: int, sector_size: int) -> LogEntry:
    raw = os.pread(fd, sector_size, offset)
    if len(raw) < sector_size:
        raise ValueError(
            f"{path}: truncated dm-log-writes log: entry {index} at byte {offset} needs a {sector_size}-byte header"
            f" sector, the file ends at byte {file_size}"
        )
    sector, nr_sectors, flags, data_len = ENTRY_HEADER.unpack_from(raw)
    padding = raw[ENTRY_HEADER.size :]
    if flags & MARK:
        padding = padding[data_len:]  # the label comes first
        data_offset = offset + ENTRY_HEADER.size
    else:
        data_offset = offset + sector_size
    if any(padding):
        # replay-log's sanity check too: a header is zero-padded, so a wrong sector size or a stray position shows
        raise ValueError(
            f"{path}: malformed dm-log-writes entry {index} at byte {offset}: its header is not zero-padded"
        )
    return LogEntry(index, sector, nr_sectors, flags, data_offset, data_len)


def _check_entry(path: Path, entry: LogEntry, nr_entries: int, file_size: int, sector_size: int) -> None:
    """Refuses flags no writer sets, an all-zero header (no request is empty) and data cut off by the file's end."""
    where = f"{path}: dm-log-writes entry {entry.index} of {nr_entries}"
    if entry.flags & ~KNOWN_FLAGS:
        raise ValueError(f"{where}: unknown flags {entry.flags:#x}")
    if entry.flags == 0 and entry.nr_sectors == 0:
        raise ValueError(f"{where}: an all-zero header (the log holds fewer entries than its super block counts?)")
    if entry.flags & MARK and entry.data_len > sector_size - ENTRY_HEADER.size:
        raise ValueError(f"{where}: a {entry.data_len}-byte mark label does not fit its header sector")
    data_end = entry.data_offset + (0 if entry.is_discard or entry.flags & MARK else entry.nr_sectors * sector_size)
    if data_end > file_size:
        raise ValueError(
            f"{path}: truncated dm-log-writes log: entry {entry.index} of {nr_entries} has data up to byte {data_end},"
            f" the file ends at byte {file_size}"
        )


def flush_points(log: Log) -> list[int]:
    """The indexes of the entries after which the disk is a valid crash point: each FLUSH, FUA or MARK entry."""
    return [entry.index for entry in log.entries if entry.is_crash_point]


def sparse_copy(base: Path, dest: Path) -> None:
    """A copy of the disk image that keeps its holes (the base is mostly unallocated), sharing its blocks where
    both are on a file system with reflink."""
    subprocess.run(["cp", "--sparse=always", "--reflink=auto", str(base), str(dest)], check=True)


class Replayer:
    """Applies a log's entries in order onto a disk image file, forward only.

    `applied` counts the entries applied so far: the image holds the disk as it was right after entry applied - 1
    (before the first entry while it is 0). Use it as a context manager, or call close().
    """

    def __init__(self, log: Log, image: Path) -> None:
        self.log = log
        self.image = image
        self.applied = 0
        self._log_fd = os.open(log.path, os.O_RDONLY)
        self._image_fd = os.open(image, os.O_RDWR)
        self._image_size = os.fstat(self._image_fd).st_size

    def __enter__(self) -> Replayer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        os.close(self._log_fd)
        os.close(self._image_fd)

    def advance_through(self, index: int) -> None:
        """Applies every entry up to and including `index`; refuses to go back (replay again from a copy)."""
        if not self.applied - 1 <= index < len(self.log.entries):
            raise ValueError(
                f"cannot replay through entry {index}: {self.applied} of {len(self.log.entries)} entries are applied"
            )
        for entry in self.log.entries[self.applied : index + 1]:
            self._apply(entry)
        self.applied = index + 1

    def _apply(self, entry: LogEntry) -> None:
        if entry.nr_sectors == 0:
            return  # a flush or a mark: the disk's bytes do not change
        size = self.log.sector_size
        start, length = entry.sector * size, entry.nr_sectors * size
        if start + length > self._image_size:
            raise ValueError(
                f"{self.log.path}: entry {entry.index} covers bytes {start} to {start + length}, past the end of"
                f" {self.image} ({self._image_size} bytes): is it a copy of the disk the log was recorded on?"
            )
        for done in range(0, length, CHUNK):
            piece = min(CHUNK, length - done)
            data = _ZEROS[:piece] if entry.is_discard else self._log_data(entry, done, piece)
            self._store(start + done, data)

    def _log_data(self, entry: LogEntry, skip: int, length: int) -> bytes:
        data = os.pread(self._log_fd, length, entry.data_offset + skip)
        if len(data) != length:
            raise ValueError(
                f"{self.log.path}: entry {entry.index}'s data ends early: the log changed since it was read"
            )
        return data

    def _store(self, offset: int, data: bytes | memoryview) -> None:
        """Writes `data` at `offset`, except zeros over zeros: a hole in the image stays a hole."""
        zeros = _ZEROS[: len(data)]
        if data == zeros and os.pread(self._image_fd, len(data), offset) == zeros:
            return
        os.pwrite(self._image_fd, data, offset)


def replay(log: Log, base: Path, image: Path, through: int) -> None:
    """Builds `image` from scratch: a sparse copy of `base` with entries 0 to `through` applied."""
    sparse_copy(base, image)
    with Replayer(log, image) as replayer:
        replayer.advance_through(through)


def crash_points(log: Log, base: Path, image: Path) -> Iterator[int]:
    """Makes `image` a sparse copy of `base`, then moves it from one crash point to the next in one pass over the
    log, yielding each point's entry index while the image holds the disk as it was right after that entry."""
    sparse_copy(base, image)
    with Replayer(log, image) as replayer:
        for point in flush_points(log):
            replayer.advance_through(point)
            yield point
