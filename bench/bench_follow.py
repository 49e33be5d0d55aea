#!/usr/bin/env python3
"""Benchmark of following a point release, in one run (issue 27).

    /opt/rdna1-kmgr/bin/python bench/bench_follow.py [--older KREL] [--newer KREL] [-j N] [--keep]

Measures on this machine, one after the other, every quirk on, each tool build in a scratch folder (DKMS trees,
cache, logs, keys; the system's /usr/src, /var/lib/dkms and caches are not touched):
  raw       a raw `make M=` of the newer kernel's unpatched driver (bench_build's: the out-of-tree fix only,
            the config's -g, plain compiler);
  cold new  `rdna1-kmgr build` for the newer kernel with an empty cache (no kbuild tree, empty ccache);
  cold old  the same for the older kernel, in a second scratch folder;
  follow    the newer kernel's build in that second folder: what `follow` compiles once the package manager
            has installed the point release (a new kbuild tree; ccache holds the older kernel's build).
It prints the ratios against the targets (follow <= 0.3 x cold new; cold new <= 0.78 x raw), ccache's hits and
misses in the follow, and the disk: each kernel's unpacked source, DKMS package, kbuild tree and guest kernel as
vm-test fetches it, with the compiler cache, hard links counted once (du over all of them in one call): the
newer kernel as if alone, both kernels, and what the follow added.

Defaults: the newer kernel is the distribution's current one, the older the ABI before it that the archive
still has (Debian's 6.1.0-55 and -56 are the same Linux 6.1.192); both kernels' headers must be installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_build  # noqa: E402  (the raw kbuild, the tool's build and the stopwatch are the same as there)

from rdna1_kmgr.modbuild import package_build, signing  # noqa: E402
from rdna1_kmgr.render import quirk_catalog  # noqa: E402
from rdna1_kmgr.render.patch_series import render  # noqa: E402
from rdna1_kmgr.source import (
    kernel_source,  # noqa: E402
    target_kernel,  # noqa: E402
)

say = bench_build.say
PACKAGE = "rdna1-amdgpu"


def previous_abi(release: str) -> str:
    """The newest ABI before `release` whose headers the system's archive has (6.1.0-56-amd64 -> 6.1.0-55-amd64)."""
    base, abi, flavour = release.rsplit("-", 2)
    for number in range(int(abi) - 1, max(int(abi) - 8, 0), -1):
        older = f"{base}-{number}-{flavour}"
        if Path(f"/lib/modules/{older}/build/Makefile").is_file():
            return older
    sys.exit(f"bench: no installed headers of an ABI before {release}: apt-get install linux-headers-<older>")


def scratch(root: Path) -> dict[str, str]:
    return {
        **os.environ,
        "RDNA1_KMGR_DKMS_SOURCE_TREE": str(root / "usr-src"),
        "RDNA1_KMGR_DKMS_TREE": str(root / "dkms"),
        "RDNA1_KMGR_CACHE": str(root / "cache"),
        "RDNA1_KMGR_LOG": str(root / "log"),
        "RDNA1_KMGR_STATE": str(root / "state"),
    }


def into_cache(tree: Path, root: Path) -> Path:
    """The source where the tool keeps it (hard links: no copy, no time), as a fetch would have put it."""
    cached = root / "cache/src" / tree.name
    if not cached.exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-al", str(tree), str(cached)], check=True)
    return cached


def ccache_counts(root: Path) -> dict[str, int]:
    out = subprocess.run(
        ["ccache", "--print-stats"],
        env={**os.environ, "CCACHE_DIR": str(root / "cache/ccache")},
        capture_output=True,
        text=True,
    ).stdout
    return {k: int(v) for k, v in (line.split("\t") for line in out.splitlines()) if v.isdigit()}


