"""GPU page faults in the kernel log: one reader for doctor's `gpu-faults` finding and the experiment's
memory-fault outcome; and the process a fault or a ring timeout names (`process_after`).

amdgpu's GMC interrupt handler logs a fault as, on gfx10 (gmc_v10_0_process_interrupt, read in Debian's 6.1 and
6.12): `[gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32770)`, then ` in process python3 pid 2512 thread
python3 pid 2512`, then `  in page starting at address 0x00007f0000000000 from client 0x1b (UTCL2)`; gmc_v9 puts
the process on the first line (`..., for process python3 pid 2512 thread ...)`); newer kernels print it through
amdgpu_vm_print_task_info (` Process python3 pid 2512 ...`); `[gfxhub0] VMC page fault` and `retry page fault`
are older or other forms. ROCr then aborts the process with "Memory
access fault by GPU node-1 ... Reason: Page not present or supervisor privilege." (the experiment's memory-fault
text).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rdna1_kmgr.host.kmsg import Record

_FAULT = re.compile(r"\[(?P<hub>gfxhub|mmhub)\d*\] (?:retry |VMC )?page fault")
_PROCESS = re.compile(r"(?:(?:for|in) process|Process information: process|Process) (?P<process>\S+) pid (?P<pid>\d+)")
_ADDRESS = re.compile(r"in page starting at address (?P<address>0x[0-9a-fA-F]+)")


@dataclass(frozen=True)
class Fault:
    hub: str
    process: str | None
    pid: int | None
    address: str | None
    record: Record

    def said(self) -> str:
        who = f"process {self.process} (pid {self.pid})" if self.process else "an unnamed process"
        at = f" at {self.address}" if self.address else ""
        return f"[{self.hub}] page fault{at} in {who}, {self.record.since_boot()}"


def is_fault(message: str) -> bool:
    return _FAULT.search(message) is not None


def process_after(records: list[Record], index: int) -> tuple[str, int] | None:
    """(process, pid) that the record at `index` or the two after it name."""
    for record in records[index : index + 3]:
        match = _PROCESS.search(record.message)
        if match:
            return match["process"], int(match["pid"])
    return None


def faults(records: list[Record]) -> list[Fault]:
    """Every page fault, with the process and address the lines after it name (the next three records)."""
    found = []
    for n, record in enumerate(records):
        match = _FAULT.search(record.message)
        if match is None:
            continue
        process = _PROCESS.search(record.message)
        address = None
        for later in records[n + 1 : n + 4]:
            if is_fault(later.message):
                break
            process = process or _PROCESS.search(later.message)
            address = address or _ADDRESS.search(later.message)
        found.append(
            Fault(
                match["hub"],
                process["process"] if process else None,
                int(process["pid"]) if process else None,
                address["address"] if address else None,
                record,
            )
        )
    return found
