"""The renderer on real Debian kernel sources: the series applies with `patch -p1`, and for 6.1 and 6.12
the patched tree builds the whole amdgpu module with kbuild against Debian's headers."""

import os
import re
import shutil
import subprocess

import pytest
from kernel_style import derived_tree, patched_copy

from rdna1_kmgr.render.manifest import Manifest
from rdna1_kmgr.render.patch_series import render

AMD = "drivers/gpu/drm/amd"
pytestmark = pytest.mark.realsource


@pytest.mark.parametrize(
    "fixture, major_minor, variant",
    [
        ("real_source_61", "6.1", "kfd-picks-mtype"),
        ("real_source_612", "6.12", "gmc-picks-mtype"),
        ("real_source_72", "7.2", "vm-flags"),
    ],
)
def test_series_applies_to_the_real_source(request, tmp_path, fixture, major_minor, variant):
    source = request.getfixturevalue(fixture)
    before = (source / AMD / "amdgpu/gmc_v10_0.c").read_bytes()
    manifest = render(source, tmp_path / "out")
    assert manifest.kernel_version.startswith(major_minor + ".")
    assert {q.id: q.variant for q in manifest.quirks}["coarse-mtype"] == variant

    tree = patched_copy(source, tmp_path / "out", tmp_path / "linux")
    gmc = (tree / AMD / "amdgpu/gmc_v10_0.c").read_text()
    pte = gmc[gmc.index("static void gmc_v10_0_get_vm_pte(") :]
    pte = pte[: pte.index("\n}\n") + 3]
    if variant == "kfd-picks-mtype":  # up to 6.1 KFD's own choice is hooked, get_vm_pte stays stock
        assert "rdna1" not in pte
        gpuvm = (tree / AMD / "amdgpu/amdgpu_amdkfd_gpuvm.c").read_text()
        assert "mapping_flags = amdgpu_rdna1_kfd_mapping_flags(adev, mem, mapping_flags);" in gpuvm
    else:  # the last word, after the stock UC override
        assert re.search(
            r"MTYPE_UC\);\n\n\t/\* rdna1-kmgr: .*\*/\n\tamdgpu_rdna1_pte_mtype\(adev, [^;]*flags\);\n}\n$", pte
        ), pte
    mem_info = (tree / AMD / "amdgpu/amdgpu_amdkfd.c").read_text()
    assert "\tamdgpu_rdna1_local_mem_info(adev, mem_info);\n" in mem_info
    # cwsr-size: 6.12's KFD checks the CWSR mapping's exact size (kfd_queue.c, read by hand); 6.1's has no
    # such check, so there is nothing to fix and the quirk is left out, not refused
    queue = (tree / AMD / "amdkfd/kfd_queue.c").read_text()
    if major_minor == "6.1":
        assert [q.id for q in manifest.left_out] == ["cwsr-size", "topology-sizes"] and "rdna1" not in queue
    else:
        assert {q.id: q.variant for q in manifest.quirks}["cwsr-size"] == "exact-size"
        assert re.search(
            r"\ttotal_cwsr_size = amdgpu_rdna1_cwsr_size\(pdd, topo_dev, properties, vm,\n"
            r"\t+ *total_cwsr_size\);\n\n"
            r"\terr = kfd_queue_buffer_get\(vm, \(void \*\)properties->ctx_save_restore_area_address,",
            queue,
        ), queue
        # the release path is not touched: it keeps KFD's size, as the SVM acquire does
        release = queue[queue.index("int kfd_queue_release_buffers(") :]
        assert "rdna1" not in release[: release.index("\n}\n")]
        # Debian's 6.12 (from 6.12.64) and 7.x print cwsr_size and ctl_stack_size (8fc2796dea6f): upstream's fix
        (sizes,) = [q for q in manifest.left_out if q.id == "topology-sizes"]
        assert sizes.why.startswith("the kernel already prints cwsr_size and ctl_stack_size")
        assert "rdna1" not in (tree / AMD / "amdkfd/kfd_topology.c").read_text()
    assert (tree / AMD / "amdgpu/amdgpu_rdna1.c").is_file()
    # the cache was not touched
    assert (source / AMD / "amdgpu/gmc_v10_0.c").read_bytes() == before
    assert not (source / AMD / "amdgpu/amdgpu_rdna1.c").exists()


