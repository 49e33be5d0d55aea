"""The quirks' self-test in the real amdgpu module, in an emulated VM of its own Debian kernel.

It drives the real driver functions (KFD's get_pte_flags, gmc_v10_0_get_vm_pte, amdgpu_amdkfd_get_local_mem_info,
kfd_dev_is_large_bar) at module load; when one case fails the module must come up with every quirk off and say
so in one line. The broken build reuses the session's 6.1 build: same persistent kbuild tree, so only the
objects the broken quirk changes are compiled again; its DKMS package lives in the test's own DKMS trees, so the
session's build is not replaced.
"""

import io
import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import persistent_cache_root
from kernel_style import AMD, WITHOUT_EXPORT, derived_tree
from vm_fixtures import (  # noqa: F401 (fixtures)
    assert_nothing_left_running,
    guest_kernel_61,
    guest_kernel_612,
    rdna1_kmgr,
    vm_env,
)

from rdna1_kmgr.core import progress
from rdna1_kmgr.doctor import control_stack, kfd_access, queue_cwsr
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.modbuild import module_build
from rdna1_kmgr.render import quirk_catalog
from rdna1_kmgr.source import target_kernel

# The line of crat-mem that keeps the total size: without it the self-test's memory-info cases must fail.
FOLD = "\tmem_info->local_mem_size_private += mem_info->local_mem_size_public;\n"


def selftest_load(out: dict) -> dict:
    result = json.loads(Path(out["details"]["guest_result"]).read_text())
    return next(s for s in result["steps"] if s["name"] == "insmod selftest")


def passing_vm_test(built: dict, vm_env) -> tuple[dict, dict]:
    """vm-test of a session build by path with its manifest (the system's DKMS tree is shared: `--kernel` would
    take whichever build is newest); it must pass. (vm-test's JSON, the render manifest.)"""
    manifest_path = Path(built["package_source"]) / dkms.MANIFEST_NAME
    proc = rdna1_kmgr(["vm-test", "--module", built["module"], "--manifest", str(manifest_path), "--json"], vm_env)
    out = json.loads(proc.stdout)
    assert proc.returncode == 0, out.get("reason")
    manifest = json.loads(manifest_path.read_text())
    # every row of every case table ran
    assert out["selftest"] == {
        "passed": manifest["selftest_cases"],
        "failed": 0,
        "required": manifest["selftest_cases"],
    }
    return out, manifest


@pytest.mark.vm
@pytest.mark.realbuild
def test_the_selftest_covers_every_case_the_render_defines(built_module_61, guest_kernel_61, vm_env):
    out, manifest = passing_vm_test(built_module_61, vm_env)
    # coarse-mtype (each KFD allocation class, GEM_VA BO flags and asked types, compute and other VMs, the
    # hand-written rows) and crat-mem (large/small BAR, debug_largebar)
    assert manifest["selftest_cases"] >= 80  # 6.1: 12 crat-mem, 65 KFD-allocation and 10 GEM_VA cases
    load = selftest_load(out)
    # loaded without rdna1_quirks: the default mask, cwsr-size only, which 6.1 leaves out (nothing to fix)
    assert load["after"]["parameters"]["rdna1_quirks"] == str(manifest["quirks_mask"]) == "0"
    assert [q["id"] for q in manifest["left_out"]] == ["cwsr-size", "topology-sizes"]
    assert_nothing_left_running(vm_env)


