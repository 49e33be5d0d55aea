"""Session fixtures with a real amdgpu build: `rdna1-kmgr build --kernel <release> --yes --json` as a user runs it.

Each builds once per test session (minutes the first time on a machine; later sessions find the same DKMS
package built and reuse it after checking it again) and returns the command's JSON. The VM tests use the
module it names. Sources come through the persistent test cache that `real_source_*` use, so they are
downloaded and unpacked once. The build itself uses the system's DKMS trees and signing key, like a user's.

tests/conftest.py lists this module in `pytest_plugins`, so every test module can ask for them.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import second_lane
from conftest import LANE, persistent_cache_root
from wholesystem import copy_into


def run_build(release: str) -> dict:
    if os.geteuid() != 0:
        pytest.skip("a real DKMS build writes /usr/src and /var/lib/dkms: root only")
    cli = Path(sys.executable).parent / "rdna1-kmgr"
    env = {**os.environ, "RDNA1_KMGR_CACHE": str(persistent_cache_root())}
    for moved in ("RDNA1_KMGR_DKMS_TREE", "RDNA1_KMGR_DKMS_SOURCE_TREE"):
        env.pop(moved, None)
    proc = subprocess.run(
        [str(cli), "build", "--kernel", release, "--yes", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    if proc.returncode != 0:
        pytest.fail(f"rdna1-kmgr build --kernel {release} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    result = json.loads(proc.stdout)
    result["_stderr"] = proc.stderr
    return result


def build_files(result: dict) -> list[Path]:
    """What a build leaves on the host that a whole-system test copies into its image: the DKMS package's source
    and its built tree, and DKMS's signing certificate."""
    version = result["package_version"]
    return [Path("/usr/src") / f"rdna1-amdgpu-{version}", Path("/var/lib/dkms/rdna1-amdgpu") / version, MOK_CERT]


MOK_CERT = Path("/var/lib/dkms/mok.pub")


def copy_build_into(root: Path, result: dict) -> None:
    """A whole-system image's root (tests/wholesystem.py) given the build's files where the build left them: from
    `files_root` when the build was handed over (tests/second_lane.py), else from this machine."""
    for path in build_files(result):
        copy_into(root, path, Path(result.get("files_root", "/")))


@pytest.fixture(scope="session")
def built_module_61(request) -> dict:
    """The JSON of `rdna1-kmgr build --kernel <Debian's current 6.1 release> --yes --json`, and `files_root`: where
    build_files are ("/", or their copy in the second lane: tests/second_lane.py)."""
    if second_lane.in_child():
        return second_lane.receive("built_module_61")
    result = {**run_build(request.getfixturevalue("headers_61")), "files_root": "/"}
    lane = getattr(request.config, LANE, None)
    if lane is not None and "built_module_61" in lane.wanted:
        second_lane.hand_over(lane, "built_module_61", result, build_files(result))
    return result


@pytest.fixture(scope="session", autouse=True)
def _builds_the_second_lane_waits_for(request) -> None:
    """In a session that handed tests to a second lane: the builds they use, made before this session's first
    test and handed over, so the lane waits the least (tests/second_lane.py)."""
    lane = getattr(request.config, LANE, None)
    for name in sorted(lane.wanted) if lane is not None else ():
        try:
            request.getfixturevalue(name)
        except (Exception, pytest.fail.Exception, pytest.skip.Exception):
            pass  # the tests that use it report it; the lane's, when this session ends (second_lane.receive)


@pytest.fixture(scope="session")
def built_module_612(headers_612) -> dict:
    """The JSON of `rdna1-kmgr build --kernel <bookworm-backports' 6.12 release> --yes --json`."""
    return run_build(headers_612)