def test_real_source_without_get_vm_pte_is_refused(real_source_612, tmp_path):
    tree = tmp_path / "linux"
    shutil.copytree(real_source_612, tree, copy_function=os.link)
    gmc = tree / AMD / "amdgpu/gmc_v10_0.c"
    text = gmc.read_text().replace("gmc_v10_0_get_vm_pte", "gmc_v10_0_pte_flags")
    gmc.unlink()  # break the hard link before writing
    gmc.write_text(text)
    from click.testing import CliRunner

    from rdna1_kmgr.cli import main

    # coarse-mtype asked for by id must fit (by default, being opt-in, it would be left out)
    result = CliRunner().invoke(
        main, ["render", "--source", str(tree), "--out", str(tmp_path / "out"), "--quirk", "coarse-mtype"]
    )
    assert result.exit_code != 0
    assert "gmc_v10_0.c" in result.stderr and "gmc_v10_0_get_vm_pte" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def apply_with_git(out, tree):
    """`git apply` each patch of the series in a copy whose patched files are its own (git apply must not
    write through the hard links into the cache)."""
    for name in (out / "series").read_text().split():
        text = (out / name).read_text(errors="surrogateescape")
        for rel in re.findall(r"^\+\+\+ b/(\S+)", text, re.M):
            path = tree / rel
            if path.exists():
                data = path.read_bytes()
                path.unlink()
                path.write_bytes(data)
        done = subprocess.run(
            ["git", "apply", "-p1", "--whitespace=nowarn", str(out / name)], cwd=tree, capture_output=True, text=True
        )
        assert done.returncode == 0, f"{name}: {done.stderr}"


HOOKED = [
    f"{AMD}/amdgpu/amdgpu_drv.c",
    f"{AMD}/amdgpu/gmc_v10_0.c",
    f"{AMD}/amdgpu/amdgpu_amdkfd_gpuvm.c",
    f"{AMD}/amdgpu/amdgpu_amdkfd.c",
    f"{AMD}/amdgpu/Makefile",
    f"{AMD}/amdgpu/amdgpu_trace.h",
    f"{AMD}/amdgpu/amdgpu.h",
]


def test_real_source_with_crlf_files_renders_a_series_both_tools_apply(real_source_61, tmp_path):
    crlf = {rel: (lambda data: data.replace(b"\n", b"\r\n")) for rel in HOOKED}
    tree = derived_tree(real_source_61, tmp_path / "linux", crlf)
    render(tree, tmp_path / "out")
    patched_copy(tree, tmp_path / "out", tmp_path / "by-patch")
    apply_with_git(tmp_path / "out", tree)
    for rel in HOOKED:
        a, b = (tmp_path / "by-patch" / rel).read_bytes(), (tree / rel).read_bytes()
        assert a == b, rel
        assert b.count(b"\n") == b.count(b"\r\n"), f"{rel}: a line lost its CR"
    assert b"\tamdgpu_rdna1_probe(adev);\r\n" in (tree / HOOKED[0]).read_bytes()


def test_real_driver_under_an_older_version_number_gets_the_variant_of_its_code(real_source_612, tmp_path):
    """A "backport" tree: Linux 6.12's driver under a 5.14 top Makefile, as RHEL 9 ships it."""

    def as_5_14(data):
        data = re.sub(rb"^PATCHLEVEL = \d+", b"PATCHLEVEL = 14", data, flags=re.M)
        return re.sub(rb"^VERSION = \d+", b"VERSION = 5", data, flags=re.M)

    tree = derived_tree(real_source_612, tmp_path / "linux", {"Makefile": as_5_14})
    manifest = render(tree, tmp_path / "out")
    assert manifest.kernel_version.startswith("5.14.")
    assert {q.id: q.variant for q in manifest.quirks} == {
        "coarse-mtype": "gmc-picks-mtype",
        "crat-mem": "largebar-debug-mask",
        "cwsr-size": "exact-size",
    }
    patched = patched_copy(tree, tmp_path / "out", tmp_path / "patched")
    assert (
        "\tamdgpu_rdna1_local_mem_info(adev, mem_info);\n\n\tmem_info->vram_width = adev->gmc.vram_width;\n"
        in (patched / AMD / "amdgpu/amdgpu_amdkfd.c").read_text()
    )
    assert "ctx->adev->debug_largebar = " in (patched / AMD / "amdgpu/amdgpu_rdna1.c").read_text()


def test_real_source_with_the_5_10_probe_statement_renders(real_source_61, tmp_path):
    """5.10.y called amdgpu_driver_load_kms(adev, ent->driver_data) for most of its life."""

    def older_probe(data):
        new = data.replace(
            b"ret = amdgpu_driver_load_kms(adev, flags);", b"ret = amdgpu_driver_load_kms(adev, ent->driver_data);"
        )
        assert new != data
        return new

    tree = derived_tree(real_source_61, tmp_path / "linux", {HOOKED[0]: older_probe})
    render(tree, tmp_path / "out")
    drv = (patched_copy(tree, tmp_path / "out", tmp_path / "patched") / HOOKED[0]).read_text()
    assert re.search(r"amdgpu_rdna1_probe\(adev\);\n\n\tret = amdgpu_driver_load_kms\(adev, ent->driver_data\);", drv)