def broken_build(built: dict, template: str, line: str, replacement: str, vm_env, tmp_path, monkeypatch) -> dict:
    """`built`'s kernel built again from a copy of kmod/ with one line of `template` replaced, in the test's own
    DKMS trees and the session's kbuild tree (only what the change touches compiles again); vm-test's JSON."""
    kmod = tmp_path / "kmod"
    shutil.copytree(quirk_catalog.kmod_root(), kmod)
    path = kmod / template
    assert line in path.read_text()
    path.write_text(path.read_text().replace(line, replacement))
    monkeypatch.setattr(quirk_catalog, "kmod_root", lambda: kmod)
    broken = build_apart(built["kernel"], None, vm_env, tmp_path, monkeypatch)
    assert broken.sha256 != built["sha256"]
    # the shared kbuild tree: the changed core and what links it, not the whole driver again
    assert broken.compiled_objects <= 5, broken.compiled_objects
    proc = rdna1_kmgr(["vm-test", "--module", broken.module, "--json"], vm_env)
    out = json.loads(proc.stdout)
    assert proc.returncode == 5 and out["verdict"] == "fail", out.get("reason")
    return out


def build_apart(release: str, source: Path | None, vm_env, tmp_path, monkeypatch) -> module_build.BuildResult:
    """`release` built (from `source`, else Debian's) in the test's own DKMS trees and the session's kbuild tree
    and ccache, so that only what differs from the session's build compiles again."""
    for name, folder in (("RDNA1_KMGR_DKMS_SOURCE_TREE", "usr-src"), ("RDNA1_KMGR_DKMS_TREE", "dkms")):
        (tmp_path / folder).mkdir()
        monkeypatch.setenv(name, str(tmp_path / folder))
        vm_env[name] = str(tmp_path / folder)
    monkeypatch.setenv("RDNA1_KMGR_CACHE", str(persistent_cache_root()))
    monkeypatch.setenv("RDNA1_KMGR_LOG", str(tmp_path / "log"))
    kernel = target_kernel.resolve_kernel(release)
    request = module_build.BuildRequest(kernel=kernel, source=str(source) if source else None, yes=True)
    with progress.reporting_to(io.StringIO()):
        return module_build.run(request)


def assert_every_quirk_forced_off(out: dict, quirk: str) -> None:
    assert out["reason"].startswith("selftest: ")
    assert out["reason"].endswith("the module switched every quirk off (rdna1_quirks=0)")
    assert out["selftest"]["failed"] > 0
    load = selftest_load(out)
    # the module is up, live, with every quirk off, and the kernel log says why in one line
    assert load["rc"] == 0 and load["after"]["initstate"] == "live"
    assert load["after"]["parameters"]["rdna1_quirks"] == "0"
    said = [line for line in load["log"] if "rdna1-kmgr selftest" in line]
    assert len(said) == 1 and re.search(
        rf"\d+ passed, [1-9]\d* failed \(first: {quirk} case \d+\): quirks forced " r"off, rdna1_quirks=0", said[0]
    ), said
    # everything else about the load is healthy: the failure is the quirk, not the module
    assert {c["name"] for c in out["checks"] if not c["ok"]} == {"selftest"}


@pytest.mark.vm
@pytest.mark.realbuild
def test_a_broken_quirk_brings_the_module_up_with_every_quirk_off(
    built_module_61, guest_kernel_61, vm_env, tmp_path, monkeypatch
):
    out = broken_build(built_module_61, "quirks/crat-mem/crat_mem.c.j2", FOLD, "", vm_env, tmp_path, monkeypatch)
    assert_every_quirk_forced_off(out, "crat-mem")
    assert_nothing_left_running(vm_env)


@pytest.mark.vm
@pytest.mark.realbuild
def test_the_612_selftest_runs_the_cwsr_size_cases_and_the_default_mask_is_cwsr_size(
    built_module_612, guest_kernel_612, vm_env
):
    out, manifest = passing_vm_test(built_module_612, vm_env)
    assert "cwsr-size" in [q["id"] for q in manifest["quirks"]]
    # 6.12: 12 crat-mem, 125 coarse-mtype, 31 cwsr-size (Navi10 36 CUs, Navi14 20 and 22, Navi12 40, 7 each:
    # both layouts, a third size, bit off, an unlisted board; and 3 with no waves per SIMD in the topology);
    # at least the cwsr-size ones on top of what 6.12 had before
    assert manifest["selftest_cases"] >= 137 + 31
    load = selftest_load(out)
    # the default mask is the one bit with evidence that owners need it: cwsr-size, bit 4
    assert load["after"]["parameters"]["rdna1_quirks"] == str(manifest["quirks_mask"]) == str(1 << 4)
    assert_nothing_left_running(vm_env)


