"""The compute-queue failure of RDNA1 with 2026 ROCm, decided by what triggers it.

KFD's exact check: since Linux 6.12, `kfd_queue_acquire_buffers` (amdkfd/kfd_queue.c, read in Debian's 6.12.117;
RHEL 9.6's 5.14.0-570 and RHEL 10's 6.12.0-55 carry it as a backport) requires a BO-backed CWSR mapping to be
exactly the size KFD computes, with 32 waves per CU on gfx10. libhsakmt since rocm-systems PR #6125 (merged
2026-05-14) sizes it with NumSIMDPerCU x MaxWavesPerSIMD, 40 waves per CU on RDNA1: AMDKFD_IOC_CREATE_QUEUE
returns EINVAL and the first kernel launch fails with HSA_STATUS_ERROR_OUT_OF_RESOURCES (rocm-systems PR
#11299, a user-space revert still open on 2026-09-08, shows it on an RX 5500 with ROCm 10.0). The rdna1-kmgr
quirk `cwsr-size` (bit 0x10, on by default) makes KFD accept both sizes on listed boards.

Only a BO fails. Read in rocm-systems' libhsakmt (projects/rocr-runtime/libhsakmt/src):
- queues.c, `handle_concrete_asic`: the save area goes to SVM memory (`mmap` + `register_svm_range(...,
  alwaysMapped)`) when `ctx->hsakmt_is_svm_api_supported`, and to a GTT BO (`allocate_exec_aligned_memory`)
  only when that is off or the registration fails. KFD's SVM path (`kfd_queue_buffer_svm_get`) accepts any
  range that covers its size, so stock KFD takes ROCm's larger area there. (Newer libhsakmt also keeps the BO
  when a node's Capability2 has StallOnRetryFault, recoverable-fault mode; doctor does not read that.)
- openclose.c, `hsaKmtOpenKFDCtx`: `hsakmt_is_svm_api_supported = !(HSA_USE_SVM && !strcmp(HSA_USE_SVM, "0"))`:
  exactly "0" turns SVM off, any other value (00, false, no) leaves it on.
- fmm.c, `hsakmt_fmm_init_process_apertures`: `hsakmt_is_svm_api_supported &= Capability.SVMAPISupported` for
  every node with a GPU: one GPU node without the SVM API turns it off for all.
KFD sets that bit, HSA_CAP_SVMAPI_SUPPORTED = 0x08000000 (include/uapi/linux/kfd_sysfs.h), in the node's
`capability` (kfd_topology.c `kfd_topology_add_device`, when `KFD_IS_SVM_API_SUPPORTED`: built with
CONFIG_HSA_AMD_SVM, which needs CONFIG_DEVICE_PRIVATE, and a device-private page map registered), and
`node_show` prints it as `capability %u`, decimal. Debian 12's and 13's 6.12 kernels have
`# CONFIG_DEVICE_PRIVATE is not set` (BO, the failure); Debian's 7.2 and 7.3 have CONFIG_HSA_AMD_SVM=y.

Which ROCm carries #6125 is read from version numbers, which is as far as public sources go: TheRock's
nightly rocm-sdk-core versions carry their build date (7.15.0a20260630): from 2026-05-15 on they carry it,
before 2026-05-14 they do not, the day itself cannot be told. ROCm 10 releases carry it (#11299); 6.x
releases predate it; 7.x to 9.x releases and distribution packages of them cannot be told from the number.
No ROCm release is known to carry the revert (#11299).
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.doctor import kfd_access
from rdna1_kmgr.doctor.finding import Finding
from rdna1_kmgr.doctor.gfx_override import effective
from rdna1_kmgr.render import quirk_catalog
from rdna1_kmgr.userspace.environment_files import Assignment

QUIRK = "cwsr-size"
QUIRK_BIT = 4  # 0x10, the bit issue 22 gave cwsr-size; the catalog's own entry wins when it has one
MERGED = 20260514  # rocm-systems #6125
VALIDATING_SYMBOL = "kfd_queue_acquire_buffers"
_DATED = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:[.+-]?(?:a|b|rc|dev|post)\.?)(\d{8})")
_RELEASE = re.compile(r"^(\d+)\.(\d+)")
SVM_API = 0x08000000  # HSA_CAP_SVMAPI_SUPPORTED, include/uapi/linux/kfd_sysfs.h
USE_SVM = "HSA_USE_SVM"  # libhsakmt's switch: exactly "0" turns its SVM use off
SVM_OPTIONS = ("CONFIG_HSA_AMD_SVM", "CONFIG_DEVICE_PRIVATE")
_CONFIG_LINE = re.compile(r"(?:(CONFIG_[A-Z0-9_]+)=(.*)|# (CONFIG_[A-Z0-9_]+) is not set)")


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
    validates = numbers is not None and (int(numbers.group(1)), int(numbers.group(2))) >= (6, 12)
    return validates, f"{release}: by its version (the check came with Linux 6.12)"


@dataclass(frozen=True)
class SvmFacts:
    """What says whether KFD offers libhsakmt the SVM API: each GPU node's `capability` in KFD's topology, and
    the running kernel's config for the two options it needs (when the topology cannot be read)."""

    gpu_capabilities: tuple[tuple[int, int | None], ...]  # (node, capability; None: no such line)
    config: str | None  # the config read, as seen from the sysroot's /; None: neither file
    options: tuple[tuple[str, str], ...]  # SVM_OPTIONS' values there: "y", "m", or "n" (not set or absent)

    @property
    def topology_says(self) -> bool | None:
        """Every GPU node has the SVM API (libhsakmt's AND over them); None: no GPU node's capability read."""
        known = [c for _, c in self.gpu_capabilities if c is not None]
        if not known:
            return None
        return all(c & SVM_API for c in known)

    @property
    def config_says(self) -> bool | None:
        if self.config is None:
            return None
        return all(value == "y" for _, value in self.options)

    @property
    def offered(self) -> bool | None:
        """Whether libhsakmt gets the SVM API: the topology when it is readable, else the config, else None."""
        return self.topology_says if self.topology_says is not None else self.config_says

    def evidence(self) -> str:
        """How `offered` was found out, in words."""
        if self.topology_says is not None:
            shown = ", ".join(f"node {n} 0x{c:08x}" for n, c in self.gpu_capabilities if c is not None)
            has = "has" if self.topology_says else "lacks"
            lacking = "" if self.topology_says else " on a GPU node"
            return f"KFD's topology {has} HSA_CAP_SVMAPI_SUPPORTED (0x{SVM_API:08x}){lacking} (capability: {shown})"
        if self.config is not None:
            return f"{self.config}: " + ", ".join(f"{k}={v}" for k, v in self.options)
        return "neither KFD's topology nor the kernel's config could be read"

    def to_json(self) -> dict:
        return {
            "gpu_capabilities": {str(n): c for n, c in self.gpu_capabilities},
            "config": self.config,
            "options": dict(self.options),
            "svm_api": self.offered,
        }


