"""What a kernel module file says about itself, read from its ELF sections with no tool installed.

`modinfo` reads the same `.modinfo` section; reading it here keeps the facts a verdict rests on
(vermagic, dependencies, parameters, build id) independent of the host's kmod, and gives the build id,
which modinfo does not show. Compressed modules (.ko.xz, .ko.gz, .ko.zst) are decompressed the way
modverify does it.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.core.files import sha256_file
from rdna1_kmgr.modbuild.module_checks import read_module

_SUFFIXES = (".ko", ".ko.xz", ".ko.gz", ".ko.zst")


@dataclass(frozen=True)
class ModuleFile:
    path: Path
    sha256: str
    name: str  # the module's own name (.modinfo `name=`), e.g. amdgpu
    vermagic: str
    depends: tuple[str, ...]
    parameters: tuple[str, ...]  # names from `parm=` / `parmtype=`
    build_id: str | None  # hex of the .note.gnu.build-id note, as /sys/module/<name>/notes shows it
    srcversion: str | None
    signed: bool  # carries an appended module signature
    texts: frozenset[str]  # those of the `texts` asked for that the module's bytes hold

    @property
    def release(self) -> str:
        """The kernel release the module was built for: vermagic's first word."""
        return self.vermagic.split(" ", 1)[0]


def read(path: Path, texts: tuple[str, ...] = ()) -> ModuleFile:
    """Read a module file. `texts` (printk formats, say) are looked for in its bytes: see `ModuleFile.texts`."""
    path = Path(path)
    if not path.is_file() or not path.name.endswith(_SUFFIXES):
        raise UsageError(f"{str(path)!r} is not a kernel module file", "give the path of a built .ko")
    if path.stat().st_size == 0:
        raise UsageError(f"{str(path)!r} is empty", "rebuild the module")
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as raw:
        # An unstripped amdgpu.ko is ~350 MB: map it rather than read it whole.
        data = raw if path.suffix == ".ko" else read_module(path)
        return _parse(path, sha256_file(path), data, texts)


def _parse(path: Path, sha256: str, data, texts: tuple[str, ...]) -> ModuleFile:
    try:
        sections = _sections(data)
    except (struct.error, ValueError) as err:
        raise UsageError(f"{str(path)!r} is not a valid ELF kernel module ({err})", "rebuild it") from None
    if ".modinfo" not in sections:
        raise UsageError(f"{str(path)!r} has no .modinfo section", "it is not a kernel module; rebuild it")
    info = _modinfo(sections[".modinfo"])
    note = sections.get(".note.gnu.build-id")
    return ModuleFile(
        path=path,
        sha256=sha256,
        name=_first(info, "name") or path.name.split(".", 1)[0],
        vermagic=_first(info, "vermagic") or "",
        depends=tuple(d for d in (_first(info, "depends") or "").split(",") if d),
        parameters=tuple(dict.fromkeys(v.split(":", 1)[0] for k in ("parm", "parmtype") for v in info.get(k, ()))),
        build_id=_build_id(note) if note else None,
        srcversion=_first(info, "srcversion"),
        signed=data[-28:] == b"~Module signature appended~\n",
        texts=frozenset(t for t in texts if data.find(t.encode()) >= 0),
    )


def note_build_id(note: bytes) -> str | None:
    """The build id in a raw ELF note, as found in a section or in /sys/module/*/notes/.note.gnu.build-id."""
    return _build_id(note)


_WANTED = (".modinfo", ".note.gnu.build-id")


def _sections(data) -> dict[str, bytes]:
    """Name -> contents of the sections in _WANTED of a 64-bit little-endian ELF file (x86-64 modules)."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx]
    names = data[strtab[4] : strtab[4] + strtab[5]]
    sections = {}
    for name_off, sh_type, _flags, _addr, offset, size, *_ in headers:
        name = names[name_off : names.index(b"\0", name_off)].decode(errors="replace")
        if name in _WANTED and sh_type != 8:  # SHT_NOBITS has no bytes in the file
            if offset + size > len(data):
                raise ValueError(f"section {name} runs past the end of the file")
            sections[name] = data[offset : offset + size]
    return sections


def _modinfo(section: bytes) -> dict[str, list[str]]:
    info: dict[str, list[str]] = {}
    for entry in section.split(b"\0"):
        key, sep, value = entry.decode(errors="replace").partition("=")
        if sep:
            info.setdefault(key, []).append(value)
    return info


def _first(info: dict[str, list[str]], key: str) -> str | None:
    values = info.get(key)
    return values[0] if values else None


def _build_id(note: bytes) -> str | None:
    """An ELF note: namesz, descsz, type, then the name and the descriptor, each padded to 4 bytes."""
    if len(note) < 12:
        return None
    namesz, descsz, note_type = struct.unpack_from("<III", note, 0)
    start = 12 + ((namesz + 3) & ~3)
    if note_type != 3 or note[12 : 12 + namesz].rstrip(b"\0") != b"GNU":  # NT_GNU_BUILD_ID
        return None
    return note[start : start + descsz].hex() or None
