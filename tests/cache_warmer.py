"""The whole-system stories' caches, filled in the background while the rest of the suite runs.

With empty caches the stories need Debian 12's and Debian 13's images and their Secure Boot kinds, and trixie's
gcc-14 compile of a whole amdgpu module for 6.12 (and one for the backports' 7.x in the Debian 13 story's opt-in
tier, FULL_7X_ENV): about half an hour of work that needs no test. The suite is mostly one-core work (QEMU's TCG,
Python), and this machine has two, so conftest starts this program when the session has whole-system tests, at the
lowest CPU and I/O priority and in a cpu cgroup of its own that gets only the CPU time the tests leave idle
(`_idle_cpu_share` says why nice is not enough), and sorts the Debian 13 tests last. A test waits for the job it
needs (the image builders' own locks, `wait_for` for the compiles) and finds its cache filled. The result is the
same as the stories filling the caches themselves: the same image builders under the same locks, and the compiles by
the tool in a throwaway copy of the image, as the stories run them, into the compiler cache they share
(`trixie_build_cache`). A job whose result is there already costs nothing, so a warm run's warmer is done in
seconds.

Run by conftest as `python -m cache_warmer LOG`, with the tests' folder on sys.path. It takes every job's lock,
prints "ready" (or "busy" and ends, when another session's warmer holds them) and closes its standard output,
then does the jobs in order, releasing each lock when its job is done. SIGTERM (conftest sends it when the
session ends first) unwinds it: mounts undone, the copy deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from conftest import _using_test_cache, persistent_cache_root
from wholesystem import (
    ROOT_LOGIN_ENV,
    TRIXIE,
    base_image,
    install_by_readme,
    new_system,
    release_image,
    trixie_build_cache,
    trixie_kernel,
    uefi_sb_image,
)

# The Debian 13 story's opt-in tier: follow to trixie-backports' 7.x, compiled natively (test_debian13_story)
FULL_7X_ENV = "RDNA1_KMGR_TEST_DEBIAN13_7X"

# In the order the suite needs them: Debian 12's image (the kernel-cells boots, the boot guard story), its Secure
# Boot kind, then the Debian 13 ones (test_debian13_story, then test_secure_boot's Debian 13 run, sorted last).
JOBS = ("debian12-image", "debian12-sb-image", "trixie-image", "trixie-builds", "trixie-sb-image")


def _lock_file(job: str) -> Path:
    folder = persistent_cache_root() / "warm"
    folder.mkdir(exist_ok=True)
    return folder / f"{job}.lock"


def wait_for(job: str) -> None:
    """Returns once no warmer is doing `job` (at once when none runs)."""
    assert job in JOBS, job
    with open(_lock_file(job), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)


def backports_kernel() -> str | None:
    """The release trixie-backports' linux-headers-amd64 points to today (7.x), or None when it has none."""
    from rdna1_kmgr.core.errors import KmgrError
    from rdna1_kmgr.source import debian_archive

    with _using_test_cache():
        try:
            return debian_archive.current_kernel_abi("trixie-backports")
        except KmgrError:
            return None


def _built_stamp(kernel: str) -> Path:
    """Kept in the compiler cache's own folder: emptying the cache empties the stamps with it."""
    (cache,) = trixie_build_cache()
    return cache / f"warmed-{kernel}"


