"""Which GPU targets a file carries code for, read from the file itself: no ROCm tool needed.

Three shapes hold AMD GPU code:

- clang offload bundles (`__CLANG_OFFLOAD_BUNDLE__`, 24 bytes, then the entry count and, per entry, offset,
  size and an id such as `hipv4-amdgcn-amd-amdhsa--gfx1010`), embedded in a HIP library's .hip_fatbin
  section (librocblas.so holds dozens) or standing alone (.co files);
- compressed bundles (`CCOB`, version, method 0 zlib / 1 zstd, sizes, a hash, then the compressed
  bundle), which newer ROCm and PyTorch builds embed instead; only the first 64 KiB are inflated, enough
  for the inner bundle's header with its ids;
- bare AMDGPU ELF code objects (.hsaco, Tensile's .co): e_machine EM_AMDGPU, the processor in e_flags.

A library's data files (Tensile's `TensileLibrary_*_gfx1010.hsaco`, `.dat`, MIOpen's `gfx1010*.kdb`) also
name their target, which is how ROCm itself picks them.
"""

from __future__ import annotations

import io
import mmap
import re
import struct
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rdna1_kmgr.core import user_files

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED_MAGIC = b"CCOB"
ELF_MAGIC = b"\x7fELF"
EM_AMDGPU = 224
_INFLATE_LIMIT = 64 * 1024
_STREAM_HEAD = 1 << 20  # compressed bytes fed to the inflater: plenty for 64 KiB of output
_MAX_ENTRIES = 4096

# The processors in EF_AMDGPU_MACH (LLVM's BinaryFormat/ELF.h) that matter here; others print as mach-0xNN.
ELF_MACH = {
    0x02A: "gfx803",
    0x02C: "gfx900",
    0x02F: "gfx906",
    0x030: "gfx908",
    0x03F: "gfx90a",
    0x04C: "gfx942",
    0x033: "gfx1010",
    0x034: "gfx1011",
    0x035: "gfx1012",
    0x042: "gfx1013",
    0x036: "gfx1030",
    0x037: "gfx1031",
    0x038: "gfx1032",
    0x039: "gfx1033",
    0x03E: "gfx1034",
    0x03D: "gfx1035",
    0x045: "gfx1036",
    0x041: "gfx1100",
    0x046: "gfx1101",
    0x047: "gfx1102",
    0x044: "gfx1103",
    0x048: "gfx1200",
    0x04E: "gfx1201",
    0x051: "gfx9-generic",
    0x052: "gfx10-1-generic",
    0x053: "gfx10-3-generic",
    0x054: "gfx11-generic",
    0x059: "gfx12-generic",
}

# Code built for a generic target runs on every processor of its family (LLVM AMDGPUUsage, "Generic
# processors"); gfx10-1-generic covers the RDNA1 chips.
GENERIC_FAMILIES = {
    "gfx9-generic": ("gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c"),
    "gfx10-1-generic": ("gfx1010", "gfx1011", "gfx1012", "gfx1013"),
    "gfx10-3-generic": ("gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036"),
    "gfx11-generic": ("gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153"),
    "gfx12-generic": ("gfx1200", "gfx1201"),
}

# A processor name inside a file name or a bundle id: gfx803, gfx90a, gfx1010, gfx10-1-generic.
TARGET_IN_NAME = re.compile(r"gfx(?:[0-9]+(?:-[0-9]+)?-generic|[0-9]{1,2}[0-9a-f]{2})(?![0-9a-f])")


def gfx_name(major: int, minor: int, stepping: int) -> str:
    """The processor name ROCm derives from a version triple: (10, 1, 0) -> gfx1010, (9, 0, 10) -> gfx90a."""
    return f"gfx{major}{minor:x}{stepping:x}"


