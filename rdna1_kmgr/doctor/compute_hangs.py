"""GPU hangs in the kernel log: a compute ring that timed out, a whole-GPU reset, KFD failing to evict queues.

amdgpu logs a job that never finished as `ring <name> timeout` (comp_* are the compute rings ROCm's queues
run on, gfx the graphics ring), then resets the GPU (MODE1 or BACO on Navi10, "GPU reset begin!"); KFD logs
"Failed to evict process queues" when a process's queues do not stop (a hung wave, often). They are their
own finding: a hang says the workload or the driver is at fault, not the board's firmware or probe.
Public gfx1010 reports of such hangs: lamikr/rocm_sdk_builder#98.
"""

from __future__ import annotations

import re

from rdna1_kmgr.doctor.finding import Finding, log_not_read
from rdna1_kmgr.host import gpu_faults
from rdna1_kmgr.host.kmsg import Record

COMPUTE = re.compile(r"ring (comp_\S+) timeout|Failed to evict (?:process )?queues", re.I)
OTHER = re.compile(r"ring (\S+) timeout|MODE1 reset|BACO reset|MODE2 reset|GPU reset begin|GPU recovery", re.I)


def is_hang(message: str) -> bool:
    return bool(COMPUTE.search(message) or OTHER.search(message))


def findings(records: list[Record], readable: bool) -> list[Finding]:
    if not readable:  # said here too, not only by probe-errors (a board's check): hangs are read without a board
        return [log_not_read("compute-hangs", "GPU hangs")]
    at = [n for n, r in enumerate(records) if COMPUTE.search(r.message)]
    compute = [records[n].message for n in at]
    other = [r.message for r in records if not COMPUTE.search(r.message) and OTHER.search(r.message)]
    facts = {"compute": compute[-20:], "other": other[-20:]}
    if compute:
        named = gpu_faults.process_after(records, at[-1])
        who = f"process {named[0]} (pid {named[1]}), " if named else ""
        return [
            Finding(
                "compute-hangs",
                "problem",
                f"{len(compute)} compute hang line(s) in the kernel log, last: {compute[-1]} "
                f"({who}{records[at[-1]].since_boot()})"
                + (f" (and {len(other)} reset or ring line(s))" if other else ""),
                "a compute queue stopped making progress: the GPU was reset or the process's queues "
                "could not be stopped; ROCm work on the board then fails or hangs",
                "note what ran then (`journalctl -k -b -1` for the boot before); check the queue "
                "finding and MIOpen settings first, then run the experiment to find the setting that "
                "avoids it",
                facts,
            )
        ]
    if other:
        return [
            Finding(
                "compute-hangs",
                "warn",
                f"{len(other)} GPU reset or ring timeout line(s) in the kernel " f"log, last: {other[-1]}",
                "not on a compute ring: the desktop or video may have hung "
                "the GPU; compute on the board was reset with it",
                "if it repeats, note what ran then",
                facts,
            )
        ]
    return [
        Finding(
            "compute-hangs",
            "ok",
            f"no ring timeouts or GPU resets in the kernel log " f"({len(records)} records)",
            "",
            "",
            facts,
        )
    ]
