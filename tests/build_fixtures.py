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
from conftest import persistent_cache_root


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


@pytest.fixture(scope="session")
def built_module_61(headers_61) -> dict:
    """The JSON of `rdna1-kmgr build --kernel <Debian's current 6.1 release> --yes --json`."""
    return run_build(headers_61)


@pytest.fixture(scope="session")
def built_module_612(headers_612) -> dict:
    """The JSON of `rdna1-kmgr build --kernel <bookworm-backports' 6.12 release> --yes --json`."""
    return run_build(headers_612)
