"""`install --quirks` and `status` read what the build carries from its render manifest: every bit of its quirks
(on by default or not) may be switched on; a bit of a quirk render left out is refused in one line saying which
and why; status lists both. In process: a Candidate made from a manifest as `render` writes it."""

from pathlib import Path

import pytest
from fake_kernel import make_tree

from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.follow.status import build_quirks, quirks_lines
from rdna1_kmgr.install.install_gate import Candidate
from rdna1_kmgr.install.module_install import default_quirks, with_quirks
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.render.manifest import Manifest
from rdna1_kmgr.render.patch_series import render_series
from rdna1_kmgr.render.quirk_mask import QuirkMask


def manifest_of_6_1(tmp_path) -> Manifest:
    """The manifest `render` writes for a 6.1-shaped tree: crat-mem and coarse-mtype carried (opt-in, off by
    default), cwsr-size (bit 4, 0x10) left out."""
    _, manifest = render_series(make_tree(tmp_path / "linux"))
    return manifest


def candidate(manifest: Manifest) -> Candidate:
    return Candidate(
        dkms.Package(dkms.PACKAGE_NAME, "6.1.192+p0"),
        "6.1.0-56-amd64",
        Path("/nonexistent/amdgpu.ko"),
        "0" * 64,
        default_quirks(manifest),
        manifest,
    )


def test_every_bit_the_build_carries_may_be_switched_on_though_none_is_on_by_default(tmp_path):
    manifest = manifest_of_6_1(tmp_path)
    assert manifest.quirks_mask == QuirkMask(0) and manifest.all_bits_mask == QuirkMask(0xE)
    assert with_quirks(candidate(manifest), QuirkMask(0xE)).parameters["rdna1_quirks"] == "0xe"
    assert with_quirks(candidate(manifest), QuirkMask(0x4)).parameters["rdna1_quirks"] == "0x4"


def test_a_bit_of_a_left_out_quirk_is_refused_in_one_line_naming_it_and_why(tmp_path):
    manifest = manifest_of_6_1(tmp_path)
    with pytest.raises(UsageError) as err:
        with_quirks(candidate(manifest), QuirkMask(0x12))
    line = err.value.what
    assert "\n" not in line
    assert line.startswith("--quirks 0x12: cwsr-size (0x10) was left out of this build: nothing to fix on this kernel")
    assert "kfd_queue" in line
    # a bit no quirk of the catalog has: the plain refusal, with what the build carries
    with pytest.raises(UsageError) as err:
        with_quirks(candidate(manifest), QuirkMask(0x100))
    assert err.value.what == "--quirks 0x100 has bits the build lacks (0x100); it carries 0xe"


def test_a_build_from_before_the_manifest_listed_every_bit_is_checked_against_its_default_mask():
    old = Manifest.from_json({"quirks_mask": 3})
    assert with_quirks(candidate(old), QuirkMask(0x2)).parameters["rdna1_quirks"] == "0x2"
    with pytest.raises(UsageError):
        with_quirks(candidate(old), QuirkMask(0x4))


def test_status_says_what_the_build_carries_and_what_it_left_out(tmp_path):
    quirks = build_quirks(manifest_of_6_1(tmp_path))
    assert quirks["carried"] == ["crat-mem", "coarse-mtype-vram", "coarse-mtype-host"] and quirks["mask"] == 0xE
    assert quirks["default"] == [] and quirks["left_out"][0]["id"] == "cwsr-size"
    lines = quirks_lines(quirks)
    assert lines[0] == "  quirks      carried: crat-mem coarse-mtype-vram coarse-mtype-host (0xe); on by default: none"
    assert lines[1].startswith("              left out: cwsr-size: nothing to fix on this kernel: ")
    assert build_quirks(None) is None and quirks_lines(None) == []
