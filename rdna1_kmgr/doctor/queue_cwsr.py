"""The compute-queue failure of RDNA1 with 2026 ROCm on kernels whose KFD validates the CWSR buffer size.

Since Linux 6.12, `kfd_queue_acquire_buffers` (amdkfd/kfd_queue.c, read in Debian's 6.12.117; RHEL 9.6's
5.14.0-570 and RHEL 10's 6.12.0-55 carry it as a backport) requires the CWSR mapping to be exactly the size
KFD computes, with 32 waves per CU on gfx10. libhsakmt since rocm-systems PR #6125 (merged 2026-05-14) sizes
it with NumSIMDPerCU x MaxWavesPerSIMD, 40 waves per CU on RDNA1: AMDKFD_IOC_CREATE_QUEUE returns EINVAL
and the first kernel launch fails with HSA_STATUS_ERROR_OUT_OF_RESOURCES (rocm-systems PR #11299, a
user-space revert that was still open on 2026-09-08, shows it on an RX 5500 with ROCm 10.0). The
rdna1-kmgr quirk `cwsr-size` (bit 0x10, on by default) makes KFD accept both sizes on listed boards.

Which ROCm carries #6125 is read from version numbers, which is as far as public sources go: TheRock's
nightly rocm-sdk-core versions carry their build date (7.15.0a20260630): from 2026-05-15 on they carry it,
before 2026-05-14 they do not, the day itself cannot be told. ROCm 10 releases carry it (#11299); 6.x
releases predate it; 7.x to 9.x releases and distribution packages of them cannot be told from the number.
No ROCm release is known to carry the revert (#11299).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.doctor.finding import Finding
from rdna1_kmgr.render import quirk_catalog

QUIRK = "cwsr-size"
QUIRK_BIT = 4  # 0x10, the bit issue 22 gave cwsr-size; the catalog's own entry wins when it has one
MERGED = 20260514  # rocm-systems #6125
VALIDATING_SYMBOL = "kfd_queue_acquire_buffers"
_DATED = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:[.+-]?(?:a|b|rc|dev|post)\.?)(\d{8})")
_RELEASE = re.compile(r"^(\d+)\.(\d+)")


@dataclass(frozen=True)
class RocmRuntime:
    """A ROCm user space whose libhsakmt creates the queues: where it is and its version."""

    where: str
    version: str

    @property
    def carries_6125(self) -> bool | None:
        return carries_6125(self.version)

    def to_json(self) -> dict:
        return {"where": self.where, "version": self.version, "carries_6125": self.carries_6125}


def carries_6125(version: str) -> bool | None:
    """Whether a ROCm of this version sizes the CWSR area with #6125's wave count; None: cannot be told."""
    dated = _DATED.match(version.strip())
    if dated:
        day = int(dated.group(4))
        return None if day == MERGED else day > MERGED
    release = _RELEASE.match(version.strip())
    if not release:
        return None
    major = int(release.group(1))
    return True if major >= 10 else False if major <= 6 else None


def quirk_bit() -> int:
    """The bit of cwsr-size in rdna1_quirks."""
    quirk = quirk_catalog.load_quirks().get(QUIRK)
    return quirk.bit if quirk is not None else QUIRK_BIT


def kernel_validates(sysroot: Path, release: str) -> tuple[bool, str]:
    """Whether the running kernel's KFD checks the CWSR size, and how that was found out: the loaded amdgpu's
    symbols when /proc/kallsyms lists them, else the release (upstream 6.12 on, RHEL's el9 builds from
    5.14.0-570 and el10)."""
    try:
        symbols = [
            line
            for line in (sysroot / "proc/kallsyms").read_text(errors="replace").splitlines()
            if line.endswith("[amdgpu]")
        ]
    except OSError:
        symbols = []
    if symbols:
        found = any(line.split()[2] == VALIDATING_SYMBOL for line in symbols if len(line.split()) >= 3)
        return found, f"the loaded amdgpu {'has' if found else 'lacks'} {VALIDATING_SYMBOL} (/proc/kallsyms)"
    rhel = re.match(r"^5\.14\.0-(\d+)[.\w]*\.el9", release)
    if rhel:
        return int(rhel.group(1)) >= 570, f"{release}: RHEL 9 backported the check in 5.14.0-570"
    numbers = re.match(r"^(\d+)\.(\d+)", release)
    validates = bool(numbers) and (int(numbers.group(1)), int(numbers.group(2))) >= (6, 12)
    return validates, f"{release}: by its version (the check came with Linux 6.12)"


