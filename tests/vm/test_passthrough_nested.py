"""End to end, with real parts: `vm-test plumbing BDF` inside a guest that has an IOMMU.

This machine has no IOMMU and no GPU, but QEMU can give a guest both an emulated IOMMU (intel-iommu with
caching mode, so vfio can map through it) and harmless PCI devices. So one outer guest (virtme-ng, the
Debian 6.1 kernel image fetched into the test cache and unpacked there, never installed) boots with
`edu` and a virtio-rng, and inside it the real rdna1-kmgr binds them to the real vfio-pci of a real kernel,
boots an inner guest (QEMU in QEMU, TCG in TCG) that lists them, and gives them back. The scenarios all run
in that one boot (tests/vm/nested_passthrough.sh) and leave their facts in a shared folder; each test below
asserts one part of them. Slow: an outer boot plus one full inner boot, a few minutes under TCG.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

import pytest
from conftest import _using_test_cache

from rdna1_kmgr.core import runner
from rdna1_kmgr.source import debian_archive
from rdna1_kmgr.vm import guest_kernel, virtme_guest

pytestmark = pytest.mark.vm

SCRIPT = Path(__file__).parent / "nested_passthrough.sh"
EDU, RNG = "0000:00:1d.0", "0000:00:1e.0"
OUTER_QEMU = "-device intel-iommu,intremap=off,caching-mode=on -device edu,addr=0x1d -device virtio-rng-pci,addr=0x1e"
INNER_TIMEOUT = 900  # one inner boot, TCG in TCG: ~2 min measured on a busy 2-core machine
OUTER_TIMEOUT = 1800  # hard limit for the whole outer run, every scenario included


def _skip_unless_possible() -> None:
    if os.geteuid() != 0:
        pytest.skip("the outer guest runs vng as root (the guest's sysfs writes need root inside)")
    for tool in ("qemu-system-x86_64", "busybox", "dpkg-deb"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")


@pytest.fixture(scope="module")
def nested(tmp_path_factory) -> Path:
    """Boot the outer guest once; return the folder its script filled."""
    _skip_unless_possible()
    tools = virtme_guest.find()
    with _using_test_cache():
        # The kernel bookworm's metapackage points to today, as its image package unpacked in the test cache
        # (even when the host has it installed: other tests install and depmod there while this one runs).
        kernel = guest_kernel.fetch_image(debian_archive.current_kernel_abi("bookworm-security"))
    out = tmp_path_factory.mktemp("nested")
    kmgr = Path(sys.executable).parent / "rdna1-kmgr"
    cache = kernel.root.parent.parent  # <cache>/kernels/<release>
    command = " ".join(shlex.quote(str(a)) for a in ("bash", SCRIPT, out, kmgr, INNER_TIMEOUT, cache))
    argv = [
        tools.vng,
        "--run",
        str(kernel.image),
        "--user",
        "root",
        "--cwd",
        "/",
        "--memory",
        "2G",
        "--verbose",
        "--qemu",
        tools.qemu,
        "--disable-kvm",
        "--force-9p",
        "--disable-microvm",
        # The cached kernel's modules (for modprobe vfio-pci in the guest): its init hides /var/cache.
        "--rodir",
        str(kernel.root),
        "--rwdir",
        str(out),
        "--append",
        "intel_iommu=on",
        f"--qemu-opts={OUTER_QEMU}",
        "--exec",
        command,
    ]
    started = time.monotonic()
    outcome = runner.run_session(argv, out / "outer-console.log", OUTER_TIMEOUT, env=tools.env(), cwd="/")
    (out / "outer-seconds").write_text(f"{time.monotonic() - started:.1f}\n")
    if not (out / "finished").exists():
        log = (out / "script.log").read_text() if (out / "script.log").exists() else "(no script log)"
        pytest.fail(
            f"the outer guest did not finish its scenarios (timed out: {outcome.timed_out}); "
            f"script log:\n{log}\nconsole tail:\n{_tail(out / 'outer-console.log')}"
        )
    return out


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(none)"


def read(out: Path, name: str) -> str:
    return (out / name).read_text().strip()


def verdict(out: Path, name: str) -> dict:
    text = read(out, f"{name}.json")
    assert text, f"no JSON from {name}; stderr: {read(out, name + '.err')}"
    return json.loads(text)


# --- 1: a plumbing-only run to the end -----------------------------------------------------------------------


def test_the_guest_has_a_real_iommu(nested):
    assert len(read(nested, "groups").split()) >= 10


def test_plumbing_only_passes_and_the_guest_saw_the_device(nested):
    result = verdict(nested, "pass")
    assert read(nested, "pass.rc") == "0", read(nested, "pass.err")
    assert result["verdict"] == "pass", result["reason"]
    facts = result["passthrough"]
    assert result["mode"] == "plumbing" and result["module"] is None
    assert facts["bdf"] == EDU and facts["vendor_device"] == "1234:11e8"
    assert facts["guest_saw"] == "1234:11e8"
    assert {c["name"] for c in result["checks"] if c["ok"]} == {
        "vfio-bind",
        "guest-run",
        "guest-saw",
        "vfio-during",
        "restored",
        "reset",
    }
    assert facts["accepted_reset_risk"] is False
    assert Path(result["record"]).name.endswith(".json")


def test_the_device_was_on_vfio_pci_during_the_run(nested):
    samples = read(nested, "pass.during").splitlines()
    assert "vfio-pci vfio-pci" in samples  # driver and driver_override, seen from outside the tool
    (story,) = verdict(nested, "pass")["passthrough"]["devices"]
    assert story == {
        "bdf": EDU,
        "vendor_device": "1234:11e8",
        "before": None,
        "during": "vfio-pci",
        "after": None,
        "restored": True,
    }


def test_the_original_state_is_back_after(nested):
    assert read(nested, "pass.before") == "none (null)"
    assert read(nested, "pass.after") == "none (null)"
    assert read(nested, "pass.journal") == ""


# --- 2: killed with SIGKILL mid-run, then `vm-test restore` --------------------------------------------------


def test_a_sigkilled_run_leaves_the_device_journaled_on_vfio(nested):
    assert read(nested, "killed.rc") == "137", read(nested, "killed.err")
    assert read(nested, "killed.state") == "vfio-pci vfio-pci"
    assert read(nested, "killed.journal") == f"{EDU}.json"


def test_restore_gives_the_device_back_and_stops_the_leftover_vm(nested):
    assert read(nested, "restore.rc") == "0", read(nested, "restore.err")
    (entry,) = verdict(nested, "restore")["restored"]
    assert entry["bdf"] == EDU and entry["ok"] and entry["driver"] is None
    assert read(nested, "restore.after") == "none (null)"
    assert read(nested, "restore.journal") == ""
    assert read(nested, "restore.qemu") == ""  # no inner QEMU left holding the group
    if read(nested, "killed.qemu"):
        assert "left running by the killed run" in read(nested, "restore.err")
    # Nothing left to do: a second restore says so and succeeds.
    assert read(nested, "restore2.rc") == "0" and verdict(nested, "restore2")["restored"] == []


# --- 3 and 4: a device with a driver; failure and SIGTERM after the bind ----------------------------------------


def test_a_failure_after_the_bind_gives_the_device_back_to_its_driver(nested):
    assert read(nested, "timeout.before") == "virtio-pci (null)"
    assert "vfio-pci vfio-pci" in read(nested, "timeout.during").splitlines()
    assert read(nested, "timeout.rc") == "5"
    result = verdict(nested, "timeout")
    assert result["verdict"] == "fail" and result["reason"].startswith("guest-run: timed out after 2 s")
    assert next(c for c in result["checks"] if c["name"] == "restored")["ok"]
    assert read(nested, "timeout.after") == "virtio-pci (null)"
    assert read(nested, "timeout.journal") == ""


def test_sigterm_mid_run_gives_the_device_back(nested):
    assert read(nested, "term.during") == "vfio-pci vfio-pci"
    assert read(nested, "term.rc") == "130"
    assert "stopped by SIGTERM; the devices were given back" in read(nested, "term.err")
    assert read(nested, "term.after") == "virtio-pci (null)"
    assert read(nested, "term.journal") == "" and read(nested, "term.qemu") == ""


# --- 0: a refusal on a real sysfs ---------------------------------------------------------------------------


def test_a_refusal_is_one_line_and_changes_nothing(nested):
    assert read(nested, "refused.rc") == "2"
    assert read(nested, "refused.err") == (
        f"rdna1-kmgr: error: {EDU} (1234:11e8) is not an RDNA1 GPU: the GPU test needs one; "
        "`vm-test plumbing BDF` tests only the VFIO plumbing with it"
    )
    assert read(nested, "refused.before") == read(nested, "refused.after") == "none (null)"
