"""`doctor` as a whole: every check in the order a user would follow them (the board, then what is cheap to
put right: device access, the override, PyTorch and its ROCm, the queue check, the environment; the
experiment last), as findings and as text."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.doctor import (
    board,
    compute_hangs,
    control_stack,
    gfx_override,
    kfd_access,
    kpack_settings,
    miopen_settings,
    mixed_stacks,
    page_faults,
    pcie_atomics,
    profile_check,
    queue_cwsr,
    rocm_libraries,
    therock_wheels,
    torch_builds,
    versions,
    visible_devices,
)
from rdna1_kmgr.doctor.finding import LEVELS, Finding
from rdna1_kmgr.host import host_facts, kmsg
from rdna1_kmgr.host.rdna1_boards import DEFAULT_TARGET, chip_of
from rdna1_kmgr.host.sysfs import PciDevice
from rdna1_kmgr.userspace import environment_files
from rdna1_kmgr.userspace.profiles import OVERRIDE

# The processor of each RDNA1 chip, as KFD reports it (gfx_target_version 100100, 100101, 100102).
CHIP_PROCESSOR = {"navi10": "gfx1010", "navi12": "gfx1011", "navi14": "gfx1012"}


@dataclass(frozen=True)
class DoctorReport:
    """What doctor read, for the text and for --json (its fields, the findings as Finding.to_json)."""

    sysroot: str
    user: str | None  # whose device access and shell files were read
    board: str | None  # the RDNA1 board's PCI address; None without one
    board_processor: str
    rocm_loads: str  # the gfx code ROCm loads for it (another one under HSA_OVERRIDE_GFX_VERSION)
    summary: dict[str, int]  # findings per level
    findings: list[Finding]
    next_step: str  # the one thing to do now, or "nothing to do here" and why


@dataclass(frozen=True)
class Gathered:
    """What doctor reads once, before any check runs: every check is a function of this."""

    sysroot: Path
    facts: host_facts.HostFacts
    device: PciDevice | None  # the RDNA1 board
    user: kfd_access.User | None  # whose device access and shell files are read
    nodes: list[kfd_access.KfdNode]
    processor: str  # the board's
    environ: dict[str, str] | None  # this process's environment, on the host only
    checked: str  # which files and environments were read
    override: tuple[list[Finding], str]  # the override's findings and the processor ROCm loads code for
    sites: list[Path]
    builds: list[torch_builds.TorchBuild]
    installs: list[rocm_libraries.Install]
    sdks: list[therock_wheels.RocmSdk]
    records: list[kmsg.Record]  # the kernel log

    @property
    def home(self) -> Path | None:
        return self.user.home if self.user is not None else None

    @property
    def loads(self) -> str:
        return self.override[1]

    @property
    def board_found(self) -> bool:
        return self.device is not None

    @property
    def gpu_nodes(self) -> list[kfd_access.KfdNode]:
        return [n for n in self.nodes if n.is_gpu]

    def assignments(self, wanted: Callable[[str], bool]) -> list[environment_files.Assignment]:
        return environment_files.assignments(self.sysroot, self.home, wanted, self.environ)


def gather(sysroot: Path, pythons: list[str], user_name: str | None) -> Gathered:
    facts = host_facts.detect(sysroot, DEFAULT_TARGET)
    device = board.the_board(facts)
    user = kfd_access.invoking_user(sysroot, user_name)
    nodes = kfd_access.read_nodes(sysroot)
    processor = _board_processor(device, nodes)
    home = user.home if user is not None else None
    on_host = sysroot.resolve() == Path("/")
    environ = dict(os.environ) if on_host else None
    checked = environment_files.described(sysroot, home, user.name if user else None, on_host)
    override = gfx_override.findings(
        environment_files.assignments(sysroot, home, lambda name: name == OVERRIDE, environ), processor, checked
    )
    processors = tuple(sorted({processor, override[1]}))
    sites = torch_builds.sites_of(sysroot, home, pythons)
    builds = torch_builds.find(sites, processors)
    installs = rocm_libraries.find_installs(rocm_libraries.lib_dirs(sysroot), processors)
    sdks = [s for s in (therock_wheels.find(site, torch_builds.venv_of(site)) for site in sites) if s is not None]
    return Gathered(
        sysroot,
        facts,
        device,
        user,
        nodes,
        processor,
        environ,
        checked,
        override,
        sites,
        builds,
        installs,
        sdks,
        kmsg.records(sysroot),
    )


# --- the checks, in the order a user would follow them: one function of what was gathered each ------------------


def _board(g: Gathered) -> list[Finding]:
    return board.findings(g.facts, g.sysroot)


def _kfd_access(g: Gathered) -> list[Finding]:
    return kfd_access.findings(g.sysroot, g.nodes, g.user, g.board_found)


def _gfx_override(g: Gathered) -> list[Finding]:
    return g.override[0]


def _torch_builds(g: Gathered) -> list[Finding]:
    vendors = frozenset(d.vendor for d in g.facts.display_devices) if g.board_found else frozenset()
    return torch_builds.findings(g.builds, g.sites, g.processor, g.loads, g.sysroot, vendors)


def _rocm_libraries(g: Gathered) -> list[Finding]:
    bundled = [i for b in g.builds for i in b.bundled]
    return rocm_libraries.findings(g.installs, g.processor, g.loads, bundled, any(b.hip for b in g.builds))


def _queue_cwsr(g: Gathered) -> list[Finding]:
    return queue_cwsr.findings(
        g.board_found,
        g.facts.kernel_release,
        g.sysroot,
        board.quirk_mask(g.sysroot),
        _runtimes(g.sysroot, g.sdks, g.builds),
        queue_cwsr.read_svm_facts(g.sysroot, g.facts.kernel_release),
        g.assignments(lambda name: name == queue_cwsr.USE_SVM),
        control_stack.read(g.nodes),
        control_stack.kernel_prints(g.nodes),
    )


def _mixed_stacks(g: Gathered) -> list[Finding]:
    own = sorted({str(i.lib_dir) for b in g.builds for i in b.bundled})
    return mixed_stacks.findings(g.assignments(mixed_stacks.wanted), own, g.checked)


def _miopen_settings(g: Gathered) -> list[Finding]:
    return miopen_settings.findings(g.assignments(miopen_settings.wanted), g.loads, g.checked)


def _kpack_settings(g: Gathered) -> list[Finding]:
    return kpack_settings.findings(g.assignments(kpack_settings.wanted), g.checked)


def _visible_devices(g: Gathered) -> list[Finding]:
    rdna1 = [i for i, n in enumerate(g.gpu_nodes) if n.processor in CHIP_PROCESSOR.values()]
    index = rdna1[0] if rdna1 and g.board_found else None
    return visible_devices.findings(g.assignments(visible_devices.wanted), len(g.gpu_nodes), index, g.checked)


def _pcie_atomics(g: Gathered) -> list[Finding]:
    return pcie_atomics.findings(g.sysroot, g.gpu_nodes, g.records, g.board_found)


def _compute_hangs(g: Gathered) -> list[Finding]:
    return compute_hangs.findings(g.records, bool(g.records))


def _page_faults(g: Gathered) -> list[Finding]:
    return page_faults.findings(g.records, bool(g.records))


def _versions(g: Gathered) -> list[Finding]:
    wheels = [f"TheRock's rocm-sdk-core {s.core_version} in {s.site}" for s in g.sdks if s.core_version]
    wheels += [
        f"torch {b.version}'s own ROCm (HIP {b.hip}) in {b.site / 'torch/lib'}"
        for b in g.builds
        if b.hip and b.sdk is None and any((b.site / "torch/lib").glob("libamdhip64.so*"))
    ]
    return versions.findings(g.sysroot, g.facts.kernel_release, wheels)


def _profile(g: Gathered) -> list[Finding]:
    return profile_check.findings(g.sysroot, g.home, g.board_found)


# Adding a finding: a check module with its findings(), one entry here, and its test.
CHECKS: tuple[Callable[[Gathered], list[Finding]], ...] = (
    _board,
    _kfd_access,
    _gfx_override,
    _torch_builds,
    _rocm_libraries,
    _queue_cwsr,
    _mixed_stacks,
    _miopen_settings,
    _kpack_settings,
    _visible_devices,
    _pcie_atomics,
    _compute_hangs,
    _page_faults,
    _versions,
    _profile,
)


def run(sysroot: Path = Path("/"), pythons: list[str] | None = None, user_name: str | None = None) -> DoctorReport:
    gathered = gather(sysroot, pythons or [], user_name)
    found = [finding for check in CHECKS for finding in check(gathered)]
    return DoctorReport(
        sysroot=str(sysroot),
        user=gathered.user.name if gathered.user else None,
        board=gathered.device.bdf if gathered.device else None,
        board_processor=gathered.processor,
        rocm_loads=gathered.loads,
        summary={level: sum(f.level == level for f in found) for level in LEVELS},
        findings=found,
        next_step=next_step(found, gathered.board_found),
    )


def next_step(found: list[Finding], board: bool) -> str:
    """The single thing to do now: the first PROBLEM's fix (doctor lists them in the order to fix them), else the
    first warning's, else the experiment on a machine with the board, else nothing, and why."""
    for level in ("problem", "warn"):
        first = next((f for f in found if f.level == level and f.todo), None)
        if first is not None:
            return f"{first.check}: {first.todo}"
    if not board:
        return "nothing to do here: no RDNA1 board on this machine (run doctor where the board is)"
    return (
        "nothing marked to fix; check that Conv2d is right on the board with `rdna1-kmgr experiment` "
        "(on this desktop, no reboot, nothing changed)"
    )


