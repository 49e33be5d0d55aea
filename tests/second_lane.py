"""The Debian 13 tests and the `second_lane` ones, run by a second pytest beside the first.

The suite is mostly one-core work (QEMU's TCG, Python) on a two-core machine, and these tests share nothing on
the host with the others: they work in their own images and chroots (the experiment's kernel cells boot a copy of
Debian 12's image; they need its kernel's name, not its headers here), and their caches are the cache warmer's
(tests/cache_warmer.py) or the test cache's, under its locks. So when a root session holds both kinds, conftest
hands them to a child pytest started as the collection ends, and the first session runs the rest. The child
is an ordinary session of the same checkout (its own base temp folder, `-p no:cacheprovider`) that finds the
warmer's locks held and waits on them as any second session does; the first waits for it at its end, shows its
report and fails when it failed. `RDNA1_KMGR_TEST_ONE_LANE=1` keeps everything in one session.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

# Set in the child, to the first session's pid: it runs what it was given and starts no lane of its own
CHILD_ENV = "RDNA1_KMGR_TEST_LANE"
ONE_LANE_ENV = "RDNA1_KMGR_TEST_ONE_LANE"


@dataclass(frozen=True)
class Lane:
    process: subprocess.Popen
    log: Path
    tests: int


def moved_items(config: pytest.Config, items: list[pytest.Item]) -> list[pytest.Item]:
    """The items this session hands to a second lane (none when it should run them itself)."""
    if os.geteuid() != 0 or os.environ.get(CHILD_ENV) or os.environ.get(ONE_LANE_ENV) or config.option.collectonly:
        return []
    moved = [item for item in items if any(item.get_closest_marker(name) for name in ("debian13", "second_lane"))]
    return moved if 0 < len(moved) < len(items) else []


def start(config: pytest.Config, items: list[pytest.Item], basetemp: Path) -> Lane:
    """The child pytest for `items`, writing its report to a log in this session's temp folder."""
    log = basetemp / "second-lane.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-P",  # not the checkout's package from the current folder: the one this session tests
                "-m",
                "pytest",
                "-ra",
                "-p",
                "no:cacheprovider",
                f"--basetemp={basetemp / 'second-lane'}",
                *(item.nodeid for item in items),
            ],
            cwd=config.rootpath,
            env={**os.environ, CHILD_ENV: str(os.getpid())},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: an interrupted session stops all of it
        )
    return Lane(process, log, len(items))


def finish(lane: Lane, interrupted: bool) -> int:
    """Waits for the child (stopping it like Ctrl-C when this session was interrupted); its exit status."""
    if interrupted and lane.process.poll() is None:
        os.killpg(lane.process.pid, signal.SIGINT)  # pytest unwinds its fixtures: guests stopped, mounts undone
        try:
            return lane.process.wait(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(lane.process.pid, signal.SIGKILL)
    return lane.process.wait()


def counts(log: Path) -> dict[str, int]:
    """The child's closing line as counts ("3 passed, 1 failed in 9.1s" -> {"passed": 3, "failed": 1})."""
    lines = log.read_text().strip().splitlines()
    last = lines[-1] if lines else ""
    return {word: int(number) for number, word in re.findall(r"(\d+) ([a-z]+)", last.split(" in ")[0])}


def follow_the_first_session() -> None:
    """In the child: stop like Ctrl-C when the first session stops it, or when the first session is gone however
    it died (SIGKILL, a timeout's SIGTERM), so that no guest or mount outlives the run."""
    # A run started in the background by a shell ignores SIGINT, and its children inherit that: Ctrl-C's unwinding
    # is this lane's way to stop, so it is taken back
    signal.signal(signal.SIGINT, signal.default_int_handler)
    first = int(os.environ.get(CHILD_ENV, "0") or 0)
    if first <= 1:
        return

    def watch() -> None:
        while os.getppid() == first:
            time.sleep(2)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=watch, name="second-lane-watch", daemon=True).start()