def findings(
    board_present: bool, release: str, sysroot: Path, mask: int | None, runtimes: list[RocmRuntime]
) -> list[Finding]:
    if not board_present:
        return []
    validates, how = kernel_validates(sysroot, release)
    facts = {
        "kernel": release,
        "validates": validates,
        "how": how,
        "rdna1_quirks": mask,
        "runtimes": [r.to_json() for r in runtimes],
    }
    if not validates:
        return [
            Finding(
                "queue",
                "ok",
                f"KFD does not check the CWSR buffer size ({how})",
                "the queue failure of 2026 ROCm on RDNA1 needs a kernel that checks it",
                "",
                facts,
            )
        ]
    bit = quirk_bit()
    if mask is not None and mask >> bit & 1:
        return [
            Finding(
                "queue",
                "ok",
                f"KFD checks the CWSR size ({how}); this amdgpu has {QUIRK} " f"(rdna1_quirks=0x{mask:x})",
                f"{QUIRK} accepts the size libhsakmt uses since " "rocm-systems #6125 as well as KFD's own",
                "",
                facts,
            )
        ]
    driver = "the stock amdgpu" if mask is None else f"an rdna1-kmgr amdgpu without {QUIRK} (rdna1_quirks=0x{mask:x})"
    carrying = [r for r in runtimes if r.carries_6125]
    unknown = [r for r in runtimes if r.carries_6125 is None]
    todo = (
        f"1. install rdna1-kmgr's build, which has {QUIRK} on by default (`rdna1-kmgr build`, `vm-test`, "
        f"`install`{'' if mask is None else ' with the default mask'}); 2. or boot the distribution's "
        "kernel from before 6.12 (Debian 12's 6.1, Ubuntu 24.04's GA 6.8); 3. or use a ROCm from before "
        "the change (a rocm-sdk-core nightly dated before 2026-05-14). A ROCm carrying the revert "
        "(rocm-systems #11299) would do too; none is known yet"
    )
    why = (
        "libhsakmt since rocm-systems #6125 maps a CWSR area for 40 waves per CU on RDNA1, KFD expects "
        "32: queue creation fails with EINVAL, the first kernel with HSA_STATUS_ERROR_OUT_OF_RESOURCES "
        "(PyTorch then segfaults)"
    )
    if carrying:
        shown = "; ".join(f"{r.where} {r.version}" for r in carrying)
        return [
            Finding(
                "queue",
                "problem",
                f"KFD checks the CWSR size ({how}), {driver}, and ROCm from after " f"rocm-systems #6125: {shown}",
                why,
                todo,
                facts,
            )
        ]
    if unknown:
        shown = "; ".join(f"{r.where} {r.version}" for r in unknown)
        return [
            Finding(
                "queue",
                "warn",
                f"KFD checks the CWSR size ({how}), {driver}; whether this ROCm has "
                f"rocm-systems #6125 cannot be told from its version: {shown}",
                why + "; if the first GPU operator fails that way, this is why",
                todo,
                facts,
            )
        ]
    shown = "; ".join(f"{r.where} {r.version}" for r in runtimes) or "no ROCm user space found"
    return [
        Finding(
            "queue",
            "ok",
            f"KFD checks the CWSR size ({how}), {driver}; ROCm from before rocm-systems " f"#6125 ({shown})",
            "a ROCm update from after 2026-05-14 would fail to create queues " f"without {QUIRK}",
            "",
            facts,
        )
    ]
