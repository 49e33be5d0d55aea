"""The renderer on a tiny fake kernel tree: series shape, real `patch`, variants, refusals."""

import dataclasses
import json
import re
import shutil
import subprocess

import pytest
from fake_kernel import AMD, make_tree
from series_checks import apply_series, assert_refused, function_body, run_cli

from rdna1_kmgr.render import quirk_catalog
from rdna1_kmgr.render.patch_series import count_selftest_cases

GMC = f"{AMD}/amdgpu/gmc_v10_0.c"


@pytest.fixture
def tree(tmp_path):
    return make_tree(tmp_path / "linux")


def test_series_applies_with_patch_and_puts_every_hook_in_place(tree, tmp_path):
    out = tmp_path / "out"
    result = run_cli("render", "--source", tree, "--out", out, "--json")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads(result.stdout)
    assert (
        (out / "series").read_text().split()
        == manifest["series"]
        == ["0001-out-of-tree.patch", "0002-rdna1-core.patch", "0003-crat-mem.patch", "0004-coarse-mtype.patch"]
    )
    assert manifest["kernel_version"] == "6.1.192"
    assert manifest["devices"] == ["0x731F"]
    assert [q["id"] for q in manifest["quirks"]] == ["crat-mem", "coarse-mtype"]
    # 6.1's KFD does not check the CWSR size: cwsr-size (the one default-on bit) has nothing to fix and is left
    # out with why; crat-mem and the coarse-mtype classes are opt-in (no evidence yet): no bit on by default
    assert [(b["bit"], b["id"], b["default"]) for b in manifest["bits"]] == [
        (1, "crat-mem", False),
        (2, "coarse-mtype-vram", False),
        (3, "coarse-mtype-host", False),
    ]
    assert manifest["quirks_mask"] == 0 and manifest["all_bits_mask"] == 0xE
    assert manifest["active_by_default"] == []
    # nor the control stack's (topology-sizes)
    assert [q["id"] for q in manifest["left_out"]] == ["cwsr-size", "topology-sizes"]
    assert all(q["why"].startswith("nothing to fix on this kernel: ") for q in manifest["left_out"])
    assert all("kfd_queue.c" in q["why"] for q in manifest["left_out"])
    assert manifest["asked_quirks"] is None

    apply_series(out, tree)
    amdgpu = tree / AMD / "amdgpu"
    # up to 6.1 the hook is in KFD's own choice only; get_vm_pte stays stock
    assert "amdgpu_rdna1_pte_mtype" not in (amdgpu / "gmc_v10_0.c").read_text()
    gpuvm = (amdgpu / "amdgpu_amdkfd_gpuvm.c").read_text()
    kfd = function_body(gpuvm, "get_pte_flags")
    assert kfd.index("amdgpu_rdna1_kfd_mapping_flags(adev, mem, mapping_flags)") < kfd.index("amdgpu_gem_va_map_flags")
    assert "return get_pte_flags(adev, mem);" in function_body(gpuvm, "amdgpu_rdna1_kfd_pte_flags")
    mem_info = function_body((amdgpu / "amdgpu_amdkfd.c").read_text(), "amdgpu_amdkfd_get_local_mem_info")
    hook = mem_info.index("amdgpu_rdna1_local_mem_info(adev, mem_info);")
    assert mem_info.index("local_mem_size_private =") < hook < mem_info.index("mem_info->vram_width =")
    assert "rdna1" not in (tree / AMD / "amdkfd/kfd_priv.h").read_text()
    header = (amdgpu / "amdgpu.h").read_text()
    device = header[header.index("struct amdgpu_device {") : header.index("\n};\n")]
    assert device.rstrip().endswith("u32\t\t\t\trdna1_quirks;")
    init = function_body((amdgpu / "amdgpu_drv.c").read_text(), "amdgpu_init")
    # the hook does not come between the return and the comment explaining it
    assert re.search(r"amdgpu_rdna1_init\(\);\n\n\t/\* let modprobe .*\*/\n\treturn pci_register_driver", init)
    makefile = (amdgpu / "Makefile").read_text()
    assert makefile.index("amdgpu-y += amdgpu_rdna1.o") < makefile.index("obj-$(CONFIG_DRM_AMDGPU)")
    assert "#define TRACE_INCLUDE_PATH .\n" in (amdgpu / "amdgpu_trace.h").read_text()
    for name in ("gmc_v10_0.c", "amdgpu_amdkfd_gpuvm.c", "amdgpu_drv.c"):
        assert (amdgpu / name).read_text().count('#include "amdgpu_rdna1.h"') == 1
    core = (amdgpu / "amdgpu_rdna1.c").read_text()
    assert "module_param_named(rdna1_quirks," in core and "module_param_named(rdna1_selftest," in core
    assert "static uint amdgpu_rdna1_quirks = AMDGPU_RDNA1_DEFAULT;" in core
    header = (amdgpu / "amdgpu_rdna1.h").read_text()
    # no bit of this kernel's series is on by default (cwsr-size, the default-on one, is left out)
    assert "#define AMDGPU_RDNA1_DEFAULT\t(0)" in header
    assert re.search(r"amdgpu_rdna1_ids\[\] = \{\n\t0x731F,\n\};", core)
    assert manifest["selftest_cases"] == count_selftest_cases(core) > 0


