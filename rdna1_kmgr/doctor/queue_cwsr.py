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
nightly rocm-sdk-core versions carry their build date (7.15.0a20260630): before 2026-05-14 they do not; the
pull request was opened on 05-14 and discussed until 05-18, so a nightly of 05-14 to 05-19 cannot be told; later
ones carry it. Releases: ROCm 6.x, 7.0-7.2 (7.2.1 shipped by 2026-04-04) and TheRock's 7.9-7.13 (therock-7.13
pins rocm-systems develop of 2026-05-04) predate it; TheRock 7.14 (branched 2026-07-09), 7.15 and ROCm 10 carry
it (#11299 reports 10.0.0); 8.x and 9.x cannot be told. A ROCm inside a torch wheel (torch/lib's HIP runtime) is
read from torch.version.hip, MAJOR.MINOR.PATCH-HASH. The revert, #11299, was open on 2026-09-10 and is in no
release: REVERTED_IN says from which nightly date on it counts, once it is.
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.doctor import control_stack, kfd_access
from rdna1_kmgr.doctor.finding import Finding
from rdna1_kmgr.doctor.gfx_override import effective
from rdna1_kmgr.render import quirk_catalog
from rdna1_kmgr.userspace.environment_files import Assignment

QUIRK = "cwsr-size"
QUIRK_BIT = 4  # 0x10, the bit issue 22 gave cwsr-size; the catalog's own entry wins when it has one
SIZES_QUIRK = "topology-sizes"
SIZES_BIT = 5  # 0x20
MERGED = (20260514, 20260519)  # rocm-systems #6125: opened 05-14, merged by 05-19; those nightlies cannot be told
FIRST_RELEASE = (7, 14)  # the first release line that carries #6125 (TheRock 7.14); 7.0-7.13 predate it
REVERTED_IN: int | None = None  # the first nightly date carrying rocm-systems #11299; None: in no release yet
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
        if REVERTED_IN is not None and day >= REVERTED_IN:
            return False
        return None if MERGED[0] <= day <= MERGED[1] else day > MERGED[1]
    release = _RELEASE.match(version.strip())
    if not release:
        return None
    line = (int(release.group(1)), int(release.group(2)))
    if line[0] >= 10 or FIRST_RELEASE <= line < (8, 0):
        return True
    return False if line < FIRST_RELEASE else None


def quirk_bit(quirk_id: str = QUIRK, fallback: int = QUIRK_BIT) -> int:
    """The bit of a quirk (cwsr-size unless named) in rdna1_quirks."""
    quirk = quirk_catalog.load_quirks().get(quirk_id)
    return quirk.bit if quirk is not None else fallback


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

    @property
    def lacking(self) -> list[int]:
        """The GPU nodes whose capability lacks the SVM bit (an RX 580 beside the board never has it)."""
        return [n for n, c in self.gpu_capabilities if c is not None and not c & SVM_API]

    @property
    def kernel_offers(self) -> bool | None:
        """Whether the running kernel has the SVM API at all: one GPU node with the bit says so."""
        if any(c is not None and c & SVM_API for _, c in self.gpu_capabilities):
            return True
        return self.offered

    def evidence(self) -> str:
        """How `offered` was found out, in words, naming the nodes that lack the bit."""
        if self.topology_says is not None:
            shown = ", ".join(f"node {n} 0x{c:08x}" for n, c in self.gpu_capabilities if c is not None)
            if self.topology_says:
                return f"KFD's topology has HSA_CAP_SVMAPI_SUPPORTED (0x{SVM_API:08x}) (capability: {shown})"
            nodes = ", ".join(str(n) for n in self.lacking)
            also = " (the other GPU nodes have it: one without it turns it off for all)" if self.kernel_offers else ""
            return (
                f"KFD's topology lacks HSA_CAP_SVMAPI_SUPPORTED (0x{SVM_API:08x}) on GPU node {nodes}{also} "
                f"(capability: {shown})"
            )
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
    stacks: list[control_stack.ControlStack],
    prints: bool | None,
) -> list[Finding]:
    """The `queue` finding: the control stack first (KFD checks it before the area, SVM or not), then the area."""
    validates, how = kernel_validates(sysroot, release)
    if not board_present:
        return [_without_board(release, validates, how, mask, svm, prints)]
    switched_off, zeros = svm_switched_off(use_svm)
    facts = {
        "kernel": release,
        "validates": validates,
        "how": how,
        "rdna1_quirks": mask,
        "runtimes": [r.to_json() for r in runtimes],
        "control_stack": [c.to_json() for c in stacks],
        "svm": svm.to_json(),
        "hsa_use_svm": [a.to_json() for a in use_svm],
    }
    if not validates:
        return [_queue("ok", f"KFD does not check the CWSR buffer size ({how})", _NEEDS, "", facts)]
    backing = _bo_reason(svm, switched_off)
    refused = _control_stack(stacks, runtimes, how, mask, backing, facts)
    if refused is not None:
        return [refused]
    stack = "; ".join(c.describe() for c in stacks if c.printed or c.refused is False) or "control stack as KFD's"
    bit = quirk_bit()
    if mask is not None and mask >> bit & 1:
        seen = f"KFD checks the CWSR size ({how}); {stack}; this amdgpu has {QUIRK} (rdna1_quirks=0x{mask:x})"
        why = f"{QUIRK} accepts the size libhsakmt uses since rocm-systems #6125 as well as KFD's own"
        return [_queue("ok", seen, why, "", facts)]
    driver = "the stock amdgpu" if mask is None else f"an rdna1-kmgr amdgpu without {QUIRK} (rdna1_quirks=0x{mask:x})"
    checks = f"KFD checks the CWSR size ({how}), {driver}; {stack}"
    if switched_off is None and svm.offered:
        seen = (
            f"{checks}; not affected unless {USE_SVM}=0: libhsakmt puts the CWSR area in SVM memory, which KFD "
            f"accepts at ROCm's size ({svm.evidence()})"
        )
        if svm.topology_says is None:  # read from the kernel's config alone: what KFD registered is not known
            return [_queue("warn", "likely " + seen, _CONFIRM, "", facts)]
        return [_queue("ok", seen, _CONFIRM, "", facts)]
    removable = zeros if svm.offered is not False else []  # without the SVM API removing them changes nothing
    return [_by_rocm(runtimes, backing, checks, removable, svm, facts)]


