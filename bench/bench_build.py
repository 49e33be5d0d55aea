#!/usr/bin/env python3
"""Benchmark of `rdna1-kmgr build` against a raw kbuild of the same source, in one run.

    /opt/rdna1-kmgr/bin/python bench/bench_build.py [--kernel KREL] [--source TREE] [-j N] [--quirk-off ID]

Measures on this machine, one after the other:
  raw      `make -C /lib/modules/KREL/build M=<copy>/drivers/gpu/drm/amd/amdgpu FULL_AMD_PATH=... modules` of the
           unpatched driver source, with only the out-of-tree build fix applied (without it amdgpu does not
           build outside the kernel tree at all), plain compiler, fresh copy;
  cold     `rdna1-kmgr build` of every quirk: render, DKMS package, dkms add/build (sign), verify; empty cache
           (no kbuild tree, empty ccache when ccache is installed), fresh DKMS trees;
  rebuild  `rdna1-kmgr build` again with one quirk switched off: a new patch set, so a new DKMS package version.
and prints the ratios against the targets: cold <= 0.8 x raw, rebuild <= 0.15 x cold, and the size of what each
leaves on disk: the raw build's tree, and the tool's persistent kbuild tree (kept per kernel on the owner's disk).
The raw kbuild compiles with the kernel config's -g; the tool compiles without debug info (KCFLAGS=-g0, see
dkms/rdna1-kbuild), except where the kernel makes module BTF.

Everything happens in a scratch folder (DKMS trees, cache, logs, keys) that is removed afterwards; the system's
/usr/src, /var/lib/dkms and caches are not touched. The source is Debian's for KREL (fetched into the normal
cache when missing) unless --source names a tree.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rdna1_kmgr.modbuild import package_build, signing
from rdna1_kmgr.render import quirk_catalog
from rdna1_kmgr.render.patch_series import render, render_series
from rdna1_kmgr.source import kernel_source, target_kernel

AMD = "drivers/gpu/drm/amd"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class Stopwatch:
    """Wall time, and the CPU time (user + system) of the child processes that ran meanwhile: on a shared
    machine the wall time moves with the others' load, the CPU time much less."""

    size: dict  # what the measured build left on disk (tree_size), where the caller records it

    def __enter__(self):
        self.wall = time.monotonic()
        self.cpu = self._children_cpu()
        return self

    def __exit__(self, *exc):
        self.wall = time.monotonic() - self.wall
        self.cpu = self._children_cpu() - self.cpu

    @staticmethod
    def _children_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime


def warm_page_cache(tree: Path) -> None:
    """Read the source once so neither contestant pays for the disk."""
    for path in tree.rglob("*"):
        if path.is_file():
            path.read_bytes()


def tree_size(tree: Path) -> dict:
    """What a build tree holds: everything on disk (du, each inode once) and its objects and modules alone."""
    du = subprocess.run(["du", "-s", "--block-size=1", str(tree)], capture_output=True, text=True, check=True)
    built = sum(p.stat().st_size for p in tree.rglob("*") if p.suffix in (".o", ".ko") and p.is_file())
    return {"disk_mb": round(int(du.stdout.split()[0]) / 2**20, 1), "objects_mb": round(built / 2**20, 1)}


def out_of_tree_fix(series: Path) -> Path:
    """The rendered series' out-of-tree build fix: its first patch."""
    return series / (series / "series").read_text().split()[0]


def unpatched_copy(tree: Path, copy: Path, fix_patch: Path) -> Path:
    """A copy of the tree's amd folder under `copy`, unpatched but for the out-of-tree build fix (without it
    amdgpu does not build outside the kernel tree at all); the copy's amd folder."""
    shutil.copytree(tree / AMD, copy / AMD, symlinks=True)
    subprocess.run(["patch", "-p1", "-s", "-d", str(copy), "-i", str(fix_patch)], check=True)
    return copy / AMD


