"""The Debian 13 tests and the `second_lane` ones, run by a second pytest beside the first.

The suite is mostly one-core work (QEMU's TCG, Python) on a two-core machine, and these tests share nothing on
the host with the others: they work in their own images and chroots (the experiment's kernel cells boot a copy of
Debian 12's image; they need its kernel's name, not its headers here), and their caches are the cache warmer's
(tests/cache_warmer.py) or the test cache's, under its locks. So when a root session holds both kinds, conftest
hands them to a child pytest started as the collection ends, and the first session runs the rest. The child
is an ordinary session of the same checkout (its own base temp folder, `-p no:cacheprovider`) that finds the
warmer's locks held and waits on them as any second session does; the first waits for it at its end, shows its
report and fails when it failed. `RDNA1_KMGR_TEST_ONE_LANE=1` keeps everything in one session.

One thing the second lane takes from the first: a build of the host's DKMS (HANDED_OVER), which its tests copy
into their own images and which only one session may make on the host. The first session makes it before its
first test (build_fixtures) and hands it over (`hand_over`): the command's JSON and a copy of the build's files
in the lane's folder; the second lane's fixture waits for it (`receive`) and never builds on the host.
"""

from __future__ import annotations

import json
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


# Session fixtures the first session makes and hands over to the second lane, when the lane's tests use them
HANDED_OVER = ("built_module_61",)
HANDOFF_ENV = "RDNA1_KMGR_TEST_HANDOFF"
CLOSED = "closed"  # written in the hand-off folder when the first session's tests are done


@dataclass(frozen=True)
class Lane:
    process: subprocess.Popen
    log: Path
    tests: int
    handoff: Path  # where the first session hands over what HANDED_OVER names
    wanted: frozenset[str]  # the HANDED_OVER fixtures the lane's tests use


def moved_items(config: pytest.Config, items: list[pytest.Item]) -> list[pytest.Item]:
    """The items this session hands to a second lane (none when it should run them itself)."""
    if os.geteuid() != 0 or os.environ.get(CHILD_ENV) or os.environ.get(ONE_LANE_ENV) or config.option.collectonly:
        return []
    moved = [item for item in items if any(item.get_closest_marker(name) for name in ("debian13", "second_lane"))]
    return moved if 0 < len(moved) < len(items) else []


def start(config: pytest.Config, items: list[pytest.Item], basetemp: Path) -> Lane:
    """The child pytest for `items`, writing its report to a log in this session's temp folder."""
    log = basetemp / "second-lane.log"
    handoff = basetemp / "handoff"
    handoff.mkdir()
    wanted = frozenset(name for name in HANDED_OVER if any(name in item.fixturenames for item in items))
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
            env={**os.environ, CHILD_ENV: str(os.getpid()), HANDOFF_ENV: str(handoff)},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: an interrupted session stops all of it
        )
    return Lane(process, log, len(items), handoff, wanted)


def in_child() -> bool:
    return bool(os.environ.get(CHILD_ENV))


def hand_over(lane: Lane, name: str, result: dict, files: list[Path]) -> None:
    """In the first session: `result` and a copy of `files` (absolute paths, trees or files, kept at the same
    paths under the copy's root) for the lane. The JSON comes last, through a rename: once it is there, all is."""
    root = lane.handoff / name
    for path in files:
        target = root / path.relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-a", str(path), str(target)], check=True)
    partial = lane.handoff / f".{name}.json"
    partial.write_text(json.dumps({**result, "files_root": str(root)}))
    partial.rename(lane.handoff / f"{name}.json")


def close_handoff(lane: Lane) -> None:
    """The first session's tests are done: a lane still waiting for a hand-over gets none."""
    (lane.handoff / CLOSED).touch()


def receive(name: str) -> dict:
    """In the second lane: what the first session handed over as `name` (its `files_root` is the copy's root).
    Fails the test when the first session's tests ended without it (its build failed: its report says why)."""
    folder = Path(os.environ[HANDOFF_ENV])
    while not (folder / f"{name}.json").exists():
        if (folder / CLOSED).exists():
            pytest.fail(f"the first session handed no {name} over: its own report says why")
        time.sleep(2)
    return json.loads((folder / f"{name}.json").read_text())


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
