"""KFD's first exact check on an RDNA1 queue: its control stack, before the CWSR area and whatever backs it.

KFD (Linux 6.12 on, amdkfd/kfd_queue.c, read in Debian's 6.12.117): `kfd_queue_acquire_buffers` refuses a queue
whose `properties->ctl_stack_size != topo_dev->node_props.ctl_stack_size` with -EINVAL, before it looks the CWSR
area up, so SVM makes no difference here. `kfd_queue_ctx_save_restore_size` sizes the node's control stack for 32
waves per CU on gfx10: min(ALIGN(40 + 12 * waves + 8, 4 KiB), 0x7000) (a 40-byte header, 12 bytes a wave, 8 more;
gfx10's hardware limit). Upstream 8fc2796dea6f ("drm/amdkfd: Export the cwsr_size and ctl_stack_size to
userspace"; Linux 6.19, stable 6.12.64 and 6.18.4) prints both sizes in every node's `properties`, CPU nodes
included (as 0); 6.12.0-6.12.63, 6.13-6.17 and 6.18.0-6.18.3 do not.

libhsakmt (rocm-systems, projects/rocr-runtime/libhsakmt/src; read at 0b2e283c8a9e, a develop descendant that
carries #6125 and #7109):
- topology.c `topology_sysfs_get_node_props`: `cwsr_size` and `ctl_stack_size` fill CwsrSize and CtlStackSize
  (since rocm-systems #2200/#2324, December 2025); a key it does not know is skipped.
- queues.c `update_ctx_save_restore_size`: ctl_stack_size is CtlStackSize when non-zero, else computed with the
  same formula for `get_num_waves` waves; since #6125 (develop 745ebf1ab4e1, May 2026) that is CUs *
  NumSIMDPerCU * MaxWavesPerSIMD, 2 * 20 = 40 a CU on RDNA1 (32 before, and again with the revert #11299).
So on a kernel that checks and does not print, a post-#6125 ROCm sends 0x5000 against KFD's 0x4000 on 36 and 40
CUs (RX 5600 XT, 5700, 5700 XT, Navi12) and 0x3000 against 0x2000 on 20 (RX 5500); 22, 24 and 32 CUs match.

What the owner then sees: ROCr's `KfdDriver::CreateQueue` (rocr-runtime amd_kfd_driver.cpp) turns any failure of
AMDKFD_IOC_CREATE_QUEUE into HSA_STATUS_ERROR_OUT_OF_RESOURCES; the first kernel launch fails while freezing the
executable ("Freezing the executable failed: HSA_STATUS_ERROR_OUT_OF_RESOURCES" under AMD_LOG_LEVEL, CLR
hip_fatbin.cpp), HIP reports hipErrorNoBinaryForGpu or, for a stream, hipErrorOutOfMemory, and PyTorch often
segfaults. KFD says nothing unless its dynamic debug is on ("queue ctl stack size ... not equal to node ctl stack
size ...").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rdna1_kmgr.doctor.kfd_access import KfdNode

PAGE = 4096
HEADER = 40  # SIZEOF_HSA_USER_CONTEXT_SAVE_AREA_HEADER
BYTES_PER_WAVE = 12  # CNTL_STACK_BYTES_PER_WAVE on gfx10.1 and later
LIMIT = 0x7000  # gfx10's hardware limit on the control stack
KFD_WAVES_PER_CU = 32  # kfd_queue_ctx_save_restore_size on gfx10
RDNA1 = range(100100, 100103)  # gfx_target_version of gfx1010, gfx1011, gfx1012
PRINTED = ("cwsr_size", "ctl_stack_size")  # the two keys of 8fc2796dea6f


def control_stack_bytes(waves: int) -> int:
    """The control stack of a gfx10 queue for `waves` waves, as kfd_queue.c and libhsakmt's queues.c size it."""
    return min(-(-(HEADER + BYTES_PER_WAVE * waves + 8) // PAGE) * PAGE, LIMIT)


@dataclass(frozen=True)
class ControlStack:
    """An RDNA1 node's control stack: what KFD checks, and what a libhsakmt after #6125 sends."""

    node: int
    cus: int | None  # None: the node does not say (no simd_per_cu)
    printed: bool  # the node's properties carry cwsr_size and ctl_stack_size
    kfd: int | None  # the size KFD checks queues against
    rocm: int | None  # what a post-#6125 libhsakmt sends: KFD's when printed, else its own

    @property
    def refused(self) -> bool | None:
        """Whether KFD refuses a post-#6125 queue on this node; None: the sizes cannot be worked out."""
        if self.printed:
            return False
        if self.kfd is None or self.rocm is None:
            return None
        return self.kfd != self.rocm

    def describe(self) -> str:
        if self.printed:
            return f"node {self.node} prints ctl_stack_size {self.kfd} and cwsr_size: libhsakmt sends KFD's own"
        if self.kfd is None or self.rocm is None:
            return f"node {self.node} prints no ctl_stack_size and no simd_per_cu to work it out from"
        return (
            f"node {self.node} ({self.cus} CUs) prints no ctl_stack_size: KFD checks 0x{self.kfd:x}, "
            f"ROCm after rocm-systems #6125 sends 0x{self.rocm:x}"
        )

    def to_json(self) -> dict:
        return {"node": self.node, "cus": self.cus, "printed": self.printed, "kfd": self.kfd, "rocm": self.rocm}


def of_node(node: KfdNode) -> ControlStack:
    """The control stack of one RDNA1 node from its properties."""
    props = node.properties
    printed = all(key in props for key in PRINTED)
    simd_per_cu = props.get("simd_per_cu", 0)
    xcc = props.get("num_xcc", 1) or 1
    cus = props.get("simd_count", 0) // simd_per_cu // xcc if simd_per_cu else None
    if printed:
        return ControlStack(node.index, cus, True, props["ctl_stack_size"], props["ctl_stack_size"])
    if cus is None:
        return ControlStack(node.index, None, False, None, None)
    waves = props.get("max_waves_per_simd", 0)
    rocm = control_stack_bytes(cus * simd_per_cu * waves) if waves else None
    return ControlStack(node.index, cus, False, control_stack_bytes(cus * KFD_WAVES_PER_CU), rocm)


def read(nodes: list[KfdNode]) -> list[ControlStack]:
    """The control stack of every RDNA1 GPU node."""
    return [of_node(n) for n in nodes if n.properties.get("gfx_target_version", 0) in RDNA1]


# Upstream releases that print the two sizes (8fc2796dea6f): 6.12.64 on in 6.12, 6.18.4 on in 6.18, 6.19 and later.
# A distribution may have backported it: only a read of the node says for sure.
_PRINTING_FROM = {(6, 12): 64, (6, 18): 4}


def prints_by_version(release: str) -> bool | None:
    """Whether an upstream kernel of this release prints the two sizes; None: the release does not say."""
    numbers = re.match(r"^(\d+)\.(\d+)\.(\d+)", release)
    if not numbers:
        return None
    line, point = (int(numbers.group(1)), int(numbers.group(2))), int(numbers.group(3))
    if line >= (6, 19):
        return True
    if line in _PRINTING_FROM:
        return point >= _PRINTING_FROM[line]
    return False if line >= (6, 12) else None


def kernel_prints(nodes: list[KfdNode]) -> bool | None:
    """Whether this KFD prints the two sizes (8fc2796dea6f prints them on every node, the CPU's included);
    None: no node to read."""
    if not nodes:
        return None
    return any(all(key in n.properties for key in PRINTED) for n in nodes)


def refusal(nodes: list[KfdNode], validates: bool) -> str | None:
    """Why KFD refuses a post-#6125 queue on this machine's RDNA1 board, in words; None where it does not. For the
    experiment: a cell that crashes or fails to create its queue here is this, not a crash of the workload."""
    refused = [c for c in read(nodes) if c.refused]
    if not validates or not refused:
        return None
    return (
        "KFD refuses the queue's control stack (" + "; ".join(c.describe() for c in refused) + "): "
        "`rdna1-kmgr doctor`'s queue finding names the fix"
    )
