"""tests/log_writes.py: a dm-log-writes log, as QEMU's blklogwrites writes it, replayed onto a copy of a disk.

The logs here are built by hand from the documented layout (kernel drivers/md/dm-log-writes.c, xfstests
src/log-writes/log-writes.h, QEMU block/blklogwrites.c), not with the module under test:

    log sector 0: super block  <Q magic, <Q version, <Q nr_entries, <I sectorsize   (28 bytes, zero-padded)
    each entry:   one log sector  <Q sector, <Q nr_sectors, <Q flags, <Q data_len    (32 bytes, zero-padded;
                                  a mark's label right after them), then nr_sectors of data unless a discard
"""

import struct
from pathlib import Path

import log_writes
import pytest

MAGIC = 0x6A736677736872
FLUSH, FUA, DISCARD, MARK = 1, 2, 4, 8
SECTOR = 512  # QEMU's default log-sector-size


def super_block(nr_entries: int, sector_size: int = SECTOR, magic: int = MAGIC, version: int = 1) -> bytes:
    return struct.pack("<QQQI", magic, version, nr_entries, sector_size).ljust(sector_size, b"\0")


def entry(sector: int, data: bytes = b"", flags: int = 0, sector_size: int = SECTOR, nr_sectors: int = -1) -> bytes:
    """An entry header sector and its data; nr_sectors defaults to the data's (a discard names its own)."""
    count = len(data) // sector_size if nr_sectors < 0 else nr_sectors
    return struct.pack("<QQQQ", sector, count, flags, 0).ljust(sector_size, b"\0") + data


def mark(label: bytes, sector_size: int = SECTOR) -> bytes:
    return (struct.pack("<QQQQ", 0, 0, MARK, len(label)) + label).ljust(sector_size, b"\0")


def sectors(char: bytes, count: int = 1, sector_size: int = SECTOR) -> bytes:
    return char * (sector_size * count)


def write_log(path: Path, *entries: bytes, sector_size: int = SECTOR) -> Path:
    path.write_bytes(super_block(len(entries), sector_size) + b"".join(entries))
    return path


def base_disk(path: Path, count: int = 8, sector_size: int = SECTOR) -> Path:
    """A disk of `count` sectors, each all dots: what a replay did not touch still reads '.'."""
    path.write_bytes(sectors(b".", count, sector_size))
    return path


def disk(layout: str, sector_size: int = SECTOR) -> bytes:
    """The expected disk, one character a sector: '0' a zeroed sector, any other its byte repeated."""
    return b"".join(bytes(sector_size) if c == "0" else sectors(c.encode(), 1, sector_size) for c in layout)


# Writes (W), a flush, an overwrite and a FUA write, a last write and a flush: crash points after entries 2, 4, 6
RUN = (
    entry(0, sectors(b"a")),  # 0 W sector 0
    entry(1, sectors(b"b", 2)),  # 1 W sectors 1-2
    entry(0, flags=FLUSH),  # 2 flush
    entry(0, sectors(b"c")),  # 3 W sector 0 again
    entry(5, sectors(b"d"), flags=FUA),  # 4 FUA W sector 5
    entry(7, sectors(b"e")),  # 5 W sector 7
    entry(0, flags=FLUSH),  # 6 flush
)
DISK_AT = {2: "abb.....", 4: "cbb..d..", 6: "cbb..d.e"}


def test_the_super_block_and_each_entry_are_read_where_the_layout_puts_them(tmp_path):
    path = write_log(
        tmp_path / "run.log",
        entry(2, sectors(b"a")),  # header at byte 512, data at 1024
        entry(0, flags=FLUSH),  # header at 1536
        entry(4, flags=DISCARD, nr_sectors=2),  # header at 2048, no data
        entry(5, sectors(b"b", 2), flags=FUA),  # header at 2560, data at 3072
        mark(b"done"),  # header at 4096, label right after the 32-byte header
    )
    log = log_writes.read_log(path)
    assert (log.magic, log.version, log.nr_entries, log.sector_size) == (MAGIC, 1, 5, 512)
    read = [(e.index, e.sector, e.nr_sectors, e.flags, e.data_offset, e.data_len) for e in log.entries]
    assert read == [
        (0, 2, 1, 0, 1024, 0),
        (1, 0, 0, FLUSH, 2048, 0),
        (2, 4, 2, DISCARD, 2560, 0),
        (3, 5, 2, FUA, 3072, 0),
        (4, 0, 0, MARK, 4128, 4),
    ]
    assert log.mark_label(log.entries[4]) == "done"


def test_flush_fua_and_mark_entries_are_the_crash_points(tmp_path):
    log = log_writes.read_log(write_log(tmp_path / "run.log", *RUN, mark(b"end")))
    assert log_writes.flush_points(log) == [2, 4, 6, 7]


@pytest.mark.parametrize("point", sorted(DISK_AT))
def test_the_disk_at_each_point_holds_exactly_the_writes_before_it(tmp_path, point):
    log = log_writes.read_log(write_log(tmp_path / "run.log", *RUN))
    image = tmp_path / "replayed.img"
    log_writes.replay(log, base_disk(tmp_path / "base.img"), image, through=point)
    assert image.read_bytes() == disk(DISK_AT[point])


def test_stepping_point_by_point_gives_the_bytes_of_a_replay_from_scratch(tmp_path):
    log = log_writes.read_log(write_log(tmp_path / "run.log", *RUN))
    base = base_disk(tmp_path / "base.img")
    stepped = {}
    for point in log_writes.crash_points(log, base, tmp_path / "stepped.img"):
        stepped[point] = (tmp_path / "stepped.img").read_bytes()
    assert sorted(stepped) == [2, 4, 6]
    for point, seen in stepped.items():
        log_writes.replay(log, base, tmp_path / "scratch.img", through=point)
        assert seen == (tmp_path / "scratch.img").read_bytes() == disk(DISK_AT[point])