def raw_kbuild(tree: Path, kernel: str, jobs: int, work: Path, fix_patch: Path) -> Stopwatch:
    copy = work / "raw"
    unpatched_copy(tree, copy, fix_patch)
    command = [
        "make",
        f"-j{jobs}",
        "-C",
        f"/lib/modules/{kernel}/build",
        f"M={copy / AMD}/amdgpu",
        f"FULL_AMD_PATH={copy / AMD}",
        "modules",
    ]
    with open(work / "raw.log", "w") as log, Stopwatch() as watch:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT)
    watch.size = tree_size(copy)
    shutil.rmtree(copy)
    return watch


def tool_build(kernel: str, tree: Path, jobs: int, keys: signing.KeyPair, env: dict, quirks: list[str]) -> dict:
    cli = Path(sys.executable).parent / "rdna1-kmgr"
    command = [
        str(cli),
        "build",
        "--kernel",
        kernel,
        "--source",
        str(tree),
        "-j",
        str(jobs),
        "--no-install",
        "--key",
        str(keys.key),
        "--cert",
        str(keys.cert),
        "--json",
    ]
    for quirk in quirks:
        command += ["--quirk", quirk]
    with Stopwatch() as watch:
        proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench: {' '.join(command)} failed:\n{proc.stderr}")
    result = json.loads(proc.stdout)
    result["wall_seconds"], result["cpu_seconds"] = watch.wall, watch.cpu
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", help="kernel release (default: the distribution's current one)")
    parser.add_argument("--source", help="unpacked kernel source tree (default: Debian's for the kernel)")
    parser.add_argument("-j", "--jobs", type=int, default=package_build.default_jobs())
    parser.add_argument(
        "--quirk-off", help="the quirk to switch off for the rebuild (default: the last one the source carries)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args()

    kernel = target_kernel.resolve_kernel(args.kernel).release
    tree = kernel_source.checked_tree(Path(args.source)) if args.source else kernel_source.fetch_kernel_source(kernel)
    quirk_ids = sorted(quirk_catalog.load_quirks())
    # The default is the last quirk this source carries: switching off one it leaves out (cwsr-size below
    # 6.12) would give the same patch set, and there would be no rebuild to measure.
    left_out = {q.id for q in render_series(tree, quirk_ids)[1].left_out}
    off = args.quirk_off or [q for q in quirk_ids if q not in left_out][-1]
    kept = [q for q in quirk_ids if q != off]

    work = Path(tempfile.mkdtemp(prefix="rdna1-kmgr-bench-", dir="/var/tmp"))
    env = {
        **os.environ,
        "RDNA1_KMGR_DKMS_SOURCE_TREE": str(work / "usr-src"),
        "RDNA1_KMGR_DKMS_TREE": str(work / "dkms"),
        "RDNA1_KMGR_CACHE": str(work / "cache"),
        "RDNA1_KMGR_LOG": str(work / "log"),
        "RDNA1_KMGR_STATE": str(work / "state"),
    }
    try:
        # The tool finds a Debian source in its cache; so does the bench (hard links: no copy, no time).
        cached = work / "cache/src" / tree.name
        cached.parent.mkdir(parents=True)
        subprocess.run(["cp", "-al", str(tree), str(cached)], check=True)
        tree = cached
        keys = signing.KeyPair(work / "keys/bench.key", work / "keys/bench.der", "given")
        signing.generate(keys, subject="rdna1-kmgr bench key", days=2)
        series = work / "series"
        render(tree, series, quirk_ids)
        fix_patch = out_of_tree_fix(series)
        ccache = "on (cold)" if package_build.ccache_env() else "off (not installed)"
        say(
            f"bench: kernel {kernel}, source {tree} (Linux {kernel_source.kernel_version(tree)}), -j{args.jobs}, "
            f"{os.cpu_count()} cores, ccache {ccache}, load {load()}"
        )
        warm_page_cache(tree / AMD)

        say("bench: raw kbuild of the unpatched source (out-of-tree fix only)...")
        raw_watch = raw_kbuild(tree, kernel, args.jobs, work, fix_patch)
        raw, raw_cpu = raw_watch.wall, raw_watch.cpu
        say(f"bench: raw {raw:.1f} s, CPU {raw_cpu:.1f} s (load {load()})")

        say(f"bench: cold rdna1-kmgr build, quirks {' '.join(quirk_ids)}...")
        cold = tool_build(kernel, tree, args.jobs, keys, env, quirk_ids)
        say(
            f"bench: cold {cold['wall_seconds']:.1f} s, CPU {cold['cpu_seconds']:.1f} s, "
            f"{cold['compiled_objects']} objects (load {load()})"
        )
        kbuild_size = tree_size(work / "cache" / "kbuild" / "rdna1-amdgpu" / kernel)
        say(
            f"bench: kbuild tree {kbuild_size['disk_mb']} MB on disk, "
            f"objects and module {kbuild_size['objects_mb']} MB; "
            f"raw build tree {raw_watch.size['disk_mb']} MB, objects and module {raw_watch.size['objects_mb']} MB"
        )

        say(f"bench: rebuild with {off} switched off (quirks {' '.join(kept)})...")
        rebuild = tool_build(kernel, tree, args.jobs, keys, env, kept)
        say(
            f"bench: rebuild {rebuild['wall_seconds']:.1f} s, CPU {rebuild['cpu_seconds']:.1f} s, "
            f"{rebuild['compiled_objects']} objects (load {load()})"
        )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    assert rebuild["package_version"] != cold["package_version"]
    cold_ratio = cold["wall_seconds"] / raw
    rebuild_ratio = rebuild["wall_seconds"] / cold["wall_seconds"]
    figures = {
        "kernel": kernel,
        "kernel_version": cold["kernel_version"],
        "jobs": args.jobs,
        "cores": os.cpu_count(),
        "ccache": ccache,
        "load_average_at_end": load(),
        "raw_kbuild_seconds": round(raw, 1),
        "raw_kbuild_cpu_seconds": round(raw_cpu, 1),
        "cold_build_seconds": round(cold["wall_seconds"], 1),
        "cold_build_cpu_seconds": round(cold["cpu_seconds"], 1),
        "cold_vs_raw_cpu": round(cold["cpu_seconds"] / raw_cpu, 3),
        "cold_objects": cold["compiled_objects"],
        "cold_vs_raw": round(cold_ratio, 3),
        "cold_target": 0.8,
        "raw_tree_mb": raw_watch.size,
        "kbuild_tree_mb": kbuild_size,
        "rebuild_quirk_off": off,
        "rebuild_seconds": round(rebuild["wall_seconds"], 1),
        "rebuild_cpu_seconds": round(rebuild["cpu_seconds"], 1),
        "rebuild_vs_cold_cpu": round(rebuild["cpu_seconds"] / cold["cpu_seconds"], 3),
        "rebuild_objects": rebuild["compiled_objects"],
        "rebuild_vs_cold": round(rebuild_ratio, 3),
        "rebuild_target": 0.15,
    }
    print(json.dumps(figures, indent=2))
    print(
        f"cold build     {cold['wall_seconds']:7.1f} s = {cold_ratio:.3f} x raw kbuild ({raw:.1f} s)   "
        f"target <= 0.8: {'met' if cold_ratio <= 0.8 else 'MISSED'}   "
        f"(CPU {cold['cpu_seconds']:.1f} s = {cold['cpu_seconds'] / raw_cpu:.3f} x {raw_cpu:.1f} s)"
    )
    print(
        f"kbuild tree    {kbuild_size['disk_mb']} MB on disk, objects and module {kbuild_size['objects_mb']} MB "
        f"(raw kbuild's: {raw_watch.size['disk_mb']} MB, {raw_watch.size['objects_mb']} MB)"
    )
    print(
        f"quirk-off      {rebuild['wall_seconds']:7.1f} s = {rebuild_ratio:.3f} x cold build   "
        f"target <= 0.15: {'met' if rebuild_ratio <= 0.15 else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