def _control_stack(
    stacks: list[control_stack.ControlStack],
    runtimes: list[RocmRuntime],
    how: str,
    mask: int | None,
    backing: str | None,
    facts: dict,
) -> Finding | None:
    """The problem where KFD refuses a post-#6125 control stack on an RDNA1 node (it does not print its sizes and
    they differ for the board's CUs); None where nothing is refused there or no ROCm here sends that size."""
    refused = [c for c in stacks if c.refused]
    untold = [c for c in stacks if c.refused is None]
    if not refused and not untold:
        return None
    if runtimes and all(r.carries_6125 is False for r in runtimes):
        return None  # every ROCm here sends KFD's own size
    carrying = [r for r in runtimes if r.carries_6125]
    shown = "; ".join(f"{r.where} {r.version}" for r in runtimes) or "no ROCm user space found"
    rocm = (
        f"ROCm from after rocm-systems #6125: {'; '.join(f'{r.where} {r.version}' for r in carrying)}"
        if carrying
        else f"whether this ROCm has rocm-systems #6125 cannot be told from its version: {shown}"
    )
    nodes = "; ".join(c.describe() for c in refused + untold)
    loaded = ""
    if mask is not None and mask >> quirk_bit(SIZES_QUIRK, SIZES_BIT) & 1:
        loaded = f"; the loaded amdgpu has {SIZES_QUIRK} on, yet the node prints nothing: is the board listed?"
    seen = f"KFD checks the control stack exactly ({how}); {nodes}; {rocm}{loaded}"
    level = "problem" if refused and runtimes else "warn"
    area = (
        f" The CWSR area is checked next: {backing}, which {QUIRK} accepts (on in the same build)." if backing else ""
    )
    return _queue(level, seen, _STACK_WHY + area, _STACK_TODO, facts)


