"""`doctor` as a whole: every check in the order a user would follow them (the board, then what is cheap to
put right: device access, the override, PyTorch and its ROCm, the queue check, the environment; the
experiment last), as findings and as text."""

from __future__ import annotations

import os
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


def run(sysroot: Path = Path("/"), pythons: list[str] | None = None, user_name: str | None = None) -> DoctorReport:
    on_host = sysroot.resolve() == Path("/")
    facts = host_facts.detect(sysroot, DEFAULT_TARGET)
    device = board.the_board(facts)
    user = kfd_access.invoking_user(sysroot, user_name)
    nodes = kfd_access.read_nodes(sysroot)
    processor = _board_processor(device, nodes)
    found: list[Finding] = board.findings(facts, sysroot)
    found += kfd_access.findings(sysroot, nodes, user, device is not None)

    home = user.home if user is not None else None
    environ = dict(os.environ) if on_host else None
    checked = environment_files.described(sysroot, home, user.name if user else None, on_host)
    override, loads = gfx_override.findings(
        environment_files.assignments(sysroot, home, lambda name: name == OVERRIDE, environ), processor, checked
    )
    found += override

    processors = tuple(sorted({processor, loads}))
    sites = torch_builds.sites_of(sysroot, home, pythons or [])
    builds = torch_builds.find(sites, processors)
    vendors = frozenset(d.vendor for d in facts.display_devices)
    found += torch_builds.findings(builds, sites, processor, loads, sysroot, vendors if device else frozenset())
    bundled = [i for b in builds for i in b.bundled]
    installs = rocm_libraries.find_installs(rocm_libraries.lib_dirs(sysroot), processors)
    found += rocm_libraries.findings(installs, processor, loads, bundled, any(b.hip for b in builds))

    sdks = [s for s in (therock_wheels.find(site, torch_builds.venv_of(site)) for site in sites) if s is not None]
    found += queue_cwsr.findings(
        device is not None,
        facts.kernel_release,
        sysroot,
        board.quirk_mask(sysroot),
        _runtimes(sysroot, sdks, builds),
        queue_cwsr.read_svm_facts(sysroot, facts.kernel_release),
        environment_files.assignments(sysroot, home, lambda name: name == queue_cwsr.USE_SVM, environ),
        control_stack.read(nodes),
        control_stack.kernel_prints(nodes),
    )
    own = sorted({str(i.lib_dir) for i in bundled})
    found += mixed_stacks.findings(
        environment_files.assignments(sysroot, home, mixed_stacks.wanted, environ), own, checked
    )
    found += miopen_settings.findings(
        environment_files.assignments(sysroot, home, miopen_settings.wanted, environ), loads, checked
    )
    found += kpack_settings.findings(
        environment_files.assignments(sysroot, home, kpack_settings.wanted, environ), checked
    )
    gpu_nodes = [n for n in nodes if n.is_gpu]
    rdna1 = [i for i, n in enumerate(gpu_nodes) if n.processor in CHIP_PROCESSOR.values()]
    found += visible_devices.findings(
        environment_files.assignments(sysroot, home, visible_devices.wanted, environ),
        len(gpu_nodes),
        rdna1[0] if rdna1 and device is not None else None,
        checked,
    )
    records = kmsg.records(sysroot)
    found += pcie_atomics.findings(sysroot, gpu_nodes, records, device is not None)
    found += compute_hangs.findings(records, bool(records))
    found += page_faults.findings(records, bool(records))
    wheels = [f"TheRock's rocm-sdk-core {s.core_version} in {s.site}" for s in sdks if s.core_version]
    wheels += [
        f"torch {b.version}'s own ROCm (HIP {b.hip}) in {b.site / 'torch/lib'}"
        for b in builds
        if b.hip and b.sdk is None and any((b.site / "torch/lib").glob("libamdhip64.so*"))
    ]
    found += versions.findings(sysroot, facts.kernel_release, wheels)
    found += profile_check.findings(sysroot, home, device is not None)
    return DoctorReport(
        sysroot=str(sysroot),
        user=user.name if user else None,
        board=device.bdf if device else None,
        board_processor=processor,
        rocm_loads=loads,
        summary={level: sum(f.level == level for f in found) for level in LEVELS},
        findings=found,
        next_step=next_step(found, device is not None),
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
