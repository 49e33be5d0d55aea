"""Reading GPU targets out of files: offload bundles, compressed bundles, AMDGPU ELF code objects.

The bytes are made here, by the formats' rules (clang's offload bundler: magic, entry count, offset/size/id
per entry; CCOB: magic, version, method, sizes, hash, stream); Debian's real libraries are read by
test_doctor_debian.py.
"""

import struct
import zlib

import pytest
from doctor_checks import GFX1030, HOST, bundle

from rdna1_kmgr.doctor import code_objects

GFX1010 = "hipv4-amdgcn-amd-amdhsa--gfx1010"


def compressed(inner: bytes, method: int, version: int) -> bytes:
    if method == 0:
        stream = zlib.compress(inner)
    else:
        zstandard = pytest.importorskip("zstandard")
        stream = zstandard.ZstdCompressor().compress(inner)
    if version == 2:
        head = struct.pack("<HHII", version, method, 24 + len(stream), len(inner))
    else:
        head = struct.pack("<HHQQ", version, method, 32 + len(stream), len(inner))
    return b"CCOB" + head + struct.pack("<Q", 0x1234) + stream


def amdgpu_elf(mach: int) -> bytes:
    ident = b"\x7fELF" + bytes([2, 1, 1, 64, 3]) + b"\0" * 7
    return ident + struct.pack("<HHIQQQIHHHHHH", 3, code_objects.EM_AMDGPU, 1, 0, 0, 0, mach, 64, 0, 0, 64, 0, 0)


def test_bundles_inside_a_library_are_found_and_counted(tmp_path):
    lib = tmp_path / "librocblas.so.4"
    lib.write_bytes(b"\x7fELF" + b"\1" * 4000 + bundle(HOST, GFX1010, GFX1030) + b"\2" * 100 + bundle(HOST, GFX1030))
    found = code_objects.scan_binary(lib)
    assert found.bundles == 2
    assert found.targets == {"gfx1010": 1, "gfx1030": 2}
    assert found.has("gfx1010") and not found.has("gfx1100")


def test_the_magic_as_a_constant_in_code_is_not_a_bundle(tmp_path):
    # The HIP runtime holds the magic as a string it compares against: a count and entries that make no sense.
    lib = tmp_path / "libamdhip64.so.6"
    lib.write_bytes(b"\1" * 100 + code_objects.BUNDLE_MAGIC + b"\xff" * 40 + b"CCOB" + b"\x01\x00\x07\x00" + b"\0" * 40)
    found = code_objects.scan_binary(lib)
    assert (found.bundles, found.compressed, dict(found.targets)) == (0, 0, {})


@pytest.mark.parametrize("method,version", [(0, 2), (1, 2), (1, 3)])
def test_compressed_bundles_are_inflated_far_enough_to_read_their_ids(tmp_path, method, version):
    lib = tmp_path / "libtorch_hip.so"
    lib.write_bytes(
        b"\1" * 333
        + compressed(
            bundle(HOST, GFX1030, "hip-amdgcn-amd-amdhsa-gfx1010:xnack-", payload=b"\7" * 200_000), method, version
        )
    )
    found = code_objects.scan_binary(lib)
    assert found.compressed == 1 and not found.unreadable
    assert found.targets == {"gfx1030": 1, "gfx1010": 1}


def test_a_damaged_compressed_bundle_is_reported_not_guessed(tmp_path):
    blob = bytearray(compressed(bundle(HOST, GFX1010), 0, 2))
    blob[30:40] = b"\0" * 10  # inside the zlib stream
    lib = tmp_path / "lib.so"
    lib.write_bytes(bytes(blob))
    found = code_objects.scan_binary(lib)
    assert found.compressed == 1 and found.unreadable and not found.targets


def test_bare_code_objects_are_read_from_their_elf_flags(tmp_path):
    obj = tmp_path / "Kernels.so-000-gfx1030.hsaco"  # a name that lies: the content decides
    obj.write_bytes(amdgpu_elf(0x033) + b"\0" * 100)
    assert code_objects.scan_binary(obj).targets == {"gfx1010": 1}
    x86 = tmp_path / "x86.so"
    x86.write_bytes(b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8 + struct.pack("<HH", 3, 62) + b"\0" * 60)
    assert not code_objects.scan_binary(x86).targets


@pytest.mark.parametrize(
    "value,name", [(100100, "gfx1010"), (100300, "gfx1030"), (90010, "gfx90a"), (110001, "gfx1101"), (80003, "gfx803")]
)
def test_kfd_target_versions_name_the_processor(value, name):
    assert code_objects.from_kfd_version(value) == name


def test_generic_code_runs_on_its_family_only():
    assert code_objects.runs_on("gfx10-1-generic", "gfx1010")
    assert code_objects.runs_on("gfx1010:xnack-", "gfx1010")
    assert not code_objects.runs_on("gfx10-3-generic", "gfx1010")
    assert not code_objects.runs_on("gfx1030", "gfx1010")


def test_target_names_in_file_names():
    assert code_objects.targets_in_name("TensileLibrary_Type_SS_Contraction_l_Alik_Bljk_Cijk_Dijk_gfx90a.co") == [
        "gfx90a"
    ]
    assert code_objects.targets_in_name("Kernels.so-000-gfx1010.hsaco") == ["gfx1010"]
    assert code_objects.targets_in_name("gfx10-1-generic.kdb") == ["gfx10-1-generic"]
    assert code_objects.targets_in_name("librocblas.so.4") == []


def zstd_rle_bomb(blocks: int) -> bytes:
    """A zstd frame written by RFC 8878's rules: magic, a header with a 128 KiB window and no content size, then
    RLE blocks (3-byte header: last-block bit, type 1, size << 3; then the one byte repeated): 4 bytes each
    standing for 128 KiB of zeros."""
    block = 128 * 1024
    frame = bytearray(b"\x28\xb5\x2f\xfd" + bytes([0x00, (17 - 10) << 3]))
    for n in range(blocks):
        frame += ((block << 3) | (1 << 1) | (n == blocks - 1)).to_bytes(3, "little") + b"\0"
    return bytes(frame)


def test_a_zstd_bomb_is_read_only_as_far_as_a_bundle_header_and_said_in_one_line(tmp_path):
    """Issue 40: a few KB of zstd in a user's venv made doctor, as root, inflate all of it (here 256 MiB; the
    same trick in 1 MiB is 32 GiB). Only the head a bundle header needs is inflated, and the bomb is one line."""
    tracemalloc = pytest.importorskip("tracemalloc")
    zstandard = pytest.importorskip("zstandard")
    stream = zstd_rle_bomb(2048)
    assert len(stream) < 10_000
    with zstandard.ZstdDecompressor().stream_reader(stream) as reader:  # the frame is valid zstd: zeros
        assert reader.read(1 << 20) == b"\0" * (1 << 20)
    lib = tmp_path / "libtorch_hip.so"
    at = 333
    lib.write_bytes(b"\1" * at + b"CCOB" + struct.pack("<HHQQQ", 3, 1, 32 + len(stream), 1 << 40, 0) + stream)
    tracemalloc.start()
    try:
        found = code_objects.scan_binary(lib)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found.compressed == 1 and not found.targets
    assert found.unreadable == [f"compressed bundle at offset {at}: no bundle header inside"]
    assert peak < 8 << 20, f"{peak} bytes allocated to read it"