def read_svm_facts(sysroot: Path, release: str) -> SvmFacts:
    """The GPU nodes' capability from KFD's topology, and the SVM options of /boot/config-RELEASE, else of
    /proc/config.gz."""
    capabilities = tuple((n.index, n.properties.get("capability")) for n in kfd_access.read_nodes(sysroot) if n.is_gpu)
    config, text = _kernel_config(sysroot, release)
    values = {}
    for line in text.splitlines():
        match = _CONFIG_LINE.fullmatch(line.strip())
        if match:
            values[match.group(1) or match.group(3)] = "n" if match.group(3) else match.group(2)
    return SvmFacts(capabilities, config, tuple((o, values.get(o, "n")) for o in SVM_OPTIONS) if config else ())


def _kernel_config(sysroot: Path, release: str) -> tuple[str | None, str]:
    boot = f"boot/config-{release}"
    try:
        return "/" + boot, (sysroot / boot).read_text(errors="replace")
    except (OSError, ValueError):
        pass
    try:
        return "/proc/config.gz", gzip.decompress((sysroot / "proc/config.gz").read_bytes()).decode(errors="replace")
    except (OSError, EOFError, zlib.error):
        return None, ""


def svm_switched_off(found: list[Assignment]) -> tuple[Assignment | None, list[Assignment]]:
    """The assignment of HSA_USE_SVM in force when it is exactly "0" (libhsakmt's test), and every line setting
    it to "0" (removing only the one in force would bring an earlier one back)."""
    zeros = [a for a in found if a.value == "0"]
    in_force = effective(found)
    return (in_force if in_force is not None and in_force.value == "0" else None), zeros