def test_same_input_gives_the_same_bytes(tree, tmp_path):
    for out in ("a", "b"):
        assert run_cli("render", "--source", tree, "--out", tmp_path / out).exit_code == 0
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_each_patch_sha256_is_in_the_manifest(tree, tmp_path):
    import hashlib

    out = tmp_path / "out"
    run_cli("render", "--source", tree, "--out", out)
    manifest = json.loads((out / "manifest.json").read_text())
    for name, digest in manifest["patches"].items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
        assert (out / name).read_text().startswith("From: rdna1-kmgr")


# a fact that chose each crat-mem variant, as the manifest and the patch header say it
CRAT_FACT = {
    "kgd": "amdgpu_amdkfd.c: amdgpu_amdkfd_get_local_mem_info() takes `kgd`",
    "largebar-param": "kfd_priv.h contains `struct kfd_local_mem_info local_mem_info;`",
    "largebar-param-local": "kfd_priv.h lacks `struct kfd_local_mem_info local_mem_info;`",
    "largebar-param-xcp": "amdgpu_amdkfd.c: amdgpu_amdkfd_get_local_mem_info() takes `xcp`",
    "largebar-debug-mask": "amdgpu.h contains `debug_largebar`",
}


@pytest.mark.parametrize(
    "version, shape, mtype_variant, crat_variant, kfd_hook",
    [
        ("5.10.262", "5.10", "kfd-picks-mtype-no-uncached", "kgd", True),
        ("6.1.192", "6.1", "kfd-picks-mtype", "largebar-param", True),
        ("6.2.0", "6.2", "gmc-picks-mtype-no-ext", "largebar-param", False),
        ("6.12.95", "6.12", "gmc-picks-mtype", "largebar-debug-mask", False),
        ("6.17.9", "6.12", "gmc-picks-mtype", "largebar-debug-mask", False),
        ("6.18.0-rc1", "6.18", "vm-flags", "largebar-debug-mask", False),
        ("7.3-rc2", "6.18", "vm-flags", "largebar-debug-mask", False),
        # a backport: RHEL 9's top Makefile says 5.14, its driver has the shape of a later release
        ("5.14.0", "6.2", "gmc-picks-mtype-no-ext", "largebar-param", False),
        ("5.14.0", "6.12", "gmc-picks-mtype", "largebar-debug-mask", False),
        ("5.14.0", "6.18", "vm-flags", "largebar-debug-mask", False),
        # and a 5.10 driver under a newer number
        ("6.6.0", "5.10", "kfd-picks-mtype-no-uncached", "kgd", True),
    ],
)
def test_variant_follows_the_facts_of_the_source(tmp_path, version, shape, mtype_variant, crat_variant, kfd_hook):
    tree = make_tree(tmp_path / "linux", version, shape)
    out = tmp_path / "out"
    result = run_cli("render", "--source", tree, "--out", out, "--json")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads(result.stdout)
    assert {q["id"]: q["variant"] for q in manifest["quirks"]} == {
        "coarse-mtype": mtype_variant,
        "crat-mem": crat_variant,
    }
    coarse = (out / "0004-coarse-mtype.patch").read_text()
    assert ("amdgpu_rdna1_kfd_mapping_flags(" in coarse) == kfd_hook
    assert ("amdgpu_rdna1_pte_mtype(adev, " in coarse) == (not kfd_hook)
    # the self-test reaches the device and debug_largebar as this driver does
    core = (out / "0002-rdna1-core.patch").read_text()
    assert ("(struct kgd_dev *)ctx->adev" in core) == (crat_variant == "kgd")
    assert ("ctx->adev->debug_largebar" in core) == (crat_variant == "largebar-debug-mask")
    assert ("amdgpu_amdkfd_get_local_mem_info(ctx->adev, info, NULL);" in core) == (
        crat_variant == "largebar-debug-mask"
    )
    # EXT_COHERENT allocations are kept UC only where KFD knows them; a kernel without the flag (6.2 - 6.7)
    # never sees its name, in the hook's code or the self-test
    ext = mtype_variant in ("gmc-picks-mtype", "vm-flags")
    assert ("RDNA1_KFD(EXT_COHERENT)" in core) == ("AMDGPU_GEM_CREATE_EXT_COHERENT" in core) == ext
    # the same for UNCACHED, which 5.10's KFD does not name
    assert ("RDNA1_KFD(UNCACHED)" in core) == (mtype_variant != "kfd-picks-mtype-no-uncached")
    # the 5.10 - 5.16 KFD keeps no copy of the memory info: the self-test asks into a local as it does
    assert ("&node->local_mem_info" in core) == (crat_variant != "kgd")
    # the manifest and the patch say which facts chose the variant
    facts = {q["id"]: q["facts"] for q in manifest["quirks"]}
    assert CRAT_FACT[crat_variant] in facts["crat-mem"]
    for quirk, patch in (("crat-mem", "0003-crat-mem.patch"), ("coarse-mtype", "0004-coarse-mtype.patch")):
        header = (out / patch).read_text().split("\n---\n")[0]
        for fact in facts[quirk]:  # each on a line of its own, a long one folded
            assert re.search(rf"^  {re.escape(fact.split()[0])} ", header, re.M), (fact, header)
            assert " ".join(fact.split()) in " ".join(header.split()), (fact, header)
    apply_series(out, tree)
    mem_info = function_body((tree / AMD / "amdgpu/amdgpu_amdkfd.c").read_text(), "amdgpu_amdkfd_get_local_mem_info")
    assert mem_info.index("amdgpu_rdna1_local_mem_info(adev, mem_info);") < mem_info.index("mem_info->vram_width =")