# The decision's one line: accept ROCm's size only when the mapping has exactly that size.
ACCEPT = "\treturn rocm && mapped == rocm ? rocm : stock;\n"


@pytest.mark.vm
@pytest.mark.realbuild
def test_a_cwsr_acceptance_widened_to_any_size_fails_the_selftest_and_forces_the_quirks_off(
    built_module_612, guest_kernel_612, vm_env, tmp_path, monkeypatch
):
    out = broken_build(
        built_module_612, "quirks/cwsr-size/cwsr_size.c.j2", ACCEPT, "\treturn mapped;\n", vm_env, tmp_path, monkeypatch
    )
    assert_every_quirk_forced_off(out, "cwsr-size")
    assert_nothing_left_running(vm_env)


# The guard: a topology without max_waves_per_simd must keep KFD's size.
GUARD = "\tif (!props->simd_per_cu || !props->max_waves_per_simd || !num_xcc)\n"


@pytest.mark.vm
@pytest.mark.realbuild
def test_a_cwsr_size_without_the_wave_count_guard_fails_the_selftest_and_forces_the_quirks_off(
    built_module_612, guest_kernel_612, vm_env, tmp_path, monkeypatch
):
    out = broken_build(
        built_module_612,
        "quirks/cwsr-size/cwsr_size.c.j2",
        GUARD,
        "\tif (!props->simd_per_cu || !num_xcc)\n",
        vm_env,
        tmp_path,
        monkeypatch,
    )
    assert_every_quirk_forced_off(out, "cwsr-size")
    assert_nothing_left_running(vm_env)


# What the self-test reads back from the lines topology-sizes prints, worked out by hand from Linux 6.12's
# kfd_queue.c (kfd_queue_ctx_save_restore_size, gfx10 at 32 waves a CU): ctl_stack_size ALIGN(40 + 12 * 32 * CUs
# + 8, 4096) and cwsr_size ctl_stack_size + CUs * 0x55000. 36 CUs: 13872 -> 16384, 16384 + 0xbf4000; 20 CUs:
# 7728 -> 8192, 8192 + 0x6a4000; 22 CUs: 8496 -> 12288, 12288 + 0x74e000; 40 CUs: 15408 -> 16384, 16384 +
# 0xd48000.
SHOWN = {
    "RX 5600 XT": (12550144, 16384),
    "RX 5500": (6971392, 8192),
    "RX 5500 XT": (7671808, 12288),
    "Radeon Pro 5600M": (13942784, 16384),
}


