#!/usr/bin/env python3
"""Benchmark of the cache warmer's CPU share: how much of a test's speed a background job leaves it.

    /opt/rdna1-kmgr/bin/python bench/bench_warmer_share.py [--rounds N] [--seconds S]

A two-thread spinner stands for a test's TCG boot (QEMU runs a vCPU thread and its I/O thread), another
two-thread spinner for the warmer's compiles. Each round measures the foreground's work in S seconds alone, then
against the background started the two ways a warmer can be: in a session of its own at nice 19 (as conftest
started it before), and inside tests/cache_warmer.py's `_idle_cpu_share` (a cpu cgroup that gets what is left
idle). Prints each round's ratio to the foreground alone, and the medians. Root only (it writes cgroups).
"""

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
SPIN = "import time\nend = time.monotonic() + {seconds}\nn = 0\nwhile time.monotonic() < end:\n    n += 1\nprint(n)\n"


def foreground(seconds: float) -> int:
    """The spins two threads (processes) of this session manage in `seconds`."""
    with multiprocessing.Pool(2) as pool:
        return sum(pool.map(_spin, [seconds, seconds]))


def _spin(seconds: float) -> int:
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return n


def background(how: str, seconds: float) -> subprocess.Popen:
    spin = SPIN.format(seconds=seconds)
    pair = f"import subprocess, sys\nps = [subprocess.Popen([sys.executable, '-c', {spin!r}]) for _ in range(2)]\n"
    pair += "[p.wait() for p in ps]\n"
    if how == "cgroup":
        pair = (
            "import sys\nsys.path.insert(0, sys.argv[1])\nimport cache_warmer\n"
            "with cache_warmer._idle_cpu_share() as done:\n    print(done, file=sys.stderr)\n"
            + "".join("    " + line + "\n" for line in pair.splitlines())
        )
    argv = ["nice", "-n19", sys.executable, "-c", pair, str(TESTS)]
    return subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_warmer_share.py: writes cgroups: run it as root")
    ratios: dict[str, list[float]] = {"session nice 19": [], "idle cgroup": []}
    for number in range(1, args.rounds + 1):
        alone = foreground(args.seconds)
        row = []
        for name, how in (("session nice 19", "session"), ("idle cgroup", "cgroup")):
            bg = background(how, args.seconds + 3)
            time.sleep(1.5)  # both spinners running
            ratios[name].append(foreground(args.seconds) / alone)
            bg.wait()  # it ends by itself, so the cgroup is left empty and removed
            row.append(f"{name} {ratios[name][-1]:.2f}x")
        print(f"round {number}, the foreground's speed against a background job as a ratio to alone: " + ", ".join(row))
    print(", ".join(f"{name}: median {statistics.median(r):.2f}x" for name, r in ratios.items()))


if __name__ == "__main__":
    main()
