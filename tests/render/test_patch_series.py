"""The renderer on a tiny fake kernel tree: series shape, real `patch`, variants, refusals."""

import json
import re
import shutil
import subprocess

import pytest
from click.testing import CliRunner
from fake_kernel import AMD, make_tree

from rdna1_kmgr.cli import main
from rdna1_kmgr.render.patch_series import count_selftest_cases

GMC = f"{AMD}/amdgpu/gmc_v10_0.c"


def run_cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def apply_series(out, tree):
    for name in (out / "series").read_text().split():
        done = subprocess.run(["patch", "-p1", "--batch", "-d", str(tree), "-i", str(out / name)],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "fuzz" not in done.stdout, done.stdout


def function_body(text, name):
    start = text.index(f"{name}(")
    return text[start:text.index("\n}\n", start) + 3]


@pytest.fixture
def tree(tmp_path):
    return make_tree(tmp_path / "linux")


def test_series_applies_with_patch_and_puts_every_hook_in_place(tree, tmp_path):
    out = tmp_path / "out"
    result = run_cli("render", "--source", tree, "--out", out, "--json")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads(result.stdout)
    assert (out / "series").read_text().split() == manifest["series"] == [
        "0001-out-of-tree.patch", "0002-rdna1-core.patch", "0003-coarse-mtype.patch", "0004-crat-mem.patch"]
    assert manifest["kernel_version"] == "6.1.192"
    assert manifest["devices"] == ["0x731F"]
    assert [q["id"] for q in manifest["quirks"]] == ["coarse-mtype", "crat-mem"]

    apply_series(out, tree)
    amdgpu = tree / AMD / "amdgpu"
    pte = function_body((amdgpu / "gmc_v10_0.c").read_text(), "gmc_v10_0_get_vm_pte")
    # the quirk has the last word on the MTYPE: the call is the function's last statement
    assert pte.rstrip().endswith("amdgpu_rdna1_pte_mtype(adev, flags);\n}")
    kfd = function_body((amdgpu / "amdgpu_amdkfd_gpuvm.c").read_text(), "get_pte_flags")
    assert kfd.index("amdgpu_rdna1_kfd_mapping_flags") < kfd.index("amdgpu_gem_va_map_flags")
    crat = function_body((tree / AMD / "amdkfd/kfd_crat.c").read_text(), "kfd_create_vcrat_image_gpu")
    assert crat.index("amdgpu_rdna1_crat_mem_info(kdev->adev, &local_mem_info);") < crat.index("local_mem_size_private == 0")
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
    assert "static uint amdgpu_rdna1_quirks = AMDGPU_RDNA1_ALL;" in core
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


@pytest.mark.parametrize("version, shape, mtype_variant, crat_variant, kfd_hook", [
    ("5.10.262", "5.10", "kfd-picks-mtype", "kgd", True),
    ("6.1.192", "6.1", "kfd-picks-mtype", "adev", True),
    ("6.2.0", "6.2", "gmc-picks-mtype", "adev", False),
    ("6.17.9", "6.2", "gmc-picks-mtype", "adev", False),
    ("6.18.0-rc1", "6.18", "vm-flags", "adev", False),
    ("7.3-rc2", "6.18", "vm-flags", "adev", False),
    # a backport: RHEL 9's top Makefile says 5.14, its driver has the shape of a later release
    ("5.14.0", "6.2", "gmc-picks-mtype", "adev", False),
    ("5.14.0", "6.18", "vm-flags", "adev", False),
    # and a 5.10 driver under a newer number
    ("6.6.0", "5.10", "kfd-picks-mtype", "kgd", True),
])
def test_variant_follows_the_facts_of_the_source(tmp_path, version, shape, mtype_variant, crat_variant, kfd_hook):
    tree = make_tree(tmp_path / "linux", version, shape)
    out = tmp_path / "out"
    result = run_cli("render", "--source", tree, "--out", out, "--json")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads(result.stdout)
    assert {q["id"]: q["variant"] for q in manifest["quirks"]} == {"coarse-mtype": mtype_variant, "crat-mem": crat_variant}
    coarse = (out / "0003-coarse-mtype.patch").read_text()
    assert (f"+++ b/{AMD}/amdgpu/amdgpu_amdkfd_gpuvm.c" in coarse) == kfd_hook
    crat = (out / "0004-crat-mem.patch").read_text()
    assert ("kdev->kgd" in crat) == (crat_variant == "kgd")
    # the manifest and the patch say which facts chose the variant
    facts = {q["id"]: q["facts"] for q in manifest["quirks"]}
    assert f"kfd_crat.c: kfd_create_vcrat_image_gpu() contains `kdev->{crat_variant}`" in facts["crat-mem"]
    assert all(fact in crat for fact in facts["crat-mem"])
    apply_series(out, tree)


def test_no_variant_fits_a_partial_backport_refused_naming_each_failed_fact(tmp_path):
    # get_vm_pte without the UC override while KFD no longer picks UC: a shape no release had
    tree = make_tree(tmp_path / "linux", "5.14.0", "6.1", kfd="default")
    out = tmp_path / "out"
    assert_refused(run_cli("render", "--source", tree, "--out", out), out,
                   "quirk coarse-mtype: no variant fits",
                   "kfd-picks-mtype (first seen in Linux 5.10 - 6.1): amdgpu_amdkfd_gpuvm.c: get_pte_flags() does not contain `AMDGPU_VM_MTYPE_UC`",
                   "gmc-picks-mtype (first seen in Linux 6.2 - 6.17): gmc_v10_0.c: gmc_v10_0_get_vm_pte() does not contain `AMDGPU_GEM_CREATE_COHERENT`",
                   "vm-flags (first seen in Linux 6.18 and later): gmc_v10_0.c: gmc_v10_0_get_vm_pte() does not take `vm_flags`")


def test_two_variants_whose_facts_both_hold_are_refused_naming_them(tmp_path):
    tree = make_tree(tmp_path / "linux", "6.18.0", "6.18", gmc="mapping+vm_flags")
    out = tmp_path / "out"
    assert_refused(run_cli("render", "--source", tree, "--out", out), out,
                   "quirk coarse-mtype: the facts of several variants hold",
                   "gmc-picks-mtype (amdgpu_amdkfd_gpuvm.c: get_pte_flags() lacks `AMDGPU_VM_MTYPE_UC`, ",
                   "vm-flags (gmc_v10_0.c: gmc_v10_0_get_vm_pte() takes `vm_flags`, ")


def test_a_driver_midway_through_the_kgd_removal_uses_adev(tmp_path):
    tree = make_tree(tmp_path / "linux", "5.16.0", "5.10", crat="kgd+adev")
    out = tmp_path / "out"
    manifest = json.loads(run_cli("render", "--source", tree, "--out", out, "--json").stdout)
    assert {q["id"]: q["variant"] for q in manifest["quirks"]}["crat-mem"] == "adev"
    apply_series(out, tree)


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
    # the 5.10 shape, but this tree's headers and code have no `map_mtype` (the self-test calls it)
    tree = make_tree(tmp_path / "linux", "5.10.100", "5.10", missing_names={"map_mtype"})
    out = tmp_path / "out"
    assert_refused(run_cli("render", "--source", tree, "--out", out), out,
                   "`map_mtype` (a struct member, in drivers/gpu/drm/amd/amdgpu/amdgpu_rdna1.c)")


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
            done = subprocess.run(["git", "apply", "-p1", "--whitespace=nowarn", str(out / patch)],
                                  cwd=tree, capture_output=True, text=True)
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
        rel: transform(data) for rel, data in plain.items() if rel not in new}
    assert {rel: changed[rel] for rel in new} == {rel: plain[rel] for rel in new}


