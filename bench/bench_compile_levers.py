#!/usr/bin/env python3
"""What a compile lever is worth, object for object: the CPU of compiling a few amdgpu objects under each variant.

    /opt/rdna1-kmgr/bin/python bench/bench_compile_levers.py [--kernel KREL] [--rounds N] [--objects sample|si-cik]

Why: issue 27 asks a cold build for 0.78x the CPU of a raw `make M=`; a whole cold build takes minutes and its
ratio moves by 0.1 between runs on this machine, so a lever worth a few percent is measured here instead, on the
same objects compiled again and again, the variants interleaved round by round (a slower minute hits all alike).

Each variant compiles the objects with `make -j1 ... <objects>` in a scratch copy of Debian's amd source for
KREL (the out-of-tree build fix applied, as the raw build of bench_build.py has it); the CPU is that of make's
children (user + system). The variants, against `g0` (how rdna1-kbuild compiles):
  config-g   the kernel config's -g, as a raw `make M=` compiles;
  ccache     -g0 through ccache as the tool sets it (depend mode, inode cache), its cache emptied each round;
  hugetlb    -g0, the compiler's malloc on transparent huge pages (GLIBC_TUNABLES=glibc.malloc.hugetlb=1);
  no-warn    -g0 -w: no warning, so no pass that only warns.
--objects si-cik compiles what Kconfig's SI and CIK support adds to the module (those objects' share of a whole
build, not a lever kept: see bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_build  # noqa: E402  (the stopwatch and the unpatched copy are the same as there)

from rdna1_kmgr.modbuild import package_build  # noqa: E402
from rdna1_kmgr.render.patch_series import render  # noqa: E402
from rdna1_kmgr.source import (
    kernel_source,  # noqa: E402
    target_kernel,  # noqa: E402
)

say = bench_build.say

# Relative to amdgpu/: the biggest RDNA1 objects of each part of the driver (gfx, memory, SoC, DMA, KFD,
# display, power).
SAMPLE = [
    "gfx_v10_0.o", "amdgpu_device.o", "gmc_v10_0.o", "nv.o", "sdma_v5_0.o", "amdgpu_ttm.o",
    "../amdkfd/kfd_device.o", "../display/dc/dcn20/dcn20_hwseq.o", "../pm/swsmu/smu11/navi10_ppt.o",
    "../display/amdgpu_dm/amdgpu_dm.o",
]  # fmt: skip
# What CONFIG_DRM_AMDGPU_SI, CONFIG_DRM_AMDGPU_CIK and CONFIG_DRM_AMD_DC_SI add (amdgpu/, pm/legacy-dpm/ and
# display/dc/ Makefiles of Linux 6.1); display/dc/dce60/*.c is added when the tree is read.
SI_CIK = [
    "cik.o", "cik_ih.o", "dce_v8_0.o", "gfx_v7_0.o", "cik_sdma.o", "uvd_v4_2.o", "vce_v2_0.o",
    "si.o", "gmc_v6_0.o", "gfx_v6_0.o", "si_ih.o", "si_dma.o", "dce_v6_0.o", "uvd_v3_1.o",
    "amdgpu_amdkfd_gfx_v7.o", "../pm/legacy-dpm/kv_dpm.o", "../pm/legacy-dpm/kv_smc.o",
    "../pm/legacy-dpm/si_dpm.o", "../pm/legacy-dpm/si_smc.o",
    "../display/dc/bios/dce60/command_table_helper_dce60.o", "../display/dc/clk_mgr/dce60/dce60_clk_mgr.o",
    "../display/dc/gpio/dce60/hw_translate_dce60.o", "../display/dc/gpio/dce60/hw_factory_dce60.o",
    "../display/dc/irq/dce60/irq_service_dce60.o",
]  # fmt: skip


def variants(work: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Name -> (make variables, environment additions)."""
    return {
        "g0": (["KCFLAGS=-g0"], {}),
        "config-g": ([], {}),
        "ccache": (["KCFLAGS=-g0"], {**package_build.ccache_env(), "CCACHE_BASEDIR": str(work)}),
        "hugetlb": (["KCFLAGS=-g0"], {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}),
        "no-warn": (["KCFLAGS=-g0 -w"], {}),
    }


def compile_cpu(kernel: str, amd: Path, objects: list[str], make_vars: list[str], env: dict) -> float:
    for name in objects:
        (amd / "amdgpu" / name).resolve().unlink(missing_ok=True)
    command = ["make", "-s", "-j1", "-C", f"/lib/modules/{kernel}/build", f"M={amd}/amdgpu"]
    command += [f"FULL_AMD_PATH={amd}", *make_vars, *objects]
    with bench_build.Stopwatch() as watch:
        subprocess.run(command, check=True, env={**os.environ, **env})
    return watch.cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", help="kernel release (default: the distribution's current one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--objects", choices=("sample", "si-cik"), default="sample")
    args = parser.parse_args()

    kernel = target_kernel.resolve_kernel(args.kernel).release
    tree = kernel_source.fetch_kernel_source(kernel)
    work = Path(tempfile.mkdtemp(prefix="rdna1-kmgr-levers-", dir="/var/tmp"))
    # The tool's cache folder, ccache's among it, in the scratch folder: each round empties ccache's.
    os.environ["RDNA1_KMGR_CACHE"] = str(work / "cache")
    try:
        render(tree, work / "series")
        amd = bench_build.unpatched_copy(tree, work / "src", bench_build.out_of_tree_fix(work / "series"))
        objects = SAMPLE
        if args.objects == "si-cik":
            dce60 = sorted((amd / "display/dc/dce60").glob("*.c"))
            objects = SI_CIK + [f"../display/dc/dce60/{c.stem}.o" for c in dce60]
        chosen = variants(work) if args.objects == "sample" else {"g0": (["KCFLAGS=-g0"], {})}
        say(f"bench: {len(objects)} objects of {kernel}, {args.rounds} rounds, load {bench_build.load()}")
        cpu: dict[str, list[float]] = {name: [] for name in chosen}
        for round_number in range(args.rounds):
            for name, (make_vars, env) in chosen.items():
                assert package_build.ccache_dir().is_relative_to(work)
                shutil.rmtree(package_build.ccache_dir(), ignore_errors=True)
                package_build.cap_ccache()  # the tool's size cap and compression level, in the scratch folder
                cpu[name].append(compile_cpu(kernel, amd, objects, make_vars, env))
                say(f"bench: round {round_number + 1} {name}: {cpu[name][-1]:.2f} s CPU")
        base = statistics.median(cpu["g0"])
        for name, seconds in cpu.items():
            median = statistics.median(seconds)
            each = ", ".join(f"{s:.2f}" for s in seconds)
            print(f"{name:10} CPU median {median:7.2f} s = {median / base:.3f} x g0   ({each})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