def test_no_variant_fits_a_partial_backport_refused_naming_each_failed_fact(tmp_path):
    # get_vm_pte without the UC override while KFD no longer picks UC: a shape no release had
    tree = make_tree(tmp_path / "linux", "5.14.0", "6.1", kfd="default")
    out = tmp_path / "out"
    assert_refused(
        run_cli("render", "--source", tree, "--out", out, "--quirk", "coarse-mtype"),
        out,
        "quirk coarse-mtype: no variant fits",
        "kfd-picks-mtype (first seen in Linux up to 6.1, once KFD names UNCACHED (6.1 read)): amdgpu_amdkfd_gpuvm.c: get_pte_flags() does not contain `AMDGPU_VM_MTYPE_UC`",
        "gmc-picks-mtype (first seen in Linux about 6.8 - 6.17 (6.12 read and built)): gmc_v10_0.c: gmc_v10_0_get_vm_pte() does not contain `AMDGPU_GEM_CREATE_COHERENT`",
        "gmc-picks-mtype-no-ext (first seen in Linux 6.2 - 6.7): gmc_v10_0.c: gmc_v10_0_get_vm_pte() does not contain `AMDGPU_GEM_CREATE_COHERENT`",
        "vm-flags (first seen in Linux 6.18 and later): gmc_v10_0.c: gmc_v10_0_get_vm_pte() does not take `vm_flags`",
    )


def test_no_crat_mem_variant_fits_a_driver_whose_memory_info_takes_neither_kgd_nor_adev(tmp_path):
    tree = make_tree(tmp_path / "linux", "6.1.192", "6.1")
    amdkfd = tree / AMD / "amdgpu/amdgpu_amdkfd.c"
    amdkfd.write_text(amdkfd.read_text().replace("struct amdgpu_device *adev,", "struct amdgpu_device *dev,"))
    out = tmp_path / "out"
    assert_refused(
        run_cli("render", "--source", tree, "--out", out, "--quirk", "crat-mem"),
        out,
        "quirk crat-mem: no variant fits",
        "kgd (first seen in Linux 5.10 - 5.16): amdgpu_amdkfd.c: amdgpu_amdkfd_get_local_mem_info() does not take `kgd`",
        "largebar-param-local (first seen in Linux 5.17 - about 5.19): amdgpu_amdkfd.c: amdgpu_amdkfd_get_local_mem_info() does not take `adev`",
        "largebar-param (first seen in Linux about 6.0 - 6.10): amdgpu_amdkfd.c: amdgpu_amdkfd_get_local_mem_info() does not take `adev`",
        "largebar-param-xcp (first seen in Linux about 6.5 - 6.10 (rendered, not built here)): amdgpu_amdkfd.c: amdgpu_amdkfd_get_local_mem_info() does not take `xcp`",
        "largebar-debug-mask (first seen in Linux 6.11 and later): amdgpu_amdkfd.c: amdgpu_amdkfd_get_local_mem_info() does not take `xcp`",
    )


