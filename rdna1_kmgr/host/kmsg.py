"""The host's kernel log as /dev/kmsg gives it: numbered records, so "since then" is a sequence number.

Each read(2) of /dev/kmsg returns one record, `priority,sequence,microseconds,flags;message`, followed by
continuation lines starting with a space (KEY=value). A fixture (a plain file of such records) reads the
same way, many records per read.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Record:
    seq: int
    message: str
    usec: int = 0  # microseconds since boot, when the kernel logged it

    def since_boot(self) -> str:
        return f"{self.usec / 1e6:.1f} s after boot"


def records(sysroot: Path = Path("/")) -> list[Record]:
    """Every record the kernel still holds, oldest first; [] when the log cannot be read."""
    try:
        fd = os.open(sysroot / "dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    chunks = []
    try:
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:  # the end of the device's buffer
                break
            except OSError as err:
                if err.errno == errno.EPIPE:  # the record we were at was overwritten: go on with the next
                    continue
                break
            if not data:  # the end of a plain file
                break
            chunks.append(data.decode(errors="replace"))
    finally:
        os.close(fd)
    return parse("".join(chunks))


def parse(text: str) -> list[Record]:
    found = []
    for line in text.splitlines():
        if not line or line.startswith(" "):
            continue
        header, sep, message = line.partition(";")
        fields = header.split(",")
        if not sep or len(fields) < 2 or not fields[1].isdigit():
            continue
        usec = int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else 0
        found.append(Record(int(fields[1]), message, usec))
    return found


def last_seq(sysroot: Path = Path("/")) -> int | None:
    found = records(sysroot)
    return found[-1].seq if found else None


def since(seq: int | None, sysroot: Path = Path("/")) -> list[Record]:
    """Records after `seq` (all of them when seq is None)."""
    return [r for r in records(sysroot) if seq is None or r.seq > seq]
