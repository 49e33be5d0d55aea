"""GPU page faults in the kernel log (host/gpu_faults.py reads them), with the process and the time.

A fault is a GPU kernel reading or writing an address its process has not mapped: a bug of the program or a
library, code built for another processor (HSA_OVERRIDE_GFX_VERSION), or memory of the wrong type. ROCr ends
the process with "Memory access fault by GPU"; the experiment names such a cell memory-fault.
"""

from __future__ import annotations

from rdna1_kmgr.doctor.finding import Finding, log_not_read
from rdna1_kmgr.host import gpu_faults
from rdna1_kmgr.host.kmsg import Record


def findings(records: list[Record], readable: bool) -> list[Finding]:
    if not readable:
        return [log_not_read("gpu-faults", "GPU page faults")]
    found = gpu_faults.faults(records)
    facts = {"faults": [f.record.message for f in found[-20:]]}
    if not found:
        return [
            Finding("gpu-faults", "ok", f"no GPU page faults in the kernel log ({len(records)} records)", "", "", facts)
        ]
    processes = sorted({f.process for f in found if f.process})
    return [
        Finding(
            "gpu-faults",
            "problem",
            f"{len(found)} GPU page fault(s) in the kernel log, last: {found[-1].said()}"
            + (f"; processes: {', '.join(processes)}" if processes else ""),
            'a GPU kernel touched memory its process had not mapped; ROCm ends the process with "Memory access '
            'fault by GPU"',
            "note what that process ran then (`journalctl -k -b -1` for the boot before); fix what doctor marks "
            "above first (an override, a torch without the board's code), then find the setting that avoids it "
            "with `rdna1-kmgr experiment` (its memory-fault outcome)",
            facts,
        )
    ]