def test_ubuntu_2404s_shape_kfd_nodes_and_xcp_with_debug_largebar_a_module_parameter(tmp_path):
    # KFD nodes and the xcp parameter, but debug_largebar still only a module parameter (about 6.5 - 6.10)
    tree = make_tree(tmp_path / "linux", "6.8.0", "6.12", largebar="param")
    out = tmp_path / "out"
    result = run_cli("render", "--source", tree, "--out", out, "--json")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads(result.stdout)
    assert {q["id"]: q["variant"] for q in manifest["quirks"]}["crat-mem"] == "largebar-param-xcp"
    core = (out / "0002-rdna1-core.patch").read_text()
    assert "amdgpu_amdkfd_get_local_mem_info(ctx->adev, info, NULL);" in core
    assert "ctx->adev->debug_largebar" not in core and "debug_largebar = " in core
    apply_series(out, tree)


def test_two_variants_whose_facts_both_hold_are_refused_naming_them(tmp_path):
    # get_vm_pte and KFD both half way to 6.18: no kernel has it
    tree = make_tree(tmp_path / "linux", "6.18.0", "6.18", gmc="mapping+vm_flags", kfd="vm+mem")
    out = tmp_path / "out"
    assert_refused(
        run_cli("render", "--source", tree, "--out", out, "--quirk", "coarse-mtype"),
        out,
        "quirk coarse-mtype: the facts of several variants hold",
        "gmc-picks-mtype (gmc_v10_0.c: gmc_v10_0_get_vm_pte() contains `AMDGPU_GEM_CREATE_COHERENT`, ",
        "vm-flags (gmc_v10_0.c: gmc_v10_0_get_vm_pte() takes `vm_flags`, ",
    )


@pytest.mark.parametrize("mem_info, variant", [("kgd", "kgd"), ("adev", "largebar-param-local")])
def test_a_driver_midway_through_the_kgd_removal_gets_the_variant_of_its_memory_info(tmp_path, mem_info, variant):
    # struct kfd_dev has both kgd and adev (and no copy of the memory info yet): what decides is what
    # amdgpu_amdkfd_get_local_mem_info() takes
    tree = make_tree(tmp_path / "linux", "5.16.0", "5.10", mem_info=mem_info, node="kfd_dev+kgd")
    out = tmp_path / "out"
    result = run_cli("render", "--source", tree, "--out", out, "--json")
    assert result.exit_code == 0, result.stderr
    assert {q["id"]: q["variant"] for q in json.loads(result.stdout)["quirks"]}["crat-mem"] == variant
    apply_series(out, tree)
    core = (tree / AMD / "amdgpu/amdgpu_rdna1.c").read_text()
    assert ("node->kgd = (struct kgd_dev *)ctx->adev;" in core) == (variant == "kgd")
    assert ("node->adev = ctx->adev;" in core) == (variant == "largebar-param-local")
    assert "&node->local_mem_info" not in core and "struct kfd_local_mem_info mem_info, *info = &mem_info;" in core


@pytest.mark.parametrize("forms", [dict(probe="driver_data"), dict(init="unwind")])
def test_every_accepted_form_of_a_statement_takes_the_hook(tmp_path, forms):
    tree = make_tree(tmp_path / "linux", **forms)
    out = tmp_path / "out"
    assert run_cli("render", "--source", tree, "--out", out).exit_code == 0
    apply_series(out, tree)
    drv = (tree / AMD / "amdgpu/amdgpu_drv.c").read_text()
    probe, init = function_body(drv, "amdgpu_pci_probe"), function_body(drv, "amdgpu_init")
    assert probe.index("amdgpu_rdna1_probe(adev);") < probe.index("amdgpu_driver_load_kms(")
    assert init.index("amdgpu_rdna1_init();") < init.index("pci_register_driver(")