def findings(
    board_present: bool,
    release: str,
    sysroot: Path,
    mask: int | None,
    runtimes: list[RocmRuntime],
    svm: SvmFacts,
    use_svm: list[Assignment],
) -> list[Finding]:
    validates, how = kernel_validates(sysroot, release)
    if not board_present:
        return [_without_board(release, validates, how, mask, svm)]
    switched_off, zeros = svm_switched_off(use_svm)
    facts = {
        "kernel": release,
        "validates": validates,
        "how": how,
        "rdna1_quirks": mask,
        "runtimes": [r.to_json() for r in runtimes],
        "svm": svm.to_json(),
        "hsa_use_svm": [a.to_json() for a in use_svm],
    }
    if not validates:
        return [_queue("ok", f"KFD does not check the CWSR buffer size ({how})", _NEEDS, "", facts)]
    bit = quirk_bit()
    if mask is not None and mask >> bit & 1:
        seen = f"KFD checks the CWSR size ({how}); this amdgpu has {QUIRK} (rdna1_quirks=0x{mask:x})"
        why = f"{QUIRK} accepts the size libhsakmt uses since rocm-systems #6125 as well as KFD's own"
        return [_queue("ok", seen, why, "", facts)]
    driver = "the stock amdgpu" if mask is None else f"an rdna1-kmgr amdgpu without {QUIRK} (rdna1_quirks=0x{mask:x})"
    if switched_off is None and svm.offered:
        seen = (
            f"KFD checks the CWSR size ({how}), {driver}; not affected unless {USE_SVM}=0: libhsakmt puts the "
            f"CWSR area in SVM memory, which KFD accepts at ROCm's size ({svm.evidence()})"
        )
        return [_queue("ok", seen, _CONFIRM, "", facts)]
    backing = _bo_reason(svm, switched_off)
    removable = zeros if svm.offered is not False else []  # without the SVM API removing them changes nothing
    return [_by_rocm(runtimes, backing, f"KFD checks the CWSR size ({how}), {driver}", removable, facts)]


def _without_board(release: str, validates: bool, how: str, mask: int | None, svm: SvmFacts) -> Finding:
    """What this kernel would do to an RDNA1 board, for an owner checking it before the board is in (or in a VM):
    whether it needs cwsr-size, and whether the loaded amdgpu carries it. A note: there is no queue here to fail."""
    facts = {"kernel": release, "validates": validates, "how": how, "rdna1_quirks": mask, "svm": svm.to_json()}
    if mask is None:
        loaded = "the loaded amdgpu is not an rdna1-kmgr build"
    elif mask >> quirk_bit() & 1:
        loaded = f"the loaded amdgpu carries {QUIRK}, on (rdna1_quirks=0x{mask:x})"
    else:
        loaded = f"the loaded amdgpu is an rdna1-kmgr build with {QUIRK} off (rdna1_quirks=0x{mask:x})"
    if not validates:
        seen = f"no RDNA1 board here; kernel {release}: KFD does not check the CWSR buffer size ({how}): not affected"
    elif svm.offered:
        seen = (
            f"no RDNA1 board here; kernel {release}: KFD checks the CWSR size ({how}) but offers the SVM API "
            f"({svm.evidence()}): not affected unless {USE_SVM}=0; {loaded}"
        )
    elif svm.offered is False:
        seen = (
            f"no RDNA1 board here; kernel {release}: KFD checks the CWSR size ({how}) and offers no SVM API "
            f"({svm.evidence()}): an RDNA1 board needs {QUIRK}; {loaded}"
        )
    else:
        seen = f"no RDNA1 board here; kernel {release}: KFD checks the CWSR size ({how}); {_UNTOLD}; {loaded}"
    return _queue("info", seen, _NEEDS, "", facts)


