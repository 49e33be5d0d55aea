"""tests/cache_warmer.py's CPU share: the warmer and every program it starts, sessions of their own included,
run in a cpu cgroup that gets only idle time, and the cgroup is gone when the warmer ends. (How much speed that
leaves a test is measured by bench/bench_warmer_share.py, not here.)"""

import os
import subprocess
import sys
from pathlib import Path

import cache_warmer
import pytest

# Run in a child: the block moves the process it runs in. It prints the cgroup of a program started in a session
# of its own (as the tool's runner starts every program) from inside the block, runs one through the runner (its
# keeper process lives on until this process ends), then says whether the group is gone.
CHILD = """
import os, subprocess, sys
sys.path.insert(0, sys.argv[1])
import cache_warmer
from rdna1_kmgr.core import runner
with cache_warmer._idle_cpu_share() as done:
    print(done)
    print(subprocess.run(["cat", "/proc/self/cgroup"], start_new_session=True, capture_output=True, text=True).stdout)
    runner.run(["true"])  # the tool's runner, whose keeper outlives the block
print("left:", (cache_warmer._cpu_group_base() / f"{cache_warmer.CPU_GROUP_PREFIX}{os.getpid()}").exists())
"""


def cpu_cgroup_of(proc_cgroup: str) -> str:
    """The cpu controller's path in a /proc/PID/cgroup text (cgroups(7): "ID:controllers:path" a line; the
    unified hierarchy's line is "0::path")."""
    paths = {}
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths.get("cpu", paths.get(""))


def test_the_warmer_s_programs_run_in_its_idle_cpu_cgroup_and_it_is_removed_after():
    if os.geteuid() != 0:
        pytest.skip("writing cgroups needs root")
    if cache_warmer._cpu_group_base() is None:
        pytest.skip("no cpu cgroup hierarchy with the cpu controller is mounted here")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(Path(__file__).parent)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    said, *rest = out.splitlines()
    assert said.startswith("in cpu cgroup "), said
    # its own group (a session's warmer, running meanwhile, has another)
    assert cpu_cgroup_of("\n".join(rest[:-1]).strip()) == f"/rdna1-kmgr-test-warmer-{child.pid}"
    assert rest[-1] == "left: False"
    assert not cpu_cgroup_of(Path("/proc/self/cgroup").read_text()).startswith("/rdna1-kmgr-test-warmer-")


def test_without_a_cgroup_the_warmer_says_so_and_goes_on(monkeypatch, tmp_path):
    monkeypatch.setattr(cache_warmer, "CPU_HIERARCHIES", (tmp_path / "none",))
    with cache_warmer._idle_cpu_share() as done:
        assert done.startswith("not in a cpu cgroup (no cpu cgroup hierarchy")