_STACK_WHY = (
    "KFD refuses every compute queue whose control stack differs from the node's (EINVAL, SVM or not); "
    "libhsakmt sends KFD's size only where the kernel prints it, and since rocm-systems #6125 computes 40 "
    "waves a CU otherwise: the first GPU operator fails with HSA_STATUS_ERROR_OUT_OF_RESOURCES, and PyTorch "
    "often segfaults."
)
_STACK_TODO = (
    f"1. install rdna1-kmgr's build, which has {SIZES_QUIRK} (upstream's 8fc2796dea6f) on by default on this "
    "kernel (`rdna1-kmgr build`, `vm-test`, `install`); 2. or boot a kernel that prints the sizes: Linux 6.12.64 "
    "and later 6.12, 6.18.4 and later, 6.19, 7.x (Debian's 6.12.95 and later, Ubuntu 24.04's HWE from "
    "6.17.0-19); 3. or use a ROCm from before rocm-systems #6125 (ROCm 7.2.x, TheRock 7.13, a nightly dated "
    "before 2026-05-14)"
)


def _without_board(
    release: str, validates: bool, how: str, mask: int | None, svm: SvmFacts, prints: bool | None
) -> Finding:
    """What this kernel would do to an RDNA1 board, for an owner checking it before the board is in (or in a VM):
    whether it needs topology-sizes and cwsr-size, and whether the loaded amdgpu carries cwsr-size. A note: there
    is no queue here to fail."""
    facts = {
        "kernel": release,
        "validates": validates,
        "how": how,
        "rdna1_quirks": mask,
        "svm": svm.to_json(),
        "prints_sizes": prints,
    }
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
    by_version = prints is None and control_stack.prints_by_version(release) is not None
    if by_version:
        prints = control_stack.prints_by_version(release)
    if validates and prints is not None:
        how_known = " by its version (no KFD topology to read)" if by_version else ""
        seen += (
            f"; KFD prints cwsr_size and ctl_stack_size{how_known}: no control stack to fix"
            if prints
            else f"; KFD does not print cwsr_size and ctl_stack_size{how_known}: an RX 5600 XT or RX 5500 needs "
            f"{SIZES_QUIRK}"
        )
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
    """Why libhsakmt puts the CWSR area in a BO, every reason that holds; None when that cannot be told."""
    if svm.offered is False:
        also = f"; {USE_SVM}=0 in {switched_off.where()} too" if switched_off is not None else ""
        return f"no SVM API, the CWSR area is a BO: {svm.evidence()}{also}"
    if switched_off is not None:
        return f"{USE_SVM}=0 in {switched_off.where()} turns libhsakmt's SVM use off: the CWSR area is a BO"
    return None


def _by_rocm(
    runtimes: list[RocmRuntime], backing: str | None, checks: str, zeros: list[Assignment], svm: SvmFacts, facts: dict
) -> Finding:
    """The finding once KFD checks and no cwsr-size bit is loaded: by the backing and ROCm's version."""
    todo = _todo(zeros, svm)
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


def _todo(zeros: list[Assignment], svm: SvmFacts) -> str:
    build = f"install rdna1-kmgr's build, which has {QUIRK} on by default (`rdna1-kmgr build`, `vm-test`, `install`)"
    if zeros:
        lines = ", ".join(a.where() for a in zeros)
        return f"1. remove {USE_SVM}=0 ({lines}): libhsakmt then uses SVM memory, which KFD accepts; 2. or {build}"
    if svm.kernel_offers:  # the kernel has it: another GPU node without the bit turns it off for all
        kernel = (
            f"2. or take the board of GPU node {', '.join(str(n) for n in svm.lacking)} out of KFD (bind it to "
            "another driver, e.g. vfio-pci): libhsakmt ANDs the SVM bit over every GPU node KFD lists, whatever "
            "ROCR_VISIBLE_DEVICES says"
        )
    else:
        kernel = (
            "2. or boot a kernel whose KFD offers the SVM API (CONFIG_HSA_AMD_SVM=y with CONFIG_DEVICE_PRIVATE=y, "
            "e.g. Debian's 7.x) or one without the check (Debian 12's 6.1, Ubuntu 24.04's GA 6.8)"
        )
    return (
        f"1. {build}; {kernel}; 3. or use a ROCm from before the change (ROCm 7.2.x, TheRock 7.13, a nightly "
        "dated before 2026-05-14). A ROCm carrying the revert (rocm-systems #11299) would do too; none is known yet"
    )


def _queue(level: str, seen: str, why: str, todo: str, facts: dict) -> Finding:
    return Finding("queue", level, seen, why, todo, facts)
