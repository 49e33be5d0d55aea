"""PCIe atomics between the board and the CPU: whether the platform routes them, as the kernel saw it.

amdgpu logs "PCIE atomic ops is not supported" when the root port path cannot complete 32- and 64-bit
AtomicOps (amdgpu_device.c), and KFD's topology marks the GPU's io_link to the CPU with
CRAT_IOLINK_FLAGS_NO_ATOMICS_32_BIT (bit 2) and _64_BIT (bit 3) then (amdkfd/kfd_crat.h; the link's
`flags` in /sys/class/kfd/kfd/topology/nodes/N/io_links/M/properties). ROCm's device-to-host paths that
signal the host with atomics (hostcall, device printf, host signals waited on by a kernel) need them; plain
kernels and copies do not.
"""

from __future__ import annotations

import re
from pathlib import Path

from rdna1_kmgr.doctor.finding import Finding
from rdna1_kmgr.doctor.kfd_access import TOPOLOGY, KfdNode, read_properties
from rdna1_kmgr.host.kmsg import Record

NO_ATOMICS = (1 << 2) | (1 << 3)
_LOG = re.compile(r"PCIE atomic ops is not supported|PCI rejects atomics", re.I)


def link_flags(sysroot: Path, node: KfdNode) -> list[int]:
    """The flags of every io_link of a KFD node."""
    links = sorted((sysroot / TOPOLOGY / str(node.index) / "io_links").glob("*/properties"))
    return [read_properties(p).get("flags", 0) for p in links]


def findings(sysroot: Path, gpus: list[KfdNode], records: list[Record], board_present: bool) -> list[Finding]:
    if not board_present:
        return []
    logged = [r.message for r in records if _LOG.search(r.message)]
    flags = {n.index: link_flags(sysroot, n) for n in gpus}
    without = [i for i, values in flags.items() if any(v & NO_ATOMICS for v in values)]
    facts = {"kernel_log": logged[-5:], "io_link_flags": flags}
    if logged or without:
        seen = "; ".join(
            ([f"kernel log: {logged[-1]}"] if logged else [])
            + ([f"KFD node(s) {', '.join(map(str, without))}: io_link without atomics"] if without else [])
        )
        return [
            Finding(
                "pcie-atomics",
                "problem",
                f"PCIe atomics missing ({seen})",
                "ROCm's hostcall and device printf, and kernels that signal the host, rely on PCIe "
                "atomics: they hang or fail; ordinary kernels and copies still work",
                "put the board in a CPU-attached slot (not behind a chipset or a riser/bridge without "
                "AtomicOps routing), update the firmware; avoid printf/hostcall in GPU code",
                facts,
            )
        ]
    if any(flags.values()):
        return [Finding("pcie-atomics", "ok", "PCIe atomics available (KFD io_link flags)", "", "", facts)]
    return [
        Finding(
            "pcie-atomics",
            "warn",
            "PCIe atomics could not be checked (no KFD io_link and no kernel " "log line about them)",
            "hostcall and device printf need them",
            "run doctor as root with " "amdgpu loaded",
            facts,
        )
    ]