def from_kfd_version(value: int) -> str:
    """KFD's gfx_target_version (major*10000 + minor*100 + stepping, 100100 for gfx1010) as a name."""
    return gfx_name(value // 10000, value // 100 % 100, value % 100)


def runs_on(code_target: str, processor: str) -> bool:
    """Whether code built for `code_target` (a feature suffix such as :xnack- allowed) runs on `processor`."""
    target = code_target.split(":")[0]
    return target == processor or processor in GENERIC_FAMILIES.get(target, ())


def bundle_entry_target(entry_id: str) -> str | None:
    """The GPU processor of a bundle entry id, None for the host entry: hipv4-amdgcn-amd-amdhsa--gfx1010
    and hip-amdgcn-amd-amdhsa-gfx1010:xnack- both give gfx1010."""
    kind, sep, rest = entry_id.partition("-")
    if not sep or not rest.startswith("amdgcn-"):
        return None
    match = TARGET_IN_NAME.search(rest)
    return match.group(0) if match else None


@dataclass
class CodeObjects:
    """What one file (or a whole library) carries: processor -> how many code objects."""

    targets: Counter = field(default_factory=Counter)
    bundles: int = 0
    compressed: int = 0
    elf_objects: int = 0
    unreadable: list[str] = field(default_factory=list)  # compressed bundles that could not be inflated, why

    def add(self, other: CodeObjects) -> None:
        self.targets.update(other.targets)
        self.bundles += other.bundles
        self.compressed += other.compressed
        self.elf_objects += other.elf_objects
        self.unreadable += other.unreadable

    def has(self, processor: str) -> bool:
        return any(runs_on(target, processor) for target in self.targets)

    def to_json(self) -> dict:
        return {
            "targets": dict(sorted(self.targets.items())),
            "bundles": self.bundles,
            "compressed_bundles": self.compressed,
            "elf_code_objects": self.elf_objects,
            "unreadable": self.unreadable,
        }


def scan_binary(path: Path, within: Path | None = None) -> CodeObjects:
    """Every bundle, compressed bundle and (for a bare code object) the ELF processor in one file; a file of a
    user's venv only when its real path is inside `within` (core/user_files.py)."""
    found = CodeObjects()
    try:
        with user_files.open_binary(path, within) as handle:
            head = handle.read(64)
            if not head:
                return found
            target = elf_processor(head)
            if target is not None:
                found.targets[target] += 1
                found.elf_objects += 1
                return found
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                _scan_bundles(data, found)
                _scan_compressed(data, found)
    except (OSError, ValueError) as err:  # ValueError: mmap of an empty or special file
        found.unreadable.append(f"{path}: {err}")
    return found


def elf_processor(head: bytes) -> str | None:
    """The processor of a 64-bit little-endian AMDGPU ELF code object from its first 64 bytes."""
    if len(head) < 52 or head[:4] != ELF_MAGIC or head[4] != 2 or head[5] != 1:
        return None
    (machine,) = struct.unpack_from("<H", head, 18)
    if machine != EM_AMDGPU:
        return None
    (flags,) = struct.unpack_from("<I", head, 48)
    return ELF_MACH.get(flags & 0xFF, f"mach-0x{flags & 0xFF:02x}")


def bundle_ids(data, start: int = 0, whole: bool = True) -> list[str] | None:
    """The entry ids of the offload bundle at `start`, None when what is there is not a whole bundle
    header (the magic also occurs as a constant in the code that reads bundles). With whole=False `data`
    is only the head of a bundle (an inflated compressed one): entries may point past its end."""
    end = len(data)
    if data[start : start + 24] != BUNDLE_MAGIC or start + 32 > end:
        return None
    (count,) = struct.unpack_from("<Q", data, start + 24)
    if not 0 < count <= _MAX_ENTRIES:
        return None
    ids, pos = [], start + 32
    for _ in range(count):
        if pos + 24 > end:
            return None
        offset, size, length = struct.unpack_from("<QQQ", data, pos)
        pos += 24
        if not 0 < length <= 256 or pos + length > end or (whole and start + offset + size > end):
            return None
        raw = bytes(data[pos : pos + length])
        pos += length
        if not raw.isascii() or not raw.decode().isprintable():
            return None
        ids.append(raw.decode())
    return ids


def _scan_bundles(data, found: CodeObjects) -> None:
    pos = data.find(BUNDLE_MAGIC)
    while pos != -1:
        ids = bundle_ids(data, pos)
        if ids is not None:
            found.bundles += 1
            for entry in ids:
                target = bundle_entry_target(entry)
                if target:
                    found.targets[target] += 1
        pos = data.find(BUNDLE_MAGIC, pos + 1)


def _scan_compressed(data, found: CodeObjects) -> None:
    pos = data.find(COMPRESSED_MAGIC)
    while pos != -1:
        header = compressed_header(data, pos)
        if header is not None:
            method, body_start, body_end = header
            found.compressed += 1
            try:
                inner = inflate_head(method, data[body_start : min(body_end, body_start + _STREAM_HEAD)])
            except Exception as err:  # noqa: BLE001 - a damaged stream is reported, the scan goes on
                found.unreadable.append(f"compressed bundle at offset {pos}: {err}")
            else:
                ids = bundle_ids(inner, whole=False)
                if ids is None:
                    found.unreadable.append(f"compressed bundle at offset {pos}: no bundle header inside")
                for entry in ids or ():
                    target = bundle_entry_target(entry)
                    if target:
                        found.targets[target] += 1
        pos = data.find(COMPRESSED_MAGIC, pos + 1)


def compressed_header(data, pos: int) -> tuple[int, int, int] | None:
    """(method, start, end of the compressed stream) of the CCOB header at `pos`, None when it is not one.

    Version 1: u16 version, u16 method, u32 uncompressed size, u64 hash; version 2 adds a u32 total size
    before the uncompressed size; version 3 widens both sizes to u64.
    """
    end = len(data)
    if pos + 32 > end:
        return None
    version, method = struct.unpack_from("<HH", data, pos + 4)
    if method not in (0, 1):
        return None
    if version == 1:
        start, total = pos + 20, end - pos
    elif version == 2:
        (total,) = struct.unpack_from("<I", data, pos + 8)
        start = pos + 24
    elif version == 3:
        (total,) = struct.unpack_from("<Q", data, pos + 8)
        start = pos + 32
    else:
        return None
    stop = pos + total
    if stop > end or stop <= start:
        return None
    stream = bytes(data[start : start + 4])
    zstd_frame = stream == b"\x28\xb5\x2f\xfd"
    zlib_stream = len(stream) >= 2 and stream[0] & 0x0F == 8 and int.from_bytes(stream[:2], "big") % 31 == 0
    if (method == 1 and not zstd_frame) or (method == 0 and not zlib_stream):
        return None
    return method, start, stop


def inflate_head(method: int, stream) -> bytes:
    """The first 64 KiB (or so) of a compressed bundle's content, from the head of its stream."""
    if method == 0:
        return zlib.decompressobj().decompress(bytes(stream), _INFLATE_LIMIT)
    try:
        import zstandard
    except ImportError:
        raise RuntimeError("zstd-compressed; the Python module zstandard is needed to read it") from None
    # A stream reader stops at the limit: a few KB of zstd can stand for gigabytes (RLE blocks), and the frame's
    # declared size is the writer's word, so neither decompress() nor max_output_size bounds what it makes.
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(bytes(stream))) as reader:
        head = bytearray()
        while len(head) < _INFLATE_LIMIT:
            block = reader.read(_INFLATE_LIMIT - len(head))
            if not block:
                break
            head += block
    return bytes(head)


def targets_in_name(name: str) -> list[str]:
    return TARGET_IN_NAME.findall(name)
