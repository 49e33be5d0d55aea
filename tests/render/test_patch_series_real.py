"""The renderer on real Debian kernel sources: the series applies with `patch -p1`, and for 6.1 and 6.12
the patched tree builds the whole amdgpu module with kbuild against Debian's headers."""

import os
import re
import shutil
import subprocess

import pytest

from rdna1_kmgr.render.patch_series import render

AMD = "drivers/gpu/drm/amd"
pytestmark = pytest.mark.realsource


def patched_copy(source, out, dest):
    """A hard-linked copy of the cached source with the series applied (GNU patch writes each file it
    changes anew, so the cache itself is never modified)."""
    shutil.copytree(source, dest, copy_function=os.link)
    for name in (out / "series").read_text().split():
        done = subprocess.run(["patch", "-p1", "--batch", "-d", str(dest), "-i", str(out / name)],
                              capture_output=True, text=True)
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"
        assert "fuzz" not in done.stdout and "FAILED" not in done.stdout, done.stdout
    return dest


@pytest.mark.parametrize("fixture, major_minor, variant", [
    ("real_source_61", "6.1", "kfd-picks-mtype"),
    ("real_source_612", "6.12", "gmc-picks-mtype"),
    ("real_source_72", "7.2", "vm-flags"),
])
def test_series_applies_to_the_real_source(request, tmp_path, fixture, major_minor, variant):
    source = request.getfixturevalue(fixture)
    before = (source / AMD / "amdgpu/gmc_v10_0.c").read_bytes()
    manifest = render(source, tmp_path / "out")
    assert manifest["kernel_version"].startswith(major_minor + ".")
    assert {q["id"]: q["variant"] for q in manifest["quirks"]}["coarse-mtype"] == variant

    tree = patched_copy(source, tmp_path / "out", tmp_path / "linux")
    gmc = (tree / AMD / "amdgpu/gmc_v10_0.c").read_text()
    pte = gmc[gmc.index("static void gmc_v10_0_get_vm_pte("):]
    pte = pte[:pte.index("\n}\n") + 3]
    assert pte.rstrip().endswith("amdgpu_rdna1_pte_mtype(adev, flags);\n}")
    crat = (tree / AMD / "amdkfd/kfd_crat.c").read_text()
    assert "amdgpu_rdna1_crat_mem_info(kdev->adev, &local_mem_info);" in crat
    assert (tree / AMD / "amdgpu/amdgpu_rdna1.c").is_file()
    # the cache was not touched
    assert (source / AMD / "amdgpu/gmc_v10_0.c").read_bytes() == before
    assert not (source / AMD / "amdgpu/amdgpu_rdna1.c").exists()


def test_real_source_without_get_vm_pte_is_refused(real_source_61, tmp_path):
    tree = tmp_path / "linux"
    shutil.copytree(real_source_61, tree, copy_function=os.link)
    gmc = tree / AMD / "amdgpu/gmc_v10_0.c"
    text = gmc.read_text().replace("gmc_v10_0_get_vm_pte", "gmc_v10_0_pte_flags")
    gmc.unlink()  # break the hard link before writing
    gmc.write_text(text)
    from click.testing import CliRunner

    from rdna1_kmgr.cli import main

    result = CliRunner().invoke(main, ["render", "--source", str(tree), "--out", str(tmp_path / "out")])
    assert result.exit_code != 0
    assert "gmc_v10_0.c" in result.stderr and "gmc_v10_0_get_vm_pte" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def modinfo(ko, field):
    return subprocess.run(["modinfo", "-F", field, str(ko)], capture_output=True, text=True, check=True).stdout


@pytest.mark.realbuild
@pytest.mark.parametrize("source_fixture, headers_fixture", [
    ("real_source_61", "headers_61"),
    ("real_source_612", "headers_612"),
])
def test_patched_tree_builds_amdgpu_with_kbuild(request, tmp_path, source_fixture, headers_fixture):
    source = request.getfixturevalue(source_fixture)
    release = request.getfixturevalue(headers_fixture)
    render(source, tmp_path / "out")
    tree = patched_copy(source, tmp_path / "out", tmp_path / "linux")
    amd = tree / AMD
    jobs = str((os.cpu_count() or 1) + 1)
    log = tmp_path / "build.log"
    with log.open("w") as out:
        done = subprocess.run(
            ["make", "-C", f"/lib/modules/{release}/build", f"M={amd}/amdgpu", f"FULL_AMD_PATH={amd}",
             f"-j{jobs}", "modules"],
            stdout=out, stderr=subprocess.STDOUT)
    assert done.returncode == 0, log.read_text()[-4000:]
    ko = amd / "amdgpu/amdgpu.ko"
    assert modinfo(ko, "vermagic").split()[0] == release
    params = modinfo(ko, "parm")
    assert re.search(r"^rdna1_quirks:.*\(uint\)$", params, re.M), params
    assert re.search(r"^rdna1_selftest:.*\(bool\)$", params, re.M), params
    assert "pci:v00001002d0000731Fsv*sd*bc*sc*i*" in modinfo(ko, "alias").split()