def test_a_discard_zeroes_its_sectors(tmp_path):
    log = log_writes.read_log(
        write_log(tmp_path / "run.log", entry(2, flags=DISCARD, nr_sectors=3), entry(0, flags=FLUSH))
    )
    log_writes.replay(log, base_disk(tmp_path / "base.img"), tmp_path / "replayed.img", through=1)
    assert (tmp_path / "replayed.img").read_bytes() == disk("..000...")


def test_a_4096_byte_log_sector_counts_offsets_and_lengths_in_4096_byte_sectors(tmp_path):
    big = 4096  # log-sector-size=4096
    path = write_log(
        tmp_path / "run.log",
        entry(1, sectors(b"x", 1, big), sector_size=big),
        entry(3, flags=DISCARD, nr_sectors=1, sector_size=big),
        entry(0, flags=FLUSH, sector_size=big),
        sector_size=big,
    )
    log = log_writes.read_log(path)
    assert (log.sector_size, log.entries[0].data_offset) == (4096, 8192)
    log_writes.replay(log, base_disk(tmp_path / "base.img", 4, big), tmp_path / "replayed.img", through=2)
    assert (tmp_path / "replayed.img").read_bytes() == disk(".x.0", big)


def test_entries_past_the_super_blocks_count_are_not_replayed(tmp_path):
    # QEMU rewrites the super block at each flush (and every log-super-update-interval entries): later entries
    # are in the file but not counted yet
    path = tmp_path / "run.log"
    path.write_bytes(super_block(1) + entry(0, sectors(b"a")) + entry(1, sectors(b"b")))
    log = log_writes.read_log(path)
    assert log.nr_entries == len(log.entries) == 1


def test_a_replay_cannot_go_back(tmp_path):
    log = log_writes.read_log(write_log(tmp_path / "run.log", *RUN))
    image = tmp_path / "replayed.img"
    log_writes.sparse_copy(base_disk(tmp_path / "base.img"), image)
    with log_writes.Replayer(log, image) as replayer:
        replayer.advance_through(4)
        with pytest.raises(ValueError, match="cannot replay through entry 2: 5 of 7 entries are applied"):
            replayer.advance_through(2)


def test_a_write_past_the_end_of_the_base_disk_is_refused(tmp_path):
    log = log_writes.read_log(write_log(tmp_path / "run.log", entry(8, sectors(b"a"))))
    with pytest.raises(ValueError, match=r"entry 0 covers bytes 4096 to 4608, past the end of .*\(4096 bytes\)"):
        log_writes.replay(log, base_disk(tmp_path / "base.img"), tmp_path / "replayed.img", through=0)


def refused(path: Path) -> str:
    """The one line read_log refuses `path` with."""
    with pytest.raises(ValueError) as refusal:
        log_writes.read_log(path)
    message = str(refusal.value)
    assert "\n" not in message
    return message


def test_a_bad_magic_is_refused_with_one_line(tmp_path):
    path = tmp_path / "run.log"
    path.write_bytes(super_block(1, magic=0x1234) + entry(0, sectors(b"a")))
    assert refused(path) == f"{path}: not a dm-log-writes log: magic 0x1234, expected 0x6a736677736872"


def test_a_log_with_no_super_block_yet_is_refused_as_not_a_log(tmp_path):
    # QEMU writes the super block only at the first flush (or after log-super-update-interval entries)
    path = tmp_path / "run.log"
    path.write_bytes(bytes(SECTOR) + entry(0, sectors(b"a")))
    assert refused(path) == f"{path}: not a dm-log-writes log: magic 0x0, expected 0x6a736677736872"


def test_an_unknown_version_is_refused(tmp_path):
    path = tmp_path / "run.log"
    path.write_bytes(super_block(0, version=2))
    assert refused(path) == f"{path}: dm-log-writes log version 2, only version 1 is known"


def test_a_file_shorter_than_the_super_block_is_refused(tmp_path):
    path = tmp_path / "run.log"
    path.write_bytes(b"jfswhsj")
    assert refused(path) == f"{path}: not a dm-log-writes log: 7 bytes, less than its super block's 28"


def test_an_entry_whose_data_is_cut_off_is_refused_as_truncated(tmp_path):
    path = write_log(tmp_path / "run.log", entry(0, sectors(b"a")), entry(1, sectors(b"b", 2)))
    path.write_bytes(path.read_bytes()[:-100])  # the second entry's data ends 100 bytes short
    assert refused(path) == (
        f"{path}: truncated dm-log-writes log: entry 1 of 2 has data up to byte 3072, the file ends at byte 2972"
    )


def test_a_missing_entry_header_is_refused_as_truncated(tmp_path):
    path = tmp_path / "run.log"
    path.write_bytes(super_block(2) + entry(0, sectors(b"a")))  # counts 2 entries, holds 1
    assert refused(path) == (
        f"{path}: truncated dm-log-writes log: entry 1 at byte 1536 needs a 512-byte header sector,"
        " the file ends at byte 1536"
    )


def test_a_header_that_is_not_zero_padded_is_refused(tmp_path):
    # what reading with the wrong sector size finds: data where a header's padding should be
    path = tmp_path / "run.log"
    path.write_bytes(super_block(1) + struct.pack("<QQQQ", 0, 1, 0, 0) + b"x" * (SECTOR - 32) + sectors(b"a"))
    assert refused(path) == f"{path}: malformed dm-log-writes entry 0 at byte 512: its header is not zero-padded"
