"""TheRock's kpack split: host-only libraries that point at `.kpack` archives of device code.

Read in TheRock (ROCm/TheRock: docs/rfcs/RFC0008-Multi-Arch-Packaging.md, docs/packaging/python_packaging.md)
and its kpack tool (rocm-kpack, built from rocm-systems' shared/kpack per TheRock's
cmake/therock_artifacts.cmake; its packed_kernel_archive.py and elf_offload_kpacker.py):

- a `.kpack` archive starts with a 16-byte header, `KPAK`, a little-endian u32 format version (1) and a u64
  offset of its table of contents; the TOC is one MessagePack map with `group_name`, `gfx_arch_family`,
  `gfx_arches` (the processors whose kernels it holds), `compression_scheme` and `toc` (binary path ->
  processor -> kernel entry);
- a split library keeps its host code, its `.hip_fatbin` zeroed, and gains an ELF section
  `.rocm_kpack_ref`: MessagePack with `kpack_search_paths`, paths relative to the library with `@GFXARCH@`
  standing for the processor the runtime loads code for, and `kernel_name`, the library's key in the TOC;
- the archives sit in a `.kpack/` folder at the top of the package that owns the library
  (`torch/.kpack/torch_gfx1010.kpack`, `_rocm_sdk_libraries/.kpack/blas_lib_gfx1010.kpack`); the device
  wheels (`amd-torch-device-gfx1010`, `rocm-sdk-device-gfx1010`) are what install them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core import user_files
from rdna1_kmgr.doctor import msgpack_data

KPACK_MAGIC = b"KPAK"
MARKER_SECTION = ".rocm_kpack_ref"
GFXARCH = "@GFXARCH@"
_TOC_LIMIT = 64 << 20  # a TOC is a few MB at most; more is not a kpack file
_SECTION_LIMIT = 1 << 20


@dataclass(frozen=True)
class KpackArchive:
    path: Path
    group: str
    family: str
    arches: tuple[str, ...]
    binaries: tuple[str, ...]  # the TOC's keys: which libraries' kernels it holds
    kernels: int
    error: str | None = None  # why it could not be read (then the rest is empty)

    def holds_kernels_of(self, library: Path) -> bool:
        """Whether the TOC has kernels for `library` (keys are `<prefix>/<path>`; matched on the file name,
        a soname version allowed on either side)."""
        stem = library.name.split(".so")[0] + ".so"
        return any(Path(key.split("#")[0]).name.startswith(stem) for key in self.binaries)

    def to_json(self) -> dict:
        return {
            "path": str(self.path),
            "group": self.group,
            "family": self.family,
            "arches": list(self.arches),
            "binaries": len(self.binaries),
            "kernels": self.kernels,
            "error": self.error,
        }


@dataclass(frozen=True)
class KpackRef:
    """A split library's marker: where its archives are looked for."""

    library: Path
    search_paths: tuple[str, ...]
    kernel_name: str | None

    def candidates(self, processor: str) -> list[Path]:
        """The archive paths the runtime would try for `processor`."""
        return [(self.library.parent / p.replace(GFXARCH, processor)).resolve() for p in self.search_paths]

    def to_json(self) -> dict:
        return {"library": str(self.library), "search_paths": list(self.search_paths), "kernel_name": self.kernel_name}


def read_archive(path: Path, within: Path | None = None) -> KpackArchive:
    """The header and table of contents of one .kpack file (of a user's venv: only inside `within`)."""
    try:
        with user_files.open_binary(path, within) as handle:
            header = handle.read(16)
            if len(header) < 16 or header[:4] != KPACK_MAGIC:
                return _broken(path, "not a kpack archive (no KPAK header)")
            version, toc_offset = struct.unpack_from("<IQ", header, 4)
            if version != 1:
                return _broken(path, f"kpack format version {version}; this reader knows version 1")
            handle.seek(toc_offset)
            raw = handle.read(_TOC_LIMIT)
        toc = msgpack_data.decode(raw)
    except (OSError, msgpack_data.MsgpackError) as err:
        return _broken(path, str(err))
    if not isinstance(toc, dict):
        return _broken(path, "its table of contents is not a map")
    entries = toc.get("toc")
    if not isinstance(entries, dict):
        entries = {}
    kernels = sum(len(v) for v in entries.values() if isinstance(v, dict))
    arches = tuple(str(a) for a in toc.get("gfx_arches") or ()) or tuple(
        sorted({str(a) for v in entries.values() if isinstance(v, dict) for a in v})
    )
    return KpackArchive(
        path,
        str(toc.get("group_name", "?")),
        str(toc.get("gfx_arch_family", "?")),
        arches,
        tuple(str(k) for k in entries),
        kernels,
    )


def _broken(path: Path, why: str) -> KpackArchive:
    return KpackArchive(path, "?", "?", (), (), 0, why)


def archives_in(folder: Path, within: Path | None = None) -> list[KpackArchive]:
    """Every archive of a `.kpack` folder, by name."""
    if not folder.is_dir():
        return []
    return [read_archive(p, within) for p in sorted(folder.glob("*.kpack")) if p.is_file()]


def marker(library: Path, within: Path | None = None) -> KpackRef | None:
    """The `.rocm_kpack_ref` section of a 64-bit little-endian ELF library, None when it has none (or when the
    library of a user's venv leads out of `within`)."""
    try:
        with user_files.open_binary(library, within) as handle:
            head = handle.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return None
            (shoff,) = struct.unpack_from("<Q", head, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
            if shentsize != 64 or not 0 < shnum < 65535 or shstrndx >= shnum:
                return None
            handle.seek(shoff)
            table = handle.read(shnum * 64)
            if len(table) < shnum * 64:
                return None
            sections = [struct.unpack_from("<IIQQQQ", table, i * 64) for i in range(shnum)]
            names = _section(handle, sections[shstrndx])
            for name_at, _, _, _, offset, size in sections:
                if names[name_at : name_at + len(MARKER_SECTION) + 1] == MARKER_SECTION.encode() + b"\0":
                    return _ref(library, _section(handle, (0, 0, 0, 0, offset, size)))
    except (OSError, struct.error):
        return None
    return None


def _section(handle, header) -> bytes:
    offset, size = header[4], header[5]
    handle.seek(offset)
    return handle.read(min(size, _SECTION_LIMIT))


def _ref(library: Path, data: bytes) -> KpackRef:
    try:
        content = msgpack_data.decode(data)
    except msgpack_data.MsgpackError:
        content = None
    if not isinstance(content, dict):  # a marker whose content is not read: the package's .kpack folder
        return KpackRef(library, (), None)
    paths = content.get("kpack_search_paths") or ()
    name = content.get("kernel_name")
    return KpackRef(library, tuple(str(p) for p in paths if isinstance(p, str)), str(name) if name else None)
