#!/usr/bin/env python3
"""Benchmark of the power-cut test's host side (issue 52): how many crash points a second it replays and checks.

    /opt/rdna1-kmgr/bin/python bench/bench_power_cut.py [--image DISK] [--keep]

Root only (loop devices, mount, QEMU). One recording boot (TCG, 3-5 min) of the whole-system Debian 12 image
the tests cached (tests/wholesystem.py; --image names another): with its disk behind QEMU's blklogwrites, the
guest remakes its kernel's initramfs with the real update-initramfs and sets a GRUB environment variable
between the two marks tests/power_cut.py writes. Then, in one run, each stage over the log's crash points:

  replay     one pass of tests/log_writes.py's Replayer through every crash point (a sparse copy of the disk)
  snapshot   the same pass with a reflink copy of the disk at every point of the window (the test's way)
  survey     power_cut.survey at every point of the window: two loop mounts (without and with ext4's journal
             replayed), grubenv parsed in both, the tool's journal read

Prints each stage's points per second and the survey's cost as a multiple of the replay's per point. The
rollback check (a chroot running `rdna1-kmgr rollback`, then every watched file hashed) is not here: it needs
the tool's install recorded (tests/install/test_install_power_cut.py prints its time per point).
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
DEFAULT_CACHE = Path("/var/cache/rdna1-kmgr-tests/wholesystem")


def cached_image() -> Path:
    cache = Path(os.environ.get("RDNA1_KMGR_TEST_CACHE", DEFAULT_CACHE.parent)) / "wholesystem"
    images = sorted(cache.glob("debian12-*-r*.img"), key=lambda p: p.stat().st_mtime)
    images = [p for p in images if "uefi" not in p.name]
    if not images:
        sys.exit(f"bench: no cached Debian 12 image in {cache}: run the tests once, or give --image")
    return images[-1]


def kernel_of(image: Path) -> str:
    """debian12-6.1.0-56-amd64-r2.img -> 6.1.0-56-amd64"""
    return image.name.removeprefix("debian12-").rsplit("-r", 1)[0]


def say(line: str) -> None:
    print(f"bench: {line}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", type=Path, help="a whole-system Debian 12 disk (default: the tests' cached one)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (log, boot logs)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: run as root (loop devices, mount, QEMU)")
    sys.path.insert(0, str(TESTS))
    log_writes = importlib.import_module("log_writes")
    power_cut = importlib.import_module("power_cut")
    wholesystem = importlib.import_module("wholesystem")

    image = args.image or cached_image()
    kernel = kernel_of(image)
    scratch = Path(tempfile.mkdtemp(prefix="bench-power-cut-", dir="/var/tmp"))
    area = None
    try:
        (scratch / "logs").mkdir()
        disk = scratch / "disk.img"
        log_writes.sparse_copy(image, disk)
        area = power_cut.ReflinkArea(scratch, 32 << 30)
        step = (
            "set -e\nsync\n"
            + power_cut.mark("run-start")
            + f"update-initramfs -c -k {kernel}\ngrub-editenv /boot/grub/grubenv set bench=1\n"
            + power_cut.mark("run-end")
        )
        say(f"recording a boot of {image.name} (update-initramfs -c -k {kernel} in the guest)")
        started = time.monotonic()
        recorded = wholesystem.WriteLog(scratch / "writes.log", area.path / "base.img", area.path / "end.img")
        base = recorded.start
        boot = wholesystem.System(disk, scratch / "logs").boot(step, timeout=2400, write_log=recorded)
        recorded.end.unlink()
        if boot.timed_out or boot.step_rc != 0:
            sys.exit(f"bench: the recording boot failed (rc {boot.step_rc}):\n{boot.tail(30)}")
        log = log_writes.read_log(scratch / "writes.log")
        start, end, points = power_cut.install_window(log)
        window = [p for p in points if start <= p <= end]
        say(
            f"recorded in {time.monotonic() - started:.0f} s: {len(log.entries)} entries, {len(points)} crash points, "
            f"{len(window)} between the marks"
        )

        started = time.monotonic()
        replayed = area.path / "replayed.img"
        log_writes.sparse_copy(base, replayed)
        with log_writes.Replayer(log, replayed) as replayer:
            for point in points:
                replayer.advance_through(point)
        replay = time.monotonic() - started
        replayed.unlink()

        started = time.monotonic()
        snapshots = power_cut.snapshot_points(log, base, area, set(window))
        snapshot = time.monotonic() - started

        started = time.monotonic()
        for point in window:
            power_cut.survey(point, snapshots[point], kernel)
        surveyed = time.monotonic() - started

        rates = {
            "replay": len(points) / replay,
            "snapshot": len(window) / snapshot,
            "survey": len(window) / surveyed,
        }
        for stage, rate in rates.items():
            say(f"{stage:9} {rate:8.1f} points/s")
        say(f"a survey costs {rates['replay'] / rates['survey']:.0f}x a replay step per point")
    finally:
        if area is not None:
            area.close()
        if args.keep:
            say(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
