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
    ("5.10.262", "mapping", "kfd-picks-mtype", "kgd", True),
    ("6.1.192", "mapping", "kfd-picks-mtype", "adev", True),
    ("6.2.0", "mapping", "gmc-picks-mtype", "adev", False),
    ("6.17.9", "mapping", "gmc-picks-mtype", "adev", False),
    ("6.18.0-rc1", "vm_flags", "vm-flags", "adev", False),
    ("7.3-rc2", "vm_flags", "vm-flags", "adev", False),
])
def test_variant_follows_the_kernel_version(tmp_path, version, shape, mtype_variant, crat_variant, kfd_hook):
    tree = make_tree(tmp_path / "linux", version, shape)
    out = tmp_path / "out"
    result = run_cli("render", "--source", tree, "--out", out, "--json")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads(result.stdout)
    assert {q["id"]: q["variant"] for q in manifest["quirks"]} == {"coarse-mtype": mtype_variant, "crat-mem": crat_variant}
    coarse = (out / "0003-coarse-mtype.patch").read_text()
    assert ("amdgpu_amdkfd_gpuvm.c" in coarse) == kfd_hook
    crat = (out / "0004-crat-mem.patch").read_text()
    assert ("kdev->kgd" in crat) == (crat_variant == "kgd")
    apply_series(out, tree)


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


def test_quirks_lists_the_catalog():
    result = run_cli("quirks", "--json")
    catalog = json.loads(result.stdout)
    assert [q["id"] for q in catalog] == ["coarse-mtype", "crat-mem"]
    assert all(q["variants"] for q in catalog)


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