def test_a_name_the_tree_lacks_is_refused_before_anything_is_written(tmp_path):
    # the 5.10 shape, but this tree's struct kgd_mem has no `is_imported` (coarse-mtype reads it)
    tree = make_tree(tmp_path / "linux", "5.10.100", "5.10", missing_names={"is_imported"})
    out = tmp_path / "out"
    assert_refused(
        run_cli("render", "--source", tree, "--out", out),
        out,
        "`is_imported` (a struct member, in drivers/gpu/drm/amd/amdgpu/amdgpu_rdna1.c)",
    )


def test_uncached_cases_render_only_where_the_tree_names_the_flag_and_the_name_check_sees_through_the_macro(
    tmp_path, monkeypatch
):
    # with the flag (the 6.1 shape) the self-test keeps UNCACHED allocations UC; without it (5.10) it has none
    for shape, uncached in (("6.1", True), ("5.10", False)):
        tree = make_tree(tmp_path / shape, "6.1.192", shape)
        result = run_cli("render", "--source", tree, "--out", tmp_path / f"out-{shape}", "--quirk", "coarse-mtype")
        assert result.exit_code == 0, result.stderr
        core = (tmp_path / f"out-{shape}" / "0002-rdna1-core.patch").read_text()
        assert ("RDNA1_KFD(UNCACHED)" in core) == uncached
    # a variant that rendered them anyway on the tree without the flag is stopped by the name check, as the
    # compiler would stop it (the macro's argument was skipped before)
    catalog = quirk_catalog.load_quirks()
    coarse = catalog["coarse-mtype"]
    variants = tuple(
        dataclasses.replace(v, vars={**v.vars, "uncached": True}) if v.id == "kfd-picks-mtype-no-uncached" else v
        for v in coarse.variants
    )
    catalog["coarse-mtype"] = dataclasses.replace(coarse, variants=variants)
    monkeypatch.setattr(quirk_catalog, "load_quirks", lambda: catalog)
    out = tmp_path / "out"
    assert_refused(
        run_cli("render", "--source", tmp_path / "5.10", "--out", out, "--quirk", "coarse-mtype"),
        out,
        "`KFD_IOC_ALLOC_MEM_FLAGS_UNCACHED` (a name, in drivers/gpu/drm/amd/amdgpu/amdgpu_rdna1.c)",
    )


def rewrite(tree, transform):
    """Apply transform to the bytes of every file of tree."""
    for path in tree.rglob("*"):
        if path.is_file():
            path.write_bytes(transform(path.read_bytes()))


def patched(tmp_path, name, transform, tool):
    """A fake tree with `transform` applied to its files, rendered and patched with `tool`."""
    tree = make_tree(tmp_path / name)
    rewrite(tree, transform)
    out = tmp_path / f"{name}-out"
    result = run_cli("render", "--source", tree, "--out", out)
    assert result.exit_code == 0, result.stderr
    if tool == "patch":
        apply_series(out, tree)
    else:
        for patch in (out / "series").read_text().split():
            done = subprocess.run(
                ["git", "apply", "-p1", "--whitespace=nowarn", str(out / patch)],
                cwd=tree,
                capture_output=True,
                text=True,
            )
            assert done.returncode == 0, f"{patch}: {done.stderr}"
    return {p.relative_to(tree).as_posix(): p.read_bytes() for p in tree.rglob("*") if p.is_file()}


def crlf(data):
    return data.replace(b"\n", b"\r\n")


def no_final_newline(data):
    return data[:-1] if data.endswith(b"\n") else data


@pytest.mark.parametrize("tool", ["patch", "git-apply"])
@pytest.mark.parametrize("transform", [crlf, no_final_newline], ids=["crlf", "no-final-newline"])
def test_line_endings_and_last_lines_survive_and_both_tools_apply(tmp_path, transform, tool):
    """Rendering a transformed tree gives the transformed result of rendering the plain tree (the files
    the series adds are its own, in kernel style)."""
    plain = patched(tmp_path, "plain", lambda data: data, "patch")
    changed = patched(tmp_path, "changed", transform, tool)
    new = {f"{AMD}/amdgpu/amdgpu_rdna1.c", f"{AMD}/amdgpu/amdgpu_rdna1.h"}
    assert {rel: data for rel, data in changed.items() if rel not in new} == {
        rel: transform(data) for rel, data in plain.items() if rel not in new
    }
    assert {rel: changed[rel] for rel in new} == {rel: plain[rel] for rel in new}


