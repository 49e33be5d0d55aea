"""The kernel file a TCG guest boots fastest: the vmlinux inside a distribution's bzImage, unpacked on the host and
booted through its PVH entry, instead of the bzImage, which unpacks itself in the guest.

Why: under TCG the bzImage's own xz decompressor is most of the time to the kernel's first line (Debian's 6.1:
3.2 s from QEMU's start to "Linux version", 0.6 s for the unpacked vmlinux, which Python's lzma unpacks on the
host in 0.8 s). QEMU boots an ELF kernel that carries a PVH entry note (CONFIG_PVH, which Debian's and Ubuntu's
x86 kernels set) with -kernel as it boots a bzImage, command line and initrd included. The vmlinux is written
into the run's own folder and goes with it: 66 MB for the length of a run, nothing kept in the cache.

The bzImage layout is the kernel's boot protocol (Documentation/arch/x86/boot.rst): the setup header's "HdrS"
at 0x202, setup_sects at 0x1f1, payload_offset and payload_length at 0x248 (protocol 2.08 on); the payload is
the compressed vmlinux, an ELF file (arch/x86/boot/compressed: `objcopy -S` of vmlinux, relocations after it).
"""

from __future__ import annotations

import lzma
import struct
import zlib
from pathlib import Path

from rdna1_kmgr.core import runner
from rdna1_kmgr.core.errors import KmgrError

XEN_ELFNOTE_PHYS32_ENTRY = 18  # include/xen/interface/elfnote.h: the 32-bit PVH entry point
PT_NOTE = 4


def fastest(image: Path, folder: Path) -> Path:
    """`folder`/vmlinux when `image` is a bzImage whose payload unpacks to an ELF kernel with a PVH entry, else
    `image` itself (another compression, an older boot protocol, no PVH: the guest boots the bzImage)."""
    try:
        data = image.read_bytes()
    except OSError:
        return image
    elf = unpacked_payload(data)
    if elf is None or not has_pvh_entry(elf):
        return image
    vmlinux = folder / "vmlinux"
    try:
        vmlinux.write_bytes(elf)
    except OSError:  # no room for 66 MB in the run folder: the bzImage boots, only slower
        vmlinux.unlink(missing_ok=True)
        return image
    return vmlinux


def unpacked_payload(data: bytes) -> bytes | None:
    """The bzImage's payload, decompressed (xz, gzip, zstd), or None."""
    if len(data) < 0x250 or data[0x202:0x206] != b"HdrS" or struct.unpack_from("<H", data, 0x206)[0] < 0x208:
        return None
    setup_bytes = ((data[0x1F1] or 4) + 1) * 512
    offset, length = struct.unpack_from("<II", data, 0x248)
    payload = data[setup_bytes + offset : setup_bytes + offset + length]
    try:
        if payload.startswith(b"\xfd7zXZ\x00"):
            return lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(payload)
        if payload.startswith(b"\x1f\x8b"):
            return zlib.decompressobj(wbits=31).decompress(payload)
        if payload.startswith(b"\x28\xb5\x2f\xfd") and runner.which("zstd"):
            # the build appends the unpacked size (4 bytes) after the frame, which zstd would read as another frame
            return runner.run(["zstd", "-d", "-c", "-q"], input=payload[:-4], text=False).stdout
    except (lzma.LZMAError, zlib.error, KmgrError):
        return None
    return None


def has_pvh_entry(elf: bytes) -> bool:
    """Whether a 64-bit little-endian ELF file has a Xen PHYS32_ENTRY note in a PT_NOTE segment."""
    if elf[:6] != b"\x7fELF\x02\x01":
        return False
    phoff, phentsize, phnum = struct.unpack_from("<Q", elf, 32)[0], *struct.unpack_from("<HH", elf, 54)
    for n in range(phnum):
        kind, _flags, offset, _vaddr, _paddr, size = struct.unpack_from("<IIQQQQ", elf, phoff + n * phentsize)
        if kind != PT_NOTE:
            continue
        at, end = offset, offset + size
        while at + 12 <= end:
            namesz, descsz, note_type = struct.unpack_from("<III", elf, at)
            name = elf[at + 12 : at + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and note_type == XEN_ELFNOTE_PHYS32_ENTRY:
                return True
            at += 12 + _aligned(namesz) + _aligned(descsz)
    return False


def _aligned(size: int) -> int:
    return size + (-size % 4)