def disk_bytes(*paths: Path) -> int:
    """du over all of them at once: a file hard-linked into several is counted once."""
    present = [str(p) for p in paths if p.exists()]
    du = subprocess.run(["du", "-s", "-c", "--block-size=1", *present], capture_output=True, text=True, check=True)
    return int(du.stdout.splitlines()[-1].split()[0])


def guest_kernel_of(release: str, root: Path) -> Path:
    """vm-test's guest kernel for `release`, fetched into the scratch cache as vm-test does (image .deb
    downloaded, unpacked, modules a guest loads kept, .deb deleted)."""
    os.environ["RDNA1_KMGR_CACHE"] = str(root / "cache")
    from rdna1_kmgr.vm import guest_kernel

    return guest_kernel.fetch_image(release).root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--newer", help="the kernel followed to (default: the distribution's current one)")
    parser.add_argument("--older", help="the kernel followed from (default: the ABI before --newer)")
    parser.add_argument("-j", "--jobs", type=int, default=package_build.default_jobs())
    parser.add_argument("--keep", action="store_true", help="keep the scratch folders")
    args = parser.parse_args()

    newer = target_kernel.resolve_kernel(args.newer).release
    older = args.older or previous_abi(newer)
    trees = {krel: kernel_source.fetch_kernel_source(krel) for krel in (older, newer)}
    quirks = sorted(quirk_catalog.load_quirks())
    work = Path(tempfile.mkdtemp(prefix="rdna1-kmgr-bench-follow-", dir="/var/tmp"))
    cold_root, follow_root = work / "cold-newer", work / "follow"
    try:
        keys = signing.KeyPair(work / "keys/bench.key", work / "keys/bench.der", "given")
        signing.generate(keys, subject="rdna1-kmgr bench key", days=2)
        series = work / "series"
        render(trees[newer], series, quirks)
        fix_patch = bench_build.out_of_tree_fix(series)
        say(
            f"bench: follow {older} -> {newer} (Linux {kernel_source.kernel_version(trees[older])} -> "
            f"{kernel_source.kernel_version(trees[newer])}), -j{args.jobs}, {os.cpu_count()} cores, load "
            f"{bench_build.load()}"
        )
        for tree in trees.values():
            bench_build.warm_page_cache(tree / bench_build.AMD)

        say("bench: raw kbuild of the newer kernel's unpatched source...")
        raw = bench_build.raw_kbuild(trees[newer], newer, args.jobs, work, fix_patch)
        say(f"bench: raw {raw.wall:.1f} s (load {bench_build.load()})")

        def build(krel: str, root: Path, what: str) -> dict:
            say(f"bench: {what}: rdna1-kmgr build --kernel {krel}...")
            result = bench_build.tool_build(krel, into_cache(trees[krel], root), args.jobs, keys, scratch(root), quirks)
            say(
                f"bench: {what} {result['wall_seconds']:.1f} s, {result['compiled_objects']} objects "
                f"(load {bench_build.load()})"
            )
            return result

        cold_new = build(newer, cold_root, "cold build of the newer kernel")
        shutil.rmtree(cold_root)  # its disk is not the follow's
        cold_old = build(older, follow_root, "cold build of the older kernel")
        before = ccache_counts(follow_root)
        follow = build(newer, follow_root, "follow to the newer kernel")
        after = ccache_counts(follow_root)

        say("bench: vm-test's guest kernels...")
        cache = follow_root / "cache"

        def kernel_paths(krel: str, result: dict) -> list[Path]:
            version = result["package_version"]
            return [
                cache / "src" / trees[krel].name,
                follow_root / "usr-src" / f"{PACKAGE}-{version}",
                follow_root / "dkms" / PACKAGE / version / krel,
                cache / "kbuild" / PACKAGE / krel,
                guest_kernel_of(krel, follow_root),
            ]

        older_paths, newer_paths = kernel_paths(older, cold_old), kernel_paths(newer, follow)
        ccache_bytes = disk_bytes(cache / "ccache")
        alone = disk_bytes(*newer_paths) + ccache_bytes  # as if the newer kernel were the only one
        both = disk_bytes(*older_paths, *newer_paths) + ccache_bytes
        adds = both - disk_bytes(*older_paths) - ccache_bytes  # what the follow added
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    hits = sum(after.get(k, 0) - before.get(k, 0) for k in ("direct_cache_hit", "preprocessed_cache_hit"))
    misses = after.get("cache_miss", 0) - before.get("cache_miss", 0)
    follow_ratio = follow["wall_seconds"] / cold_new["wall_seconds"]
    cold_ratio = cold_new["wall_seconds"] / raw.wall
    # CPU time (user + system of the builds' processes) moves much less than wall time with other load
    follow_cpu_ratio = follow["cpu_seconds"] / cold_new["cpu_seconds"]
    cold_cpu_ratio = cold_new["cpu_seconds"] / raw.cpu
    per_kernel = both / 2
    figures = {
        "older": older,
        "newer": newer,
        "jobs": args.jobs,
        "cores": os.cpu_count(),
        "raw_kbuild_seconds": round(raw.wall, 1),
        "cold_newer_seconds": round(cold_new["wall_seconds"], 1),
        "cold_newer_objects": cold_new["compiled_objects"],
        "cold_older_seconds": round(cold_old["wall_seconds"], 1),
        "follow_seconds": round(follow["wall_seconds"], 1),
        "follow_objects": follow["compiled_objects"],
        "follow_ccache_hits": hits,
        "follow_ccache_misses": misses,
        "follow_vs_cold": round(follow_ratio, 3),
        "follow_vs_cold_cpu": round(follow_cpu_ratio, 3),
        "follow_target": 0.3,
        "cold_vs_raw": round(cold_ratio, 3),
        "cold_vs_raw_cpu": round(cold_cpu_ratio, 3),
        "cold_target": 0.78,
        "one_kernel_alone_gb": round(alone / 2**30, 3),
        "two_kernels_gb": round(both / 2**30, 3),
        "per_kernel_of_two_gb": round(per_kernel / 2**30, 3),
        "follow_adds_mb": round(adds / 2**20, 1),
        "ccache_mb": round(ccache_bytes / 2**20, 1),
        "per_kernel_target_gb": 0.5,
        "load_average_at_end": bench_build.load(),
    }
    print(json.dumps(figures, indent=2))

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    print(
        f"follow {older} -> {newer}  {follow['wall_seconds']:7.1f} s = {follow_ratio:.3f} x cold build of the newer "
        f"({cold_new['wall_seconds']:.1f} s)   target <= 0.3: {verdict(follow_ratio <= 0.3)}   "
        f"(CPU {follow['cpu_seconds']:.1f} s = {follow_cpu_ratio:.3f} x {cold_new['cpu_seconds']:.1f} s)"
    )
    rate = hits / (hits + misses) if hits + misses else 0.0
    print(f"ccache in the follow     {hits} hits, {misses} misses ({rate:.0%} hit)")
    print(
        f"cold build               {cold_new['wall_seconds']:7.1f} s = {cold_ratio:.3f} x raw kbuild ({raw.wall:.1f} s)"
        f"   target <= 0.78: {verdict(cold_ratio <= 0.78)}   (CPU {cold_new['cpu_seconds']:.1f} s = "
        f"{cold_cpu_ratio:.3f} x {raw.cpu:.1f} s)"
    )
    print(
        f"disk, one kernel alone   {alone / 2**30:.3f} GB (source, DKMS package, kbuild tree, guest kernel, the "
        f"whole ccache of {ccache_bytes / 2**20:.0f} MB)   target <= 0.5 GB: {verdict(alone <= 0.5 * 2**30)}"
    )
    print(
        f"disk, both kernels       {both / 2**30:.3f} GB = {per_kernel / 2**30:.3f} GB a kernel   target <= 0.5 GB: "
        f"{verdict(per_kernel <= 0.5 * 2**30)}; the follow added {adds / 2**20:.0f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