def test_trailing_white_space_and_tabs_are_kept(tmp_path):
    tree = make_tree(tmp_path / "linux")
    drv = tree / AMD / "amdgpu/amdgpu_drv.c"
    text = drv.read_bytes().replace(b"\tamdgpu_amdkfd_init();\n", b"\tamdgpu_amdkfd_init();  \t\n")
    drv.write_bytes(text.replace(b"flags);\n", b"flags); \n"))
    out = tmp_path / "out"
    assert run_cli("render", "--source", tree, "--out", out).exit_code == 0
    for patch in (out / "series").read_text().split():
        done = subprocess.run(
            ["git", "apply", "-p1", "--whitespace=nowarn", str(out / patch)], cwd=tree, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
    after = drv.read_bytes()
    assert b"\tamdgpu_amdkfd_init();  \t\n" in after and b"ret = amdgpu_driver_load_kms(adev, flags); \n" in after
    assert b"amdgpu_rdna1_probe(adev);" in after


def test_one_quirk_only(tree, tmp_path):
    out = tmp_path / "out"
    result = run_cli("render", "--source", tree, "--out", out, "--quirk", "crat-mem", "--json")
    manifest = json.loads(result.stdout)
    assert manifest["series"] == ["0001-out-of-tree.patch", "0002-rdna1-core.patch", "0003-crat-mem.patch"]
    assert manifest["quirks_mask"] == 0 and manifest["all_bits_mask"] == 2  # opt-in: carried, off by default
    assert manifest["asked_quirks"] == ["crat-mem"]
    apply_series(out, tree)
    assert "amdgpu_rdna1_pte_mtype" not in (tree / GMC).read_text()
    core = (tree / AMD / "amdgpu/amdgpu_rdna1.c").read_text()
    assert "COARSE_MTYPE" not in core and "default 0x0)" in core


def test_a_class_id_selects_its_quirk(tree, tmp_path):
    result = run_cli("render", "--source", tree, "--out", tmp_path / "out", "--quirk", "coarse-mtype-host", "--json")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads(result.stdout)
    assert [q["id"] for q in manifest["quirks"]] == ["coarse-mtype"]
    assert manifest["quirks_mask"] == 0 and manifest["all_bits_mask"] == 0xC


def test_several_devices(tree, tmp_path):
    out = tmp_path / "out"
    assert run_cli("render", "--source", tree, "--out", out, "--device", "0x7340", "--device", "731f").exit_code == 0
    apply_series(out, tree)
    assert re.search(
        r"amdgpu_rdna1_ids\[\] = \{\n\t0x731F,\n\t0x7340,\n\};", (tree / AMD / "amdgpu/amdgpu_rdna1.c").read_text()
    )


def test_source_without_the_hooked_function_is_refused_with_nothing_written(tmp_path):
    tree = make_tree(tmp_path / "linux", "6.12.95", omit="gmc_v10_0_get_vm_pte")
    out = tmp_path / "out"
    assert_refused(
        run_cli("render", "--source", tree, "--out", out, "--quirk", "coarse-mtype"),
        out,
        "gmc_v10_0.c",
        "gmc_v10_0_get_vm_pte",
    )


def test_an_opt_in_quirk_that_fits_no_variant_is_left_out_with_one_line_and_the_rest_renders(tmp_path):
    tree = make_tree(tmp_path / "linux", "6.1.192", "6.1", omit="gmc_v10_0_get_vm_pte")
    out = tmp_path / "out"
    result = run_cli("render", "--source", tree, "--out", out)
    assert result.exit_code == 0, result.stderr
    said = [line for line in result.stdout.splitlines() if "left out" in line]
    assert said[0].startswith("quirk coarse-mtype left out: opt-in and fits no variant of this source (")
    assert "gmc_v10_0_get_vm_pte() not found" in said[0]
    manifest = json.loads((out / "manifest.json").read_text())
    assert [q["id"] for q in manifest["quirks"]] == ["crat-mem"]
    assert [q["id"] for q in manifest["left_out"]] == ["coarse-mtype", "cwsr-size", "topology-sizes"]
    apply_series(out, tree)


def test_a_kernel_with_nothing_any_asked_quirk_fixes_is_refused_in_one_line(tmp_path):
    tree = make_tree(tmp_path / "linux", "6.1.192", "6.1")
    out = tmp_path / "out"
    assert_refused(
        run_cli("render", "--source", tree, "--out", out, "--quirk", "cwsr-size"),
        out,
        "no quirk to render for this kernel: cwsr-size: nothing to fix on this kernel",
    )


def test_source_without_the_hooked_statement_is_refused(tmp_path):
    tree = make_tree(tmp_path / "linux", omit="amdgpu_driver_load_kms")
    out = tmp_path / "out"
    assert_refused(run_cli("render", "--source", tree, "--out", out), out, "amdgpu_drv.c", "amdgpu_driver_load_kms")


@pytest.mark.parametrize(
    "args, words",
    [
        (["--device", "0x1234"], ["0x1234", "0x731F", "0x7340"]),
        (["--device", "nope"], ["nope"]),
        (["--quirk", "bogus"], ["bogus", "coarse-mtype"]),
    ],
)
def test_bad_options_are_refused(tree, tmp_path, args, words):
    out = tmp_path / "out"
    assert_refused(run_cli("render", "--source", tree, "--out", out, *args), out, *words)


def test_kernel_older_than_5_10_is_refused(tmp_path):
    tree = make_tree(tmp_path / "linux", "5.4.280")
    out = tmp_path / "out"
    assert_refused(run_cli("render", "--source", tree, "--out", out), out, "5.4.280", "5.10")


def test_not_a_kernel_tree_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    assert_refused(run_cli("render", "--source", tmp_path / "empty", "--out", out), out, "Makefile")


def test_an_unrelated_out_folder_is_left_alone(tree, tmp_path):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = run_cli("render", "--source", tree, "--out", out)
    assert result.exit_code == 2 and "not an earlier render" in result.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_rerender_replaces_an_earlier_render(tree, tmp_path):
    out = tmp_path / "out"
    run_cli("render", "--source", tree, "--out", out)
    assert run_cli("render", "--source", tree, "--out", out, "--quirk", "crat-mem").exit_code == 0
    assert not (out / "0004-coarse-mtype.patch").exists()
    assert (out / "0003-crat-mem.patch").exists()


def test_quirks_lists_the_catalog_with_the_bits_and_the_facts_of_each_variant():
    result = run_cli("quirks", "--json")
    document = json.loads(result.stdout)
    assert document["output_schema"] == "rdna1-kmgr.quirks/1"  # one object, the catalog in its "quirks"
    catalog = document["quirks"]
    assert [q["id"] for q in catalog] == ["crat-mem", "coarse-mtype", "cwsr-size", "topology-sizes"]
    bits = {b["id"]: b for q in catalog for b in q["bits"]}
    # on by default only where there is public evidence that owners need it (issue: the cwsr-size quirk)
    assert {i: (b["mask"], b["default"]) for i, b in bits.items()} == {
        "crat-mem": ("0x0002", False),
        "coarse-mtype-vram": ("0x0004", False),
        "coarse-mtype-host": ("0x0008", False),
        "cwsr-size": ("0x0010", True),
        "topology-sizes": ("0x0020", True),
    }
    assert all(b["risk"] for b in bits.values())
    evidence = {q["id"]: q["evidence"] for q in catalog}
    assert evidence["crat-mem"] == evidence["coarse-mtype"] == []
    assert any("rocm-systems/pull/6125" in link for link in evidence["cwsr-size"])
    assert any("rocm-systems/pull/11299" in link for link in evidence["cwsr-size"])
    assert all(q["changes"] for q in catalog)
    # cwsr-size says what really triggers the failure (issue 37), not a kernel version alone
    cwsr = catalog[2]
    for condition in ("6.12", "RHEL", "BO-backed", "SVM", "CONFIG_DEVICE_PRIVATE", "HSA_USE_SVM=0", "#6125"):
        assert condition in cwsr["scope"], condition
    assert cwsr["needed_when"] == [
        {"fact": "kfd_queue.c contains `&properties->cwsr_bo`", "otherwise": "nothing to fix on this kernel"}
    ]
    # only a recognised form of upstream's fix leaves it out (issue 48)
    assert [f["fact"] for f in cwsr["fixed_when"]] == [
        "kfd_queue.c: kfd_queue_buffer_get() contains `user_addr + size - 1 > mapping->last`",
        "kfd_queue.c contains `props->simd_per_cu * props->max_waves_per_simd`",
    ]
    sizes = catalog[3]
    assert sizes["id"] == "topology-sizes"
    assert sizes["fixed_when"] == [
        {
            "fact": 'kfd_topology.c contains `"ctl_stack_size"`',
            "because": "the kernel already prints cwsr_size and ctl_stack_size (upstream 8fc2796dea6f)",
        }
    ]
    assert all(v["facts"] for q in catalog for v in q["variants"])
    crat = {v["id"]: v["facts"] for v in catalog[0]["variants"]}
    assert crat["largebar-debug-mask"] == [
        "amdgpu_amdkfd.c: amdgpu_amdkfd_get_local_mem_info() takes `xcp`",
        "amdgpu.h contains `debug_largebar`",
        "kfd_priv.h contains `struct kfd_node {`",
        "kfd_priv.h contains `struct kfd_local_mem_info local_mem_info;`",
    ]
    text = run_cli("quirks").stdout
    assert re.search(
        r"^    kgd \(first seen in Linux 5.10 - 5.16\) when:\n"
        r"        amdgpu_amdkfd.c: amdgpu_amdkfd_get_local_mem_info\(\) takes `kgd`$",
        text,
        re.M,
    ), text


def test_asking_for_a_quirk_keeps_the_default_on_ones_and_no_quirk_leaves_one_out(tree, tmp_path):
    # 6.1 (the fake tree): cwsr-size, kept beside an asked quirk where needed, has nothing to fix here: not kept,
    # and nothing said about a quirk nobody asked for (on 6.12 it is kept: test_patch_series_real)
    result = run_cli("render", "--source", tree, "--out", tmp_path / "a", "--quirk", "crat-mem", "--json")
    manifest = json.loads(result.stdout)
    assert [q["id"] for q in manifest["quirks"]] == ["crat-mem"] and manifest["kept_quirks"] == []
    assert manifest["left_out"] == []
    result = run_cli("render", "--source", tree, "--out", tmp_path / "b", "--no-quirk", "coarse-mtype", "--json")
    manifest = json.loads(result.stdout)
    assert [q["id"] for q in manifest["quirks"]] == ["crat-mem"] and manifest["declined_quirks"] == ["coarse-mtype"]
    assert {q["id"]: q["why"] for q in manifest["left_out"]}["coarse-mtype"] == "as asked (--no-quirk coarse-mtype)"
    # one quirk both asked for and left out: refused in one line, nothing written
    refused = run_cli(
        "render", "--source", tree, "--out", tmp_path / "c", "--quirk", "crat-mem", "--no-quirk", "crat-mem"
    )
    assert refused.exit_code == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "crat-mem is both asked for and left out" in refused.stderr and not (tmp_path / "c").exists()


def test_a_kernel_with_no_bit_on_by_default_says_so_in_one_line(tree, tmp_path):
    text = run_cli("render", "--source", tree, "--out", tmp_path / "out").stdout
    said = [line for line in text.splitlines() if "changes nothing" in line]
    assert said == [
        "no kernel change needed by default: the patched module changes nothing here until you switch an opt-in "
        "bit on: crat-mem (0x2), coarse-mtype-vram (0x4), coarse-mtype-host (0x8) "
        "(`rdna1-kmgr install --quirks MASK`; `rdna1-kmgr doctor` says what to check)"
    ]


def test_render_says_which_facts_chose_each_variant(tree, tmp_path):
    text = run_cli("render", "--source", tree, "--out", tmp_path / "out").stdout
    assert re.search(
        r"^quirk crat-mem: variant largebar-param, because this tree's\n"
        r"    amdgpu_amdkfd.c: amdgpu_amdkfd_get_local_mem_info\(\) takes `adev`$",
        text,
        re.M,
    ), text
    assert re.search(
        r"^quirk coarse-mtype: variant kfd-picks-mtype, because this tree's\n"
        r"    amdgpu_amdkfd_gpuvm.c: get_pte_flags\(\) contains `AMDGPU_VM_MTYPE_UC`$",
        text,
        re.M,
    ), text


def test_help_lists_every_command_and_version_works():
    result = run_cli("--help")
    for command in (
        "detect",
        "render",
        "quirks",
        "build",
        "keys",
        "vm-test",
        "install",
        "rollback",
        "status",
        "follow",
        "hooks",
    ):
        assert re.search(rf"^\s+{command}\s+\S", result.stdout, re.M), command
    assert run_cli("--version").stdout.startswith("rdna1-kmgr, version ")


def test_rendering_does_not_touch_the_source(tree, tmp_path):
    before = {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    run_cli("render", "--source", tree, "--out", tmp_path / "out")
    assert before == {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    shutil.rmtree(tmp_path / "out")