@pytest.mark.vm
@pytest.mark.realbuild
def test_a_612_without_the_export_gets_topology_sizes_and_its_vm_selftest_shows_the_two_lines(
    real_source_612, built_module_612, guest_kernel_612, vm_env, tmp_path, monkeypatch
):
    """Issue 48: Debian's archive carries only 6.12 kernels that print the sizes, so the kernel 6.12.0-6.12.63
    were is made from Debian's own 6.12 source with upstream 8fc2796dea6f taken out, and given the whole path:
    render, a DKMS build against the real headers, and the module's self-test in a VM of that kernel."""
    tree = derived_tree(real_source_612, tmp_path / "linux", WITHOUT_EXPORT)
    built = build_apart(built_module_612["kernel"], tree, vm_env, tmp_path, monkeypatch)
    # only the objects the series changes beside the session's build: kfd_topology.o, the quirk core and the
    # files that include its header
    assert built.compiled_objects <= 20, built.compiled_objects
    out, manifest = passing_vm_test({"module": built.module, "package_source": built.package_source}, vm_env)
    assert [q["id"] for q in manifest["quirks"]][-1] == "topology-sizes"
    load = selftest_load(out)
    # on by default here, beside cwsr-size: bits 4 and 5
    assert load["after"]["parameters"]["rdna1_quirks"] == str(manifest["quirks_mask"]) == str(0x30)
    shown = {
        m.group(1): (int(m.group(2)), int(m.group(3)))
        for m in (
            re.search(r"rdna1-kmgr topology-sizes: (.+) node shows cwsr_size (\d+) ctl_stack_size (\d+)$", line)
            for line in load["log"]
        )
        if m
    }
    assert shown == SHOWN
    assert_nothing_left_running(vm_env)
    # doctor on this kernel's RX 5600 XT node, before (stock: no lines) and after (the lines the VM showed)
    before, after = (
        doctor_queue(tmp_path / name, lines, mask)
        for name, lines, mask in (
            ("before", {}, None),
            ("after", dict(zip(("cwsr_size", "ctl_stack_size"), shown["RX 5600 XT"], strict=False)), 0x30),
        )
    )
    assert before.level == "problem" and "KFD checks 0x4000, ROCm after rocm-systems #6125 sends 0x5000" in before.seen
    assert after.level == "ok" and "prints ctl_stack_size 16384" in after.seen and "has cwsr-size" in after.seen


def sized_for_40_waves(data: bytes) -> bytes:
    """kfd_queue_ctx_save_restore_size sizing gfx10 for simd_per_cu * max_waves_per_simd waves, as ROCm does,
    written in an order the render's fixed_when does not know as upstream's fix."""
    old = b": cu_num * 32;"
    assert data.count(old) == 1
    return data.replace(old, b": cu_num * props->max_waves_per_simd * props->simd_per_cu;")


@pytest.mark.vm
@pytest.mark.realbuild
def test_a_kfd_sized_for_40_waves_in_a_form_render_does_not_know_keeps_cwsr_size_and_its_selftest_passes(
    real_source_612, built_module_612, guest_kernel_612, vm_env, tmp_path, monkeypatch
):
    """Issue 48: a form of upstream's fix the render does not recognise keeps the quirk, and the self-test
    tolerates a KFD that already sizes gfx10 as ROCm does (the sizes worked out by hand in its template) instead
    of switching every quirk off."""
    tree = derived_tree(real_source_612, tmp_path / "linux", {f"{AMD}/amdkfd/kfd_queue.c": sized_for_40_waves})
    built = build_apart(built_module_612["kernel"], tree, vm_env, tmp_path, monkeypatch)
    out, manifest = passing_vm_test({"module": built.module, "package_source": built.package_source}, vm_env)
    assert "cwsr-size" in [q["id"] for q in manifest["quirks"]]
    assert selftest_load(out)["after"]["parameters"]["rdna1_quirks"] == str(1 << 4)
    assert_nothing_left_running(vm_env)


def doctor_queue(root: Path, lines: dict, mask: int | None):
    """doctor's queue finding for an RX 5600 XT (36 CUs) on Debian's 6.12 without SVM, with a 2026 ROCm."""
    node = root / "sys/class/kfd/kfd/topology/nodes/1"
    node.mkdir(parents=True)
    props = {"simd_count": 72, "simd_per_cu": 2, "max_waves_per_simd": 20, "gfx_target_version": 100100}
    props |= {"capability": 0x6480, **lines}
    (node / "properties").write_text("".join(f"{k} {v}\n" for k, v in props.items()))
    nodes = kfd_access.read_nodes(root)
    svm = queue_cwsr.read_svm_facts(root, "6.12.63-amd64")
    rocm = [queue_cwsr.RocmRuntime("rocm-sdk-core", "7.15.0a20260630")]
    (found,) = queue_cwsr.findings(
        True, "6.12.63-amd64", root, mask, rocm, svm, [], control_stack.read(nodes), control_stack.kernel_prints(nodes)
    )
    return found