def _say(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


def _build_trixie_kernels(image: Path, kernels: list[str]) -> None:
    """The tool's build of each kernel in a copy of the trixie image, into the stories' compiler cache: the
    README's ./install.sh of this checkout, then `rdna1-kmgr build` as a root login runs it (the first kernel is
    the image's own; the others get their headers from apt first, as follow's apt run brings them)."""
    with tempfile.TemporaryDirectory(prefix="warm-trixie-", dir=persistent_cache_root()) as tmp:
        system = new_system(image, Path(tmp))
        with system.entered(trixie_build_cache()) as root:
            install_by_readme(root, ROOT_LOGIN_ENV)
        for kernel in kernels:
            if _built_stamp(kernel).exists():
                continue
            steps = f"rdna1-kmgr build --kernel {kernel} --yes"
            if kernel != kernels[0]:
                steps = (
                    f"apt-get install -y -t trixie-backports --no-install-recommends linux-headers-{kernel} && {steps}"
                )
            _say(f"building {kernel}")
            proc = system.chroot(["/bin/bash", "-c", steps], 5400, ROOT_LOGIN_ENV, trixie_build_cache(), kernel)
            if proc.returncode != 0:  # the story meets the same failure and says it; nothing is stamped
                _say(f"the build of {kernel} failed (exit status {proc.returncode}): {system.logs / kernel}.log")
                return
            _built_stamp(kernel).touch()
            _say(f"built {kernel}")


def bookworm_kernel() -> str:
    """The kernel release of Debian 12's image: bookworm-security's current one, as `headers_61` names it."""
    from rdna1_kmgr.source import debian_archive

    with _using_test_cache():
        return debian_archive.current_kernel_abi("bookworm-security")


def _trixie_builds() -> None:
    kernel = trixie_kernel()
    kernels = [kernel]
    if os.environ.get(FULL_7X_ENV) == "1":
        kernels += [k for k in [backports_kernel()] if k and k.startswith("7.")]
    if not all(_built_stamp(k).exists() for k in kernels):
        _build_trixie_kernels(release_image(TRIXIE, kernel), kernels)


FILL = {
    "debian12-image": lambda: base_image(bookworm_kernel()),
    "debian12-sb-image": lambda: uefi_sb_image(bookworm_kernel()),
    "trixie-image": lambda: release_image(TRIXIE, trixie_kernel()),
    "trixie-builds": _trixie_builds,
    "trixie-sb-image": lambda: uefi_sb_image(trixie_kernel(), TRIXIE),
}


@contextlib.contextmanager
def _all_locks() -> Iterator[dict[str, IO[str]] | None]:
    """Every job's lock, or None when another session's warmer holds them (it fills the same caches)."""
    locks = {job: open(_lock_file(job), "w") for job in JOBS}
    try:
        for lock in locks.values():
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield None
                return
        yield locks
    finally:
        for lock in locks.values():
            lock.close()


# The cpu cgroup the warmer and everything it starts run in, one per warmer (named by its pid): cgroup v1's cpu
# hierarchy or the unified one.
CPU_GROUP_PREFIX = "rdna1-kmgr-test-warmer-"
CPU_HIERARCHIES = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup"))


def _cpu_group_base() -> Path | None:
    for base in CPU_HIERARCHIES:
        if not (base / "cgroup.procs").exists():
            continue
        controllers = base / "cgroup.subtree_control"  # only the unified hierarchy has it
        if controllers.exists() and "cpu" not in controllers.read_text().split():
            continue
        return base
    return None


@contextlib.contextmanager
def _idle_cpu_share() -> Iterator[str]:
    """Run the block in a cpu cgroup that gets only what the tests leave idle; yields what was done, for the log.

    nice 19 alone is not enough. With autogroups on (kernel.sched_autogroup_enabled; Debian's kernels have them,
    on by default) the scheduler first shares the CPUs equally between sessions and applies nice only inside one,
    and every program the tool starts gets a session of its own (core/process_tree.py), so the compilers here
    took half the CPUs from a test's two-thread QEMU. A cgroup's tasks are outside autogroups, and their sessions
    with them. bench/bench_warmer_share.py measures the difference (bench/RESULTS.md)."""
    base = _cpu_group_base()
    group = base / f"{CPU_GROUP_PREFIX}{os.getpid()}" if base else None
    try:
        if group is None:
            raise OSError("no cpu cgroup hierarchy is mounted with the cpu controller")
        for left in base.glob(CPU_GROUP_PREFIX + "*"):  # an earlier warmer's, once its last program ended
            with contextlib.suppress(OSError):  # busy: a live warmer's
                left.rmdir()
        group.mkdir()
        knob = next(name for name in ("cpu.idle", "cpu.shares", "cpu.weight") if (group / name).exists())
        (group / knob).write_text({"cpu.idle": "1", "cpu.shares": "2", "cpu.weight": "1"}[knob])
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except (OSError, StopIteration) as err:
        yield f"not in a cpu cgroup ({err}): the tests' boots share the CPUs with these jobs"
        return
    try:
        yield f"in cpu cgroup {group} ({knob} set)"
    finally:
        # Out with the warmer go the programs still ending: the runner's keeper (core/keeper.py), which outlives
        # the warmer by a moment, and after SIGTERM a job's last programs.
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # it ended meanwhile
                (base / "cgroup.procs").write_text(pid)
        try:
            group.rmdir()
        except OSError as err:  # a program started meanwhile; the next warmer removes it once empty
            _say(f"{group} is left ({err.strerror}): programs in it: {(group / 'cgroup.procs').read_text().split()}")


def main(log: Path) -> int:
    def stop(*_) -> None:
        _say("stopped: the session ended first")
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    with _all_locks() as locks, contextlib.ExitStack() as stack:
        if locks is None:
            print("busy", flush=True)  # the tests wait on that warmer's locks instead
            return 0
        print("ready", flush=True)
        out = open(log, "a")
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        _say(stack.enter_context(_idle_cpu_share()))
        for job in JOBS:
            started = time.monotonic()
            _say(job)
            try:
                FILL[job]()
            except pytest.skip.Exception as skip:
                _say(f"{job}: skipped: {skip}")
            except Exception as err:  # the test that needs it meets it again, in the foreground, and says it
                _say(f"{job} failed: {err!r}")
            _say(f"{job} done in {time.monotonic() - started:.0f} s")
            locks.pop(job).close()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
