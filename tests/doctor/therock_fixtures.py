"""TheRock's multi-arch PyTorch install, written at test time from its documented layout; nothing of it is
copied or committed.

Layout (ROCm/TheRock: RELEASES.md, docs/packaging/python_packaging.md, docs/rfcs/RFC0008 and the
multi-arch packaging design): in site-packages, `torch/lib/libtorch_hip.so` host-only with a
`.rocm_kpack_ref` ELF section, its kernels in `torch/.kpack/torch_<gfx>.kpack` (from
`amd-torch-device-<gfx>`); ROCm in `_rocm_sdk_core/lib` (libamdhip64) and `_rocm_sdk_libraries/lib`
(librocblas, libhipblaslt, libMIOpen), the libraries' kernels in `_rocm_sdk_libraries/.kpack/blas_lib_<gfx>.kpack`
and `lib/rocblas/library/*_<gfx>.*` (from `rocm-sdk-device-<gfx>`); versions in `*.dist-info/METADATA`.
The .kpack format (rocm-kpack's packed_kernel_archive): `KPAK`, u32 version 1, u64 TOC offset, blobs
aligned to 64 bytes, a MessagePack TOC. The marker: MessagePack with `kpack_search_paths` (relative to the
library, `@GFXARCH@` for the processor) and `kernel_name`. The MessagePack and ELF writers below are the
tests' own, from the public specifications, independent of the code under test.
"""

from __future__ import annotations

import struct
from pathlib import Path

EM_AMDGPU = 224
# LLVM's EF_AMDGPU_MACH values (llvm/BinaryFormat/ELF.h, AMDGPUUsage "AMDGPU ELF Header")
MACH = {"gfx1010": 0x033, "gfx1030": 0x036, "gfx1100": 0x041}


def msgpack(value) -> bytes:
    """MessagePack for str, bytes, int >= 0, bool, None, list and dict (spec.md of msgpack/msgpack)."""
    if value is None:
        return b"\xc0"
    if value is True or value is False:
        return b"\xc3" if value else b"\xc2"
    if isinstance(value, int):
        if value < 128:
            return bytes([value])
        return b"\xce" + struct.pack(">I", value) if value < 1 << 32 else b"\xcf" + struct.pack(">Q", value)
    if isinstance(value, str):
        raw = value.encode()
        return (bytes([0xA0 | len(raw)]) if len(raw) < 32 else b"\xda" + struct.pack(">H", len(raw))) + raw
    if isinstance(value, bytes):
        return b"\xc5" + struct.pack(">H", len(value)) + value
    if isinstance(value, list):
        return (bytes([0x90 | len(value)]) if len(value) < 16 else b"\xdc" + struct.pack(">H", len(value))) + b"".join(
            msgpack(v) for v in value
        )
    if isinstance(value, dict):
        head = bytes([0x80 | len(value)]) if len(value) < 16 else b"\xde" + struct.pack(">H", len(value))
        return head + b"".join(msgpack(k) + msgpack(v) for k, v in value.items())
    raise TypeError(value)


def kpack_archive(path: Path, group: str, arch: str, binaries: list[str]) -> Path:
    """One archive with one (fake, uncompressed) kernel per binary for `arch`."""
    blobs, toc, offset = b"", {}, 64
    for ordinal, binary in enumerate(binaries):
        kernel = b"\x7fELF" + bytes(60)
        blobs += kernel
        toc[binary] = {arch: {"type": "hsaco", "ordinal": ordinal, "original_size": len(kernel)}}
    table = {
        "format_version": 1,
        "group_name": group,
        "gfx_arch_family": arch,
        "gfx_arches": [arch],
        "compression_scheme": "none",
        "blobs": [{"offset": offset + 64 * i, "size": 64} for i in range(len(binaries))],
        "toc": toc,
    }
    body = blobs
    header = b"KPAK" + struct.pack("<IQ", 1, offset + len(body))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + bytes(offset - len(header)) + body + msgpack(table))
    return path


