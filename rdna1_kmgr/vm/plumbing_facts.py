"""What a plumbing-only run saw of the device (`vm-test plumbing BDF`): the facts `vm-test plumbing` prints
and its verdict record carries under "passthrough" (verdict.Record), with the keys that record has always had.

plumbing_run makes them; the command renders the fields, the record stores to_json.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rdna1_kmgr.vm import reset_readiness, verdict
from rdna1_kmgr.vm.vfio import GroupPlan


@dataclass(frozen=True)
class DeviceStory:
    """One passed device's drivers: before the bind, when the guest ended, after the give-back."""

    bdf: str
    vendor_device: str  # 1002:731f style
    before: str | None  # None: no driver
    during: str | None
    after: str | None
    restored: bool  # given back as it was


@dataclass(frozen=True)
class PlumbingFacts:
    bdf: str  # the device asked for
    vendor_device: str
    guest_saw: str | None  # the id the guest listed behind its passthrough root port; None: nothing
    iommu_group: int
    group: GroupPlan  # what went to the VM, what stayed and why
    devices: tuple[DeviceStory, ...]  # the target first, then its slot's functions
    reset: tuple[reset_readiness.Readiness, ...]
    accepted_reset_risk: bool  # --accept-reset-risk let a board with the reset bug go
    forced: tuple[str, ...]  # display use --force went past

    def to_json(self) -> dict[str, Any]:
        return {
            "bdf": self.bdf,
            "vendor_device": self.vendor_device,
            "guest_saw": self.guest_saw,
            "iommu_group": self.iommu_group,
            "group": self.group.to_json(),
            "devices": [asdict(d) for d in self.devices],
            "reset": [r.to_json() for r in self.reset],
            "accepted_reset_risk": self.accepted_reset_risk,
            "forced": list(self.forced),
        }


@dataclass(frozen=True)
class PlumbingRun:
    """A plumbing run's verdict, as stored (its passthrough is facts.to_json()), and the facts it holds."""

    record: verdict.Record
    facts: PlumbingFacts
