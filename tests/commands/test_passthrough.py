"""`vm-test plumbing`'s text report and `vm-test restore`'s lines, on records made by hand: the lines the owner
reads after a run (the runs themselves need a host IOMMU: tests/vm/test_passthrough_nested.py)."""

from __future__ import annotations

from dataclasses import replace

from click.testing import CliRunner

from rdna1_kmgr.cli import main
from rdna1_kmgr.commands.passthrough import report
from rdna1_kmgr.host.sysfs import PciDevice
from rdna1_kmgr.vm import verdict, vfio_journal
from rdna1_kmgr.vm.plumbing_facts import DeviceStory, PlumbingFacts, PlumbingRun
from rdna1_kmgr.vm.vfio import GroupPlan

BOARD = PciDevice("0000:0a:00.0", 0x1002, 0x731F, 0x030000, "amdgpu", False, 14, ("0000:0a:00.1",), None)
AUDIO = PciDevice("0000:0a:00.1", 0x1002, 0xAB38, 0x040300, None, None, 14, ("0000:0a:00.0",), None)
PLUMBING = PlumbingFacts(
    bdf="0000:0a:00.0",
    vendor_device="1002:731f",
    guest_saw="1002:731f",
    iommu_group=14,
    group=GroupPlan(BOARD, 14, (BOARD, AUDIO), ()),
    devices=(
        DeviceStory("0000:0a:00.0", "1002:731f", "amdgpu", "vfio-pci", "amdgpu", True),
        DeviceStory("0000:0a:00.1", "1002:ab38", None, "vfio-pci", None, True),
    ),
    reset=(),
    accepted_reset_risk=False,
    forced=(),
)

# The record's "passthrough" of a plumbing run, as run_plumbing wrote it before its facts were typed.
FACTS = {
    "bdf": "0000:0a:00.0",
    "vendor_device": "1002:731f",
    "guest_saw": "1002:731f",
    "iommu_group": 14,
    "group": {"iommu_group": 14, "passed": ["0000:0a:00.0", "0000:0a:00.1"], "left": []},
    "devices": [
        {
            "bdf": "0000:0a:00.0",
            "vendor_device": "1002:731f",
            "before": "amdgpu",
            "during": "vfio-pci",
            "after": "amdgpu",
            "restored": True,
        },
        {
            "bdf": "0000:0a:00.1",
            "vendor_device": "1002:ab38",
            "before": None,
            "during": "vfio-pci",
            "after": None,
            "restored": True,
        },
    ],
    "reset": [],
    "accepted_reset_risk": False,
    "forced": [],
}


def plumbing_run(facts: PlumbingFacts) -> PlumbingRun:
    record = verdict.Record(
        verdict="fail",
        reason="guest-saw: the guest has no 1002:ab38 behind the passthrough root port",
        mode="plumbing",
        kernel="6.1.0-56-amd64",
        module=None,
        module_sha256=None,
        accel="tcg",
        checks=(
            verdict.Check("vfio-bind", True, "0000:0a:00.0, 0000:0a:00.1 on vfio-pci, /dev/vfio/14"),
            verdict.Check("guest-saw", False, "the guest has no 1002:ab38 behind the passthrough root port"),
        ),
        selftest=None,
        console_log="/var/log/rdna1-kmgr/vm-test/x.log",
        seconds=80.2,
        started="2026-01-01T00:00:00+00:00",
        tool_version="t",
        passthrough=facts.to_json(),
        record="/var/log/rdna1-kmgr/vm-test/x.json",
    )
    return PlumbingRun(record, facts)


def test_the_plumbing_facts_keep_the_records_keys():
    assert PLUMBING.to_json() == FACTS


def test_the_plumbing_report_names_the_device_what_the_guest_saw_each_driver_and_each_check():
    assert report(plumbing_run(PLUMBING)).splitlines() == [
        "verdict      fail: guest-saw: the guest has no 1002:ab38 behind the passthrough root port",
        "device       0000:0a:00.0 (1002:731f), IOMMU group 14",
        "guest saw    1002:731f",
        "  0000:0a:00.0  before amdgpu, during vfio-pci, after amdgpu",
        "  0000:0a:00.1  before none, during vfio-pci, after none",
        "  ok    vfio-bind: 0000:0a:00.0, 0000:0a:00.1 on vfio-pci, /dev/vfio/14",
        "  FAIL  guest-saw: the guest has no 1002:ab38 behind the passthrough root port",
        "record       /var/log/rdna1-kmgr/vm-test/x.json",
    ]


def test_a_guest_that_saw_nothing_is_said():
    text = report(plumbing_run(replace(PLUMBING, guest_saw=None))).splitlines()
    assert text[2] == "guest saw    nothing"


def test_restore_says_each_device_it_could_not_give_back(tmp_path, monkeypatch):
    """A device a running run holds is left; one no bus here has is reported as gone; exit 4 names the first."""
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path / "state"))
    pid, start, boot = vfio_journal.me()
    started = "2026-01-01T00:00:00+00:00"
    for bdf, owner, owner_start in (("0000:7f:1f.6", pid, start), ("0000:7f:1f.7", 1, 1)):
        binding = vfio_journal.Binding(
            bdf, 0x1002, 0x731F, "amdgpu", None, 14, "r1", owner, owner_start, boot, 1, started
        )
        vfio_journal.write(binding)
    result = CliRunner().invoke(main, ["vm-test", "restore"])
    assert result.exit_code == 4
    assert result.stdout.splitlines() == [
        f"FAIL  0000:7f:1f.6 belongs to a running rdna1-kmgr (pid {pid}): left",
        "FAIL  0000:7f:1f.7 is no longer on the PCI bus",
    ]
    assert (
        result.stderr.splitlines()
        == [
            "vm-test: 0000:7f:1f.7 is no longer on the PCI bus",  # said as it is given back
            f"rdna1-kmgr: error: 2 device(s) not given back: 0000:7f:1f.6 belongs to a running rdna1-kmgr (pid {pid}): "
            "left: see above; a GPU that did not come back needs a power cycle",
        ]
    )
