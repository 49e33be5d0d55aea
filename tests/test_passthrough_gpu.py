"""The real-GPU path: an RDNA1 board passed through on this very host, then given back to amdgpu.

Skipped unless the host has an RDNA1 board AND the person running the tests names it, because the run
takes the board away from the host for a while and, without vendor-reset, may leave it dead until a power
cycle. To run it (as root, on a host set up as the README's "Testing on a real RX 5600 XT" says):

    sudo RDNA1_KMGR_TEST_GPU=0000:0a:00.0 /opt/rdna1-kmgr/bin/python -m pytest -ra tests/test_passthrough_gpu.py

What it proves there: the host checks accept the board (IOMMU group, display, vendor-reset's
device_specific reset); the board and its audio function go to vfio-pci, a guest sees them behind the
root port, and both come back, the GPU on amdgpu with its DRM card and no probe error logged.
"""

import json
import os

import pytest
from click.testing import CliRunner

from rdna1_kmgr import host, passthrough, vfio_journal
from rdna1_kmgr.cli import main

GPU_ENV = "RDNA1_KMGR_TEST_GPU"


@pytest.fixture(scope="module")
def gpu() -> str:
    boards = [dev.bdf for dev in host.detect().rdna1_devices]
    if not boards:
        pytest.skip("no RDNA1 GPU on this host (detect found none); see this file's docstring for how to run "
                    "these tests on a host with an RX 5600 XT")
    chosen = os.environ.get(GPU_ENV)
    if chosen is None:
        pytest.skip(f"RDNA1 GPU(s) {', '.join(boards)} found, but the test takes the board from the host: "
                    f"set {GPU_ENV}=<BDF> to allow it (as root)")
    if chosen not in boards:
        pytest.fail(f"{GPU_ENV}={chosen} is not one of the RDNA1 boards detect found: {', '.join(boards)}")
    if os.geteuid() != 0:
        pytest.skip("passing a GPU through needs root")
    return chosen


def test_the_host_checks_accept_the_board(gpu):
    pre = passthrough.preflight(gpu, plumbing_only=False)
    assert pre.plan.target.bdf == gpu
    assert all(r.ready for r in pre.reset), [r.detail for r in pre.reset]


def test_the_board_passes_through_and_comes_back_on_amdgpu(gpu, tmp_path, monkeypatch):
    monkeypatch.setenv("RDNA1_KMGR_LOG", str(tmp_path / "log"))
    before = host.detect().target
    result = CliRunner().invoke(main, ["vm-test", "--gpu", gpu, "--plumbing-only", "--json"])
    assert result.exit_code == 0, result.output
    verdict = json.loads(result.stdout)
    assert verdict["verdict"] == "pass" and verdict["guest_saw"] == verdict["vendor_device"]
    assert all(d["before"] == d["after"] and d["during"] == "vfio-pci" for d in verdict["devices"])
    assert not vfio_journal.pending()
    if before is not None and before.driver == "amdgpu":
        assert host.detect().target.driver == "amdgpu"  # came_back also checked its DRM card and the log
