#!/usr/bin/env python3
"""Benchmark of `render`'s self-check (the name check) against the rest of render, in one run.

    /opt/rdna1-kmgr/bin/python bench/bench_render.py SOURCE [SOURCE...] [--runs N]

For each kernel source (a tree with the top Makefile and drivers/gpu/drm/amd, e.g. one the tests cached under
/var/cache/rdna1-kmgr-tests/src/), best of N runs, one after the other:
  render      render_series() with everything: facts, anchors, templates, diffs, name check;
  unchecked   the same with the tree's name scan and the check left out;
and prints the ratio render / unchecked and the check's seconds. The check reads amdgpu, amdkfd and include of
the tree (~18 MB for 6.12); it is meant to cost seconds where a wrong series would cost a failed build of
minutes (bench/RESULTS.md: a cold build is 4-5 min), so the number to watch is the check's seconds, not the ratio.
Nothing is written.
"""

import argparse
import time
from pathlib import Path
from unittest import mock

from rdna1_kmgr.render import name_check
from rdna1_kmgr.render.patch_series import render_series


def best_of(runs: int, checked: bool, source: Path) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        if checked:
            render_series(source)
        else:
            with mock.patch.object(name_check, "check"), mock.patch.object(name_check.TreeNames, "scan"):
                render_series(source)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for source in args.sources:
        full, bare = best_of(args.runs, True, source), best_of(args.runs, False, source)
        print(
            f"{source}: render {full:.2f} s, unchecked {bare:.2f} s, ratio {full / bare:.1f}, "
            f"name check {full - bare:.2f} s"
        )


if __name__ == "__main__":
    main()