_NEEDS = (
    "the queue failure of 2026 ROCm on RDNA1 needs all of: KFD's exact CWSR check, a BO-backed CWSR area and a "
    "ROCm sized after rocm-systems #6125"
)
_CONFIRM = (
    f"to confirm: `capability` in /sys/class/kfd/kfd/topology/nodes/N/properties (decimal) has bit "
    f"0x{SVM_API:08x} on every GPU node; `rdna1-kmgr experiment --profile no-svm` forces the BO case "
    f"({USE_SVM}=0): it fails to create queues with the stock amdgpu and passes with {QUIRK} (with the build "
    "installed, `rdna1-kmgr experiment kernel --kernel-cell quirks-off --cells 'no-svm/*'` is the stock side)"
)
_WHY = (
    "libhsakmt since rocm-systems #6125 maps a CWSR area for 40 waves per CU on RDNA1, KFD expects 32 "
    "of a BO: queue creation fails with EINVAL, the first kernel with HSA_STATUS_ERROR_OUT_OF_RESOURCES "
    "(PyTorch then segfaults)"
)


def _bo_reason(svm: SvmFacts, switched_off: Assignment | None) -> str | None:
    """Why libhsakmt puts the CWSR area in a BO; None when that cannot be told."""
    if svm.offered is False:
        return f"no SVM API, the CWSR area is a BO: {svm.evidence()}"
    if switched_off is not None:
        return f"{USE_SVM}=0 in {switched_off.where()} turns libhsakmt's SVM use off: the CWSR area is a BO"
    return None


def _by_rocm(
    runtimes: list[RocmRuntime], backing: str | None, checks: str, zeros: list[Assignment], facts: dict
) -> Finding:
    """The finding once KFD checks and no cwsr-size bit is loaded: by the backing and ROCm's version."""
    todo = _todo(zeros)
    carrying = [r for r in runtimes if r.carries_6125]
    unknown = [r for r in runtimes if r.carries_6125 is None]
    where = backing or f"whether the CWSR area is a BO cannot be told ({_UNTOLD})"
    if carrying:
        shown = "; ".join(f"{r.where} {r.version}" for r in carrying)
        level = "problem" if backing else "warn"
        return _queue(level, f"{checks}; {where}; ROCm from after rocm-systems #6125: {shown}", _WHY, todo, facts)
    if unknown:
        shown = "; ".join(f"{r.where} {r.version}" for r in unknown)
        seen = f"{checks}; {where}; whether this ROCm has rocm-systems #6125 cannot be told from its version: {shown}"
        return _queue("warn", seen, _WHY + "; if the first GPU operator fails that way, this is why", todo, facts)
    shown = "; ".join(f"{r.where} {r.version}" for r in runtimes) or "no ROCm user space found"
    seen = f"{checks}; {where}; ROCm from before rocm-systems #6125 ({shown})"
    why = f"a ROCm update from after 2026-05-14 would fail to create queues without {QUIRK}"
    return _queue("ok", seen, why, "", facts)


_UNTOLD = "no KFD topology and no /boot/config-KREL or /proc/config.gz"


def _todo(zeros: list[Assignment]) -> str:
    if zeros:
        lines = ", ".join(a.where() for a in zeros)
        return (
            f"1. remove {USE_SVM}=0 ({lines}): libhsakmt then uses SVM memory, which KFD accepts; 2. or install "
            f"rdna1-kmgr's build, which has {QUIRK} on by default (`rdna1-kmgr build`, `vm-test`, `install`)"
        )
    return (
        f"1. install rdna1-kmgr's build, which has {QUIRK} on by default (`rdna1-kmgr build`, `vm-test`, "
        "`install`); 2. or boot a kernel whose KFD offers the SVM API (CONFIG_HSA_AMD_SVM=y with "
        "CONFIG_DEVICE_PRIVATE=y, e.g. Debian's 7.x) or one without the check (Debian 12's 6.1, Ubuntu "
        "24.04's GA 6.8); 3. or use a ROCm from before the change (a rocm-sdk-core nightly dated before "
        "2026-05-14). A ROCm carrying the revert (rocm-systems #11299) would do too; none is known yet"
    )


def _queue(level: str, seen: str, why: str, todo: str, facts: dict) -> Finding:
    return Finding("queue", level, seen, why, todo, facts)