def elf_library(path: Path, marker: dict | None = None, payload: bytes = b"") -> Path:
    """A 64-bit little-endian x86-64 shared object with section headers: a null section, `.text`
    (`payload`), `.rocm_kpack_ref` (MessagePack of `marker`) when given, and `.shstrtab`."""
    sections = [(".text", payload or b"\x90" * 16)]
    if marker is not None:
        sections.append((".rocm_kpack_ref", msgpack(marker)))
    names = b"\0" + b"".join(n.encode() + b"\0" for n, _ in sections) + b".shstrtab\0"
    data, offsets, pos = b"", [], 64
    for _, content in sections:
        offsets.append(pos + len(data))
        data += content
    strtab_at = pos + len(data)
    data += names
    shoff = pos + len(data)
    header = (
        b"\x7fELF"
        + bytes([2, 1, 1])
        + bytes(9)
        + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(sections) + 2, len(sections) + 1)
    )
    table = bytes(64)
    name_at = 1
    for (name, content), offset in zip(sections, offsets, strict=False):
        table += struct.pack("<IIQQQQIIQQ", name_at, 1, 2, 0, offset, len(content), 0, 0, 1, 0)
        name_at += len(name) + 1
    table += struct.pack("<IIQQQQIIQQ", name_at, 3, 0, 0, strtab_at, len(names), 0, 0, 1, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + data + table)
    return path


def code_object(path: Path, arch: str) -> Path:
    """A bare AMDGPU code object header (what Tensile's .co files are)."""
    head = (
        b"\x7fELF" + bytes([2, 1, 1, 0x40]) + bytes(8) + struct.pack("<HHIQQQI", 3, EM_AMDGPU, 1, 0, 0, 0, MACH[arch])
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(head + bytes(64))
    return path


def dist_info(site: Path, name: str, version: str) -> None:
    folder = site / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nREADME\n")


def therock_venv(
    venv: Path,
    rocm: str = "7.13.0a20260601",
    torch: str = "2.11.0+rocm7.13.0a20260601",
    device: str | None = "gfx1010",
    host_arches: tuple[str, ...] = ("gfx1100",),
) -> Path:
    """A venv with TheRock's torch, torchvision and ROCm SDK host wheels, the device wheels for `device`
    (None: none) and for `host_arches` (other GPUs' device wheels, installed too). Returns site-packages."""
    site = venv / "lib/python3.12/site-packages"
    (venv / "pyvenv.cfg").parent.mkdir(parents=True, exist_ok=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (site / "torch").mkdir(parents=True)
    (site / "torch/version.py").write_text(f"__version__ = '{torch}'\ndebug = False\ncuda = None\nhip = '{rocm}'\n")
    elf_library(
        site / "torch/lib/libtorch_hip.so",
        {"kpack_search_paths": ["../.kpack/torch_@GFXARCH@.kpack"], "kernel_name": "torch/lib/libtorch_hip.so"},
    )
    elf_library(site / "_rocm_sdk_core/lib/libamdhip64.so.7")
    libs = site / "_rocm_sdk_libraries/lib"
    elf_library(
        libs / "librocblas.so.5",
        {"kpack_search_paths": ["../.kpack/blas_lib_@GFXARCH@.kpack"], "kernel_name": "rocblas/lib/librocblas.so.5"},
    )
    elf_library(
        libs / "libhipblaslt.so.1",
        {
            "kpack_search_paths": ["../.kpack/blas_lib_@GFXARCH@.kpack"],
            "kernel_name": "hipblaslt/lib/libhipblaslt.so.1",
        },
    )
    elf_library(libs / "libMIOpen.so.1")
    for name, version in (
        ("torch", torch),
        ("torchvision", "0.26.0+rocm" + rocm),
        ("rocm", rocm),
        ("rocm-sdk-core", rocm),
        ("rocm-sdk-libraries", rocm),
    ):
        dist_info(site, name, version)
    for arch in ((device,) if device else ()) + host_arches:
        device_wheels(site, arch, torch, rocm, hipblaslt=arch != "gfx1010")
    return site


def device_wheels(site: Path, arch: str, torch: str, rocm: str, hipblaslt: bool) -> None:
    """What amd-torch-device-<arch> and rocm-sdk-device-<arch> install (TheRock builds no gfx101X hipBLASLt)."""
    kpack_archive(site / f"torch/.kpack/torch_{arch}.kpack", "torch", arch, ["torch/lib/libtorch_hip.so"])
    binaries = ["rocblas/lib/librocblas.so.5"] + (["hipblaslt/lib/libhipblaslt.so.1"] if hipblaslt else [])
    kpack_archive(site / f"_rocm_sdk_libraries/.kpack/blas_lib_{arch}.kpack", "blas_lib", arch, binaries)
    code_object(site / f"_rocm_sdk_libraries/lib/rocblas/library/TensileLibrary_lazy_{arch}.co", arch)
    (site / f"_rocm_sdk_libraries/lib/rocblas/library/TensileLibrary_lazy_{arch}.dat").write_bytes(b"\0" * 8)
    dist_info(site, f"amd-torch-device-{arch}", torch)
    dist_info(site, f"rocm-sdk-device-{arch}", rocm)