def _runtimes(
    sysroot: Path, sdks: list[therock_wheels.RocmSdk], builds: list[torch_builds.TorchBuild]
) -> list[queue_cwsr.RocmRuntime]:
    """Every ROCm user space whose libhsakmt may create the queues: TheRock's rocm-sdk-core wheels, the HIP
    runtime a torch wheel carries in torch/lib (its version is torch.version.hip), AMD's /opt/rocm* trees and the
    distribution's HSA runtime package."""
    found = [queue_cwsr.RocmRuntime(f"rocm-sdk-core in {s.site}", s.core_version) for s in sdks if s.core_version]
    found += [
        queue_cwsr.RocmRuntime(f"torch {b.version}'s own ROCm in {b.site / 'torch/lib'} (HIP)", b.hip)
        for b in builds
        if b.hip and any((b.site / "torch/lib").glob("libhsa-runtime64.so*"))
    ]
    found += [
        queue_cwsr.RocmRuntime(path, version) for path, version in versions.opt_rocm(sysroot).items() if version != "?"
    ]
    found += [
        queue_cwsr.RocmRuntime(f"package {name}", version.split(":")[-1])
        for name, version in versions.installed_packages(sysroot).items()
        if name.startswith("libhsa-runtime64")
    ]
    return found


def _board_processor(device, nodes: list[kfd_access.KfdNode]) -> str:
    """What KFD reports for an RDNA1 node, else what the board's chip is, else gfx1010 (the RX 5600 XT)."""
    for node in nodes:
        processor = node.processor
        if processor is not None and processor in CHIP_PROCESSOR.values():
            return processor
    if device is not None:
        return CHIP_PROCESSOR.get(chip_of(device.device) or "", "gfx1010")
    return "gfx1010"


def text_lines(result: DoctorReport) -> list[str]:
    marks = {"ok": "ok     ", "info": "info   ", "warn": "WARN   ", "problem": "PROBLEM"}
    lines = [
        f"doctor for {result.board_processor}"
        + (f" (board {result.board})" if result.board else " (no board here)")
        + f"; ROCm loads {result.rocm_loads} code; user {result.user or '?'}"
    ]
    for finding in result.findings:
        lines.append(f"{marks[finding.level]} {finding.check:15} {finding.seen}")
        if finding.why and finding.level in ("warn", "problem", "info"):
            lines.append(f"{'':24}why: {finding.why}")
        if finding.todo:
            lines.append(f"{'':24}do:  {finding.todo}")
    summary = result.summary
    lines.append(
        f"{summary['problem']} problem(s), {summary['warn']} warning(s), {summary['ok']} ok, "
        f"{summary['info']} note(s)"
    )
    lines.append(f"next: {result.next_step}")
    return lines