def test_a_variant_using_a_member_the_real_tree_lacks_is_refused_in_a_second(real_source_612, tmp_path, monkeypatch):
    """The 5.10 - 5.16 crat-mem code (its self-test reaches the device through a struct kgd_dev) on a driver
    that has no kgd at all, chosen by facts too loose to tell: the name check refuses it."""
    from click.testing import CliRunner

    from rdna1_kmgr.cli import main
    from rdna1_kmgr.render import quirk_catalog

    kmod = tmp_path / "kmod"
    shutil.copytree(quirk_catalog.kmod_root(), kmod)
    toml = kmod / "quirks/crat-mem/quirk.toml"
    text = toml.read_text()
    text = (
        text[: text.index("[[variants]]")]
        + """[[variants]]
id = "kgd"
kernels = "5.10 - 5.16"
edits = ["local-mem-info"]
vars = { largebar_forced = "debug_largebar", kfd_node = "kfd_dev", mem_info_xcp = false, kgd = true, mem_info_cached = false }
facts = [{ file = "drivers/gpu/drm/amd/amdgpu/amdgpu_amdkfd.c", function = "amdgpu_amdkfd_get_local_mem_info", contains = "mem_info" }]
"""
    )
    toml.write_text(text)
    monkeypatch.setattr(quirk_catalog, "kmod_root", lambda: kmod)
    result = CliRunner().invoke(main, ["render", "--source", str(real_source_612), "--out", str(tmp_path / "out")])
    assert result.exit_code != 0
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "`kgd` (a struct member, in drivers/gpu/drm/amd/amdgpu/amdgpu_rdna1.c)" in result.stderr
    assert not (tmp_path / "out").exists()


# Issue 37: cwsr-size follows upstream. Debian's 6.12 kfd_queue.c, read by hand: kfd_queue_buffer_get refuses a
# BO mapping whose last page is not exactly `user_addr + size - 1`, and kfd_queue_ctx_save_restore_size sizes
# gfx10+ for `cu_num * 32` waves. Where upstream accepts a covering mapping (as its SVM path does) or sizes gfx10
# for simd_per_cu * max_waves_per_simd waves, stock KFD takes ROCm's size: nothing left for the quirk to do.
QUEUE = f"{AMD}/amdkfd/kfd_queue.c"


def replaced(old: bytes, new: bytes):
    def change(data: bytes) -> bytes:
        assert data.count(old) == 1, old
        return data.replace(old, new)

    return change


@pytest.mark.parametrize(
    "old, new, fact",
    [
        (
            b"user_addr + size - 1 != mapping->last",
            b"user_addr + size - 1 > mapping->last",
            "upstream already accepts ROCm's size (a BO mapping that covers KFD's): "
            "kfd_queue.c: kfd_queue_buffer_get() contains `user_addr + size - 1 > mapping->last`",
        ),
        (
            b": cu_num * 32;",
            b": cu_num * props->simd_per_cu * props->max_waves_per_simd;",
            "upstream already sizes the debugger area as ROCm does: "
            "kfd_queue.c contains `props->simd_per_cu * props->max_waves_per_simd`",
        ),
    ],
    ids=["covering-mapping", "sized-for-40-waves"],
)
def test_where_upstream_accepts_rocms_size_cwsr_size_is_left_out_in_one_line(real_source_612, tmp_path, old, new, fact):
    from click.testing import CliRunner

    from rdna1_kmgr.cli import main

    tree = derived_tree(real_source_612, tmp_path / "linux", {QUEUE: replaced(old, new)})
    result = CliRunner().invoke(main, ["render", "--source", str(tree), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.stderr
    left = [line for line in result.stdout.splitlines() if "left out" in line]
    assert left == [
        f"quirk cwsr-size left out: {fact}",
        # Debian's 6.12 prints the two sizes (8fc2796dea6f): no control stack to fix either
        "quirk topology-sizes left out: the kernel already prints cwsr_size and ctl_stack_size (upstream "
        '8fc2796dea6f): kfd_topology.c contains `"ctl_stack_size"`',
    ]
    manifest = Manifest.read(tmp_path / "out" / "manifest.json")
    assert manifest.quirk_ids == ["crat-mem", "coarse-mtype"]  # the rest renders (opt-in, carried)
    patched = patched_copy(tree, tmp_path / "out", tmp_path / "patched")
    assert "rdna1" not in (patched / QUEUE).read_text()
    # nothing on by default is left: the build says so before the compile
    assert manifest.bits_on == ()
    assert any("changes nothing here until you switch an opt-in bit on" in line for line in result.stdout.splitlines())


def test_asking_for_one_quirk_on_6_12_keeps_cwsr_size_and_says_so(real_source_612, tmp_path):
    manifest = render(real_source_612, tmp_path / "out", ["crat-mem"])
    assert manifest.quirk_ids == ["crat-mem", "cwsr-size"]
    assert manifest.bits_on == ("cwsr-size",) and manifest.asked_quirks == ("crat-mem",)
    assert manifest.notes() == [
        "quirk cwsr-size kept: on by default and needed on this kernel (leave it out with --no-quirk cwsr-size)",
        "kernel change needed here: cwsr-size on by default (mask 0x10), from this kernel's own source; whether "
        "your board and ROCm hit it: `rdna1-kmgr doctor`'s queue finding",
    ]
    # leaving it out takes --no-quirk, and says so
    manifest = render(real_source_612, tmp_path / "out2", ["crat-mem"], without=["cwsr-size"])
    assert manifest.quirk_ids == ["crat-mem"] and manifest.declined_quirks == ("cwsr-size",)
    assert manifest.notes()[0] == "quirk cwsr-size left out: as asked (--no-quirk cwsr-size)"
