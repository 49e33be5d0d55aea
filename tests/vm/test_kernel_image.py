"""rdna1_kmgr.vm.kernel_image: the vmlinux a TCG guest boots instead of the bzImage. Synthetic bzImages are laid out
from the boot protocol (Documentation/arch/x86/boot.rst) and the ELF and note formats; the real one is Debian's."""

import lzma
import struct
import subprocess
import zlib

import pytest

from rdna1_kmgr.vm import guest, guest_kernel, kernel_image


def elf_with_note(name: bytes, note_type: int) -> bytes:
    """A 64-bit ELF header, one PT_NOTE program header and the note it points at."""
    desc = struct.pack("<I", 0x1000000)
    note = struct.pack("<III", len(name) + 1, len(desc), note_type) + name + b"\0" * (4 - len(name) % 4) + desc
    header = (
        b"\x7fELF\x02\x01\x01" + b"\0" * 9 + struct.pack("<HHIQQQIHHHHHH", 2, 62, 1, 0, 64, 0, 0, 64, 56, 1, 0, 0, 0)
    )
    phdr = struct.pack("<IIQQQQQQ", 4, 4, 64 + 56, 0, 0, len(note), len(note), 4)
    return header + phdr + note


def bzimage(payload: bytes, version: int = 0x20F) -> bytes:
    """Setup sectors (setup_sects=1: two 512-byte sectors) with the header fields the parser reads, then the payload
    at payload_offset 0 of the protected-mode part, and the 4-byte unpacked size the build appends."""
    setup = bytearray(1024)
    setup[0x1F1] = 1
    setup[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", setup, 0x206, version)
    struct.pack_into("<II", setup, 0x248, 0, len(payload))
    return bytes(setup) + payload + struct.pack("<I", 123456)


@pytest.mark.parametrize(
    "compress",
    [lambda data: lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32), zlib.compress],
    ids=["xz", "zlib-is-not-gzip"],
)
def test_an_xz_payload_with_a_pvh_entry_is_unpacked_and_anything_else_is_left_as_it_is(tmp_path, compress):
    elf = elf_with_note(b"Xen", 18)
    image = tmp_path / "vmlinuz"
    image.write_bytes(bzimage(compress(elf)))
    booted = kernel_image.fastest(image, tmp_path)
    if compress is zlib.compress:  # a raw zlib stream is not a payload compression the kernel builds
        assert booted == image and not (tmp_path / "vmlinux").exists()
    else:
        assert booted == tmp_path / "vmlinux" and booted.read_bytes() == elf


def test_a_gzip_payload_is_unpacked_up_to_its_end(tmp_path):
    elf = elf_with_note(b"Xen", 18)
    packer = zlib.compressobj(wbits=31)
    image = tmp_path / "vmlinuz"
    image.write_bytes(bzimage(packer.compress(elf) + packer.flush()))
    assert kernel_image.fastest(image, tmp_path).read_bytes() == elf


@pytest.mark.parametrize(
    "elf,version",
    [
        (elf_with_note(b"Xen", 17), 0x20F),  # another Xen note: no PVH entry
        (elf_with_note(b"GNU", 18), 0x20F),  # the type, in another namespace
        (elf_with_note(b"Xen", 18), 0x207),  # a boot protocol without payload_offset
    ],
)
def test_a_kernel_qemu_could_not_boot_as_elf_stays_the_bzimage(tmp_path, elf, version):
    image = tmp_path / "vmlinuz"
    image.write_bytes(bzimage(lzma.compress(elf, format=lzma.FORMAT_XZ), version))
    assert kernel_image.fastest(image, tmp_path) == image


def test_a_file_that_is_no_bzimage_stays_as_it_is(tmp_path):
    image = tmp_path / "vmlinuz"
    image.write_bytes(b"MZ" + b"\0" * 4096)
    assert kernel_image.fastest(image, tmp_path) == image
    assert kernel_image.fastest(tmp_path / "missing", tmp_path) == tmp_path / "missing"


@pytest.mark.vm
def test_debians_kernel_unpacks_to_its_vmlinux_with_the_pvh_entry(headers_61, tmp_path):
    from conftest import _using_test_cache

    from rdna1_kmgr.vm import guest_kernel

    with _using_test_cache():
        kernel = guest_kernel.locate(headers_61, fetch=True)
    booted = kernel_image.fastest(kernel.image, tmp_path)
    assert booted == tmp_path / "vmlinux"
    notes = subprocess.run(["readelf", "-n", str(booted)], capture_output=True, text=True, check=True).stdout
    assert "Xen" in notes and "0x00000012" in notes  # XEN_ELFNOTE_PHYS32_ENTRY, as readelf prints it
    assert f"Linux version {headers_61} ".encode() in booted.read_bytes()


@pytest.mark.parametrize("accel", ["tcg", "kvm"])
def test_every_guest_boots_the_vmlinux_under_tcg_and_the_bzimage_under_kvm(tmp_path, accel):
    """GuestRequest.image_to_boot, which the host-root and the plumbing guest both hand QEMU."""
    elf = elf_with_note(b"Xen", 18)
    image = tmp_path / "kernel" / "boot" / "vmlinuz-6.1.0-56-amd64"
    image.parent.mkdir(parents=True)
    image.write_bytes(bzimage(lzma.compress(elf, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32)))
    run = tmp_path / "run"
    run.mkdir()
    kernel = guest_kernel.GuestKernel("6.1.0-56-amd64", tmp_path / "kernel", "cache")
    request = guest.GuestRequest(kernel, run, run / "console.log", accel, 60)
    booted = request.image_to_boot()
    if accel == "tcg":
        assert booted == run / "vmlinux" and booted.read_bytes() == elf  # in the run folder: gone with the run
    else:
        assert booted == image and not (run / "vmlinux").exists()
