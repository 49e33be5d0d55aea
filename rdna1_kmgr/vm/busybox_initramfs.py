"""A guest's initramfs: the host's static busybox, an init script and other files as data, written as an
uncompressed newc cpio archive (what the kernel unpacks as its rootfs). The plumbing guest and the host-root
guest build theirs here."""

from __future__ import annotations

import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core.errors import HostError


@dataclass(frozen=True)
class Entry:
    name: str  # the path in the archive, without a leading /
    mode: int  # type and permission bits, as stat gives them
    data: bytes = b""


def folder(name: str) -> Entry:
    return Entry(name, stat.S_IFDIR | 0o755)


def program(name: str, data: bytes) -> Entry:
    return Entry(name, stat.S_IFREG | 0o755, data)


def text(name: str, data: bytes) -> Entry:
    return Entry(name, stat.S_IFREG | 0o644, data)


def static_busybox() -> Path:
    """The host's busybox, if it is a static binary (a dynamic one would need its libraries in the guest)."""
    found = shutil.which("busybox")
    if found is None:
        raise HostError("busybox is not installed", "apt-get install busybox-static")
    path = Path(found).resolve()
    if _is_dynamic_elf(path):
        raise HostError(
            f"{path} is linked dynamically; the guest needs a static busybox", "apt-get install busybox-static"
        )
    return path


def write(dest: Path, init: bytes, files: list[Entry] | None = None) -> Path:
    """Write the guest's initramfs to `dest` as an uncompressed newc cpio archive: the host's static busybox as
    /bin/busybox, `files` in order (a folder before what it holds), and `init` as /init."""
    entries = [
        folder("bin"),
        program("bin/busybox", static_busybox().read_bytes()),
        *(files or []),
        program("init", init),
    ]
    with open(dest, "wb") as out:
        for ino, entry in enumerate(entries, start=1):
            out.write(_cpio_entry(ino, entry.name, entry.mode, entry.data))
        out.write(_cpio_entry(0, "TRAILER!!!", 0, b""))
    return dest


def _cpio_entry(ino: int, name: str, mode: int, data: bytes) -> bytes:
    encoded = name.encode() + b"\0"
    fields = [ino, mode, 0, 0, 1 if not stat.S_ISDIR(mode) else 2, 0, len(data), 0, 0, 0, 0, len(encoded), 0]
    header = b"070701" + b"".join(b"%08X" % f for f in fields)
    return _pad(header + encoded) + _pad(data)


def _pad(chunk: bytes) -> bytes:
    return chunk + b"\0" * (-len(chunk) % 4)


def _is_dynamic_elf(path: Path) -> bool:
    """Whether an ELF64 file has a PT_INTERP program header (it needs a dynamic loader)."""
    with open(path, "rb") as handle:
        head = handle.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            raise HostError(f"{path} is not a 64-bit ELF program", "apt-get install busybox-static")
        phoff = int.from_bytes(head[32:40], "little")
        phentsize = int.from_bytes(head[54:56], "little")
        phnum = int.from_bytes(head[56:58], "little")
        handle.seek(phoff)
        table = handle.read(phentsize * phnum)
    return any(int.from_bytes(table[i * phentsize : i * phentsize + 4], "little") == 3 for i in range(phnum))
