"""The real-GPU path: an RDNA1 board passed through on this very host, then given back to amdgpu.

Skipped unless the host has an RDNA1 board AND the person running the tests names it, because the run
takes the board away from the host for a while and, without vendor-reset, may leave it dead until a power
cycle. To run it (as root, on a host set up as docs/guide.md's "A second GPU" says):

    RDNA1_KMGR_TEST_GPU=0000:0a:00.0 /opt/rdna1-kmgr/bin/python -m pytest -ra tests/vm/test_passthrough_gpu.py

What it proves there: the host checks accept the board (IOMMU group, display, vendor-reset's
device_specific reset); the board and its audio function go to vfio-pci, a guest sees them behind the
root port, and both come back, the GPU on amdgpu with its DRM card and no probe error logged. The full run
(it needs `rdna1-kmgr build` done for the running kernel first): the patched amdgpu drives the board in the
guest (probe line with the quirks, KFD node, heap_type 2 with crat-mem), and every emulated check passes;
with torch for ROCm on the host (the guest runs the host's Python), the conv2d workload too.
"""

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from rdna1_kmgr.cli import main
from rdna1_kmgr.host import host_facts
from rdna1_kmgr.vm import passthrough, vfio_journal

GPU_ENV = "RDNA1_KMGR_TEST_GPU"


@pytest.fixture(scope="module")
def gpu() -> str:
    boards = [dev.bdf for dev in host_facts.detect().rdna1_devices]
    if not boards:
        pytest.skip(
            "no RDNA1 GPU on this host (detect found none); see this file's docstring for how to run "
            "these tests on a host with an RX 5600 XT"
        )
    chosen = os.environ.get(GPU_ENV)
    if chosen is None:
        pytest.skip(
            f"RDNA1 GPU(s) {', '.join(boards)} found, but the test takes the board from the host: "
            f"set {GPU_ENV}=<BDF> to allow it (as root)"
        )
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
    before = host_facts.detect().target
    result = CliRunner().invoke(main, ["vm-test", "plumbing", gpu, "--json"])
    assert result.exit_code == 0, result.output
    verdict = json.loads(result.stdout)
    facts = verdict["passthrough"]
    assert verdict["verdict"] == "pass" and facts["guest_saw"] == facts["vendor_device"]
    assert all(d["before"] == d["after"] and d["during"] == "vfio-pci" for d in facts["devices"])
    assert not vfio_journal.pending()
    if before is not None and before.driver == "amdgpu":
        assert host_facts.detect().target.driver == "amdgpu"  # came_back also checked its DRM card and the log


def full_run(gpu: str, tmp_path, monkeypatch, *extra: str) -> dict:
    monkeypatch.setenv("RDNA1_KMGR_LOG", str(tmp_path / "log"))
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path / "state"))
    result = CliRunner().invoke(main, ["vm-test", "gpu", gpu, *extra, "--json"])
    verdict = json.loads(result.stdout) if result.stdout.strip() else {}
    assert result.exit_code == 0, verdict.get("reason") or result.output
    assert verdict["verdict"] == "pass" and verdict["mode"] == "passthrough" and verdict["passthrough"]["bdf"] == gpu
    names = {c["name"] for c in verdict["checks"] if c["ok"]}
    assert {"load", "selftest", "unload", "gpu-driver", "probe-line", "kfd-node", "vram-heap", "restored"} <= names
    assert verdict["passthrough"]["came_back"] is True and not vfio_journal.pending()
    return verdict


def test_the_patched_driver_drives_the_board_in_the_guest(gpu, tmp_path, monkeypatch):
    full_run(gpu, tmp_path, monkeypatch)


def test_conv2d_on_the_board_matches_the_cpu(gpu, tmp_path, monkeypatch):
    has_gpu_torch = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
    if all(
        subprocess.run([py, "-c", has_gpu_torch], capture_output=True).returncode
        for py in (sys.executable, "/usr/bin/python3")
    ):
        pytest.skip("no Python on this host imports a torch that sees the GPU (install torch for ROCm)")
    verdict = full_run(gpu, tmp_path, monkeypatch, "--workload", "conv2d")
    cases = verdict["passthrough"]["workload"]
    assert len(cases) == 16 and all(c["ok"] for c in cases)