def test_trailing_white_space_and_tabs_are_kept(tmp_path):
    tree = make_tree(tmp_path / "linux")
    drv = tree / AMD / "amdgpu/amdgpu_drv.c"
    text = drv.read_bytes().replace(b"\tamdgpu_amdkfd_init();\n", b"\tamdgpu_amdkfd_init();  \t\n")
    drv.write_bytes(text.replace(b"flags);\n", b"flags); \n"))
    out = tmp_path / "out"
    assert run_cli("render", "--source", tree, "--out", out).exit_code == 0
    for patch in (out / "series").read_text().split():
        done = subprocess.run(["git", "apply", "-p1", "--whitespace=nowarn", str(out / patch)], cwd=tree,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    after = drv.read_bytes()
    assert b"\tamdgpu_amdkfd_init();  \t\n" in after and b"ret = amdgpu_driver_load_kms(adev, flags); \n" in after
    assert b"amdgpu_rdna1_probe(adev);" in after


def test_one_quirk_only(tree, tmp_path):
    out = tmp_path / "out"
    result = run_cli("render", "--source", tree, "--out", out, "--quirk", "crat-mem", "--json")
    manifest = json.loads(result.stdout)
    assert manifest["series"] == ["0001-out-of-tree.patch", "0002-rdna1-core.patch", "0003-crat-mem.patch"]
    assert manifest["quirks_mask"] == 2
    apply_series(out, tree)
    assert "amdgpu_rdna1_pte_mtype" not in (tree / GMC).read_text()
    core = (tree / AMD / "amdgpu/amdgpu_rdna1.c").read_text()
    assert "COARSE_MTYPE" not in core and "default 0x2)" in core


def test_several_devices(tree, tmp_path):
    out = tmp_path / "out"
    assert run_cli("render", "--source", tree, "--out", out, "--device", "0x7340", "--device", "731f").exit_code == 0
    apply_series(out, tree)
    assert re.search(r"amdgpu_rdna1_ids\[\] = \{\n\t0x731F,\n\t0x7340,\n\};",
                     (tree / AMD / "amdgpu/amdgpu_rdna1.c").read_text())


def assert_refused(result, out, *words):
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0]
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")], "staging left behind"


def test_source_without_the_hooked_function_is_refused_with_nothing_written(tmp_path):
    tree = make_tree(tmp_path / "linux", omit="gmc_v10_0_get_vm_pte")
    out = tmp_path / "out"
    assert_refused(run_cli("render", "--source", tree, "--out", out), out, "gmc_v10_0.c", "gmc_v10_0_get_vm_pte")


def test_source_without_the_hooked_statement_is_refused(tmp_path):
    tree = make_tree(tmp_path / "linux", omit="amdgpu_driver_load_kms")
    out = tmp_path / "out"
    assert_refused(run_cli("render", "--source", tree, "--out", out), out, "amdgpu_drv.c", "amdgpu_driver_load_kms")


@pytest.mark.parametrize("args, words", [
    (["--device", "0x1234"], ["0x1234", "0x731F", "0x7340"]),
    (["--device", "nope"], ["nope"]),
    (["--quirk", "bogus"], ["bogus", "coarse-mtype"]),
])
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
    assert not (out / "0004-crat-mem.patch").exists()
    assert (out / "0003-crat-mem.patch").exists()


def test_quirks_lists_the_catalog_with_the_facts_of_each_variant():
    result = run_cli("quirks", "--json")
    catalog = json.loads(result.stdout)
    assert [q["id"] for q in catalog] == ["coarse-mtype", "crat-mem"]
    assert all(v["facts"] for q in catalog for v in q["variants"])
    crat = {v["id"]: v["facts"] for v in catalog[1]["variants"]}
    assert crat["adev"] == ["kfd_crat.c: kfd_create_vcrat_image_gpu() contains `kdev->adev`"]
    text = run_cli("quirks").stdout
    assert re.search(r"^    adev \(first seen in Linux 5.17 and later\) when:\n"
                     r"        kfd_crat.c: kfd_create_vcrat_image_gpu\(\) contains `kdev->adev`$", text, re.M), text


def test_render_says_which_facts_chose_each_variant(tree, tmp_path):
    text = run_cli("render", "--source", tree, "--out", tmp_path / "out").stdout
    assert re.search(r"^quirk crat-mem: variant adev, because this tree's\n"
                     r"    kfd_crat.c: kfd_create_vcrat_image_gpu\(\) contains `kdev->adev`$", text, re.M), text


def test_help_lists_every_command_and_version_works():
    result = run_cli("--help")
    for command in ("detect", "render", "quirks", "build", "keys", "vm-test", "install", "rollback", "status"):
        assert re.search(rf"^\s+{command}\s+\S", result.stdout, re.M), command
    assert run_cli("--version").stdout.startswith("rdna1-kmgr, version ")


def test_rendering_does_not_touch_the_source(tree, tmp_path):
    before = {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    run_cli("render", "--source", tree, "--out", tmp_path / "out")
    assert before == {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    shutil.rmtree(tmp_path / "out")
