"""The board and its driver: which RDNA1 GPU, bound to what, stock or rdna1 amdgpu with which quirk mask,
probe errors in the kernel log, BAR size against VRAM, and the IOMMU mode."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rdna1_kmgr.doctor import compute_hangs
from rdna1_kmgr.doctor.finding import Finding
from rdna1_kmgr.host import kmsg
from rdna1_kmgr.host.host_facts import HostFacts
from rdna1_kmgr.host.rdna1_boards import chip_of, format_id
from rdna1_kmgr.host.sysfs import PciDevice, devices_dir
from rdna1_kmgr.render import quirk_catalog

PARAMETERS = "sys/module/amdgpu/parameters"
# amdgpu's own complaints while probing or initialising a board.
_PROBE_ERROR = re.compile(r"amdgpu.*(\*ERROR\*|error|failed|fail |timeout)|probe of \S+ failed", re.I)


def the_board(facts: HostFacts) -> PciDevice | None:
    """The target board, else the first RDNA1 GPU."""
    return facts.target or (facts.rdna1_devices[0] if facts.rdna1_devices else None)


def findings(facts: HostFacts, sysroot: Path) -> list[Finding]:
    board = the_board(facts)
    if board is None:
        shown = (
            ", ".join(
                f"{d.bdf} {d.vendor:04x}:{d.device:04x} ({d.driver or 'no driver'})" for d in facts.display_devices
            )
            or "none"
        )
        return [
            Finding(
                "board",
                "info",
                f"no RDNA1 board on this machine (display devices: {shown})",
                "the checks that need the board (driver, quirk mask, KFD node, BAR) can say nothing "
                "about it here; the ROCm libraries, PyTorch builds and settings are still checked",
                "",
                {"display_devices": [d.to_json() for d in facts.display_devices]},
            )
        ]
    result = [_driver(board, sysroot)]
    result += _probe_errors(sysroot)
    result.append(_bar(board, sysroot))
    result.append(_iommu(board, facts, sysroot))
    return result


def quirk_mask(sysroot: Path) -> int | None:
    """rdna1_quirks of the loaded amdgpu, None when amdgpu is not loaded or is a stock build."""
    try:
        text = (sysroot / PARAMETERS / "rdna1_quirks").read_text().strip()
    except OSError:
        return None
    return int(text, 0) if re.fullmatch(r"(0x)?[0-9a-fA-F]+", text) else None


def describe_mask(mask: int) -> str:
    """The quirks a mask turns on, by the catalog's bits: "coarse-mtype crat-mem", or "none"."""
    catalog = quirk_catalog.load_quirks()
    names = [q.id for q in sorted(catalog.values(), key=lambda q: q.bit) if mask >> q.bit & 1]
    unknown = mask & ~sum(1 << q.bit for q in catalog.values())
    if unknown:
        names.append(f"unknown bits 0x{unknown:x}")
    return " ".join(names) or "none"


def _driver(board: PciDevice, sysroot: Path) -> Finding:
    name = f"{board.bdf} {format_id(board.device)} ({chip_of(board.device)})"
    facts: dict[str, Any] = {"board": board.to_json()}
    if board.driver != "amdgpu":
        return Finding(
            "board",
            "problem" if board.driver is None else "warn",
            f"{name}: bound to {board.driver or 'no driver'}",
            "ROCm needs the board on amdgpu (KFD is part of it)",
            "load amdgpu (`modprobe amdgpu`), or give the board back (`rdna1-kmgr vm-test restore` "
            "after a killed VM run)"
            if board.driver in (None, "vfio-pci")
            else "unbind it from that driver and bind amdgpu",
            facts,
        )
    mask = quirk_mask(sysroot)
    if mask is None:
        return Finding(
            "board",
            "info",
            f"{name}: stock amdgpu (no rdna1_quirks parameter)",
            "the rdna1-kmgr quirks are not in this driver; on kernels that check the CWSR size, 2026 "
            "ROCm needs cwsr-size (see queue)",
            "if compute misbehaves, the cheap checks first: a PyTorch with this board's code (torch), "
            "no HSA_OVERRIDE_GFX_VERSION (gfx-override), device access (access), the queue finding, "
            "then the experiment on the host (`rdna1-kmgr experiment`); the passthrough matrix "
            "(`rdna1-kmgr vm-test matrix auto`, a second GPU) only after those",
            facts,
        )
    facts["rdna1_quirks"] = mask
    return Finding(
        "board",
        "ok",
        f"{name}: rdna1-kmgr amdgpu, rdna1_quirks=0x{mask:x} ({describe_mask(mask)})",
        "the quirks in effect are the bits of this mask",
        "",
        facts,
    )


def _probe_errors(sysroot: Path) -> list[Finding]:
    records = kmsg.records(sysroot)
    if not records:
        on_host = sysroot.resolve() == Path("/")
        return [
            Finding(
                "probe-errors",
                "warn",
                f"the kernel log could not be read ({sysroot / 'dev/kmsg'})",
                "",
                "run as root to read it" if on_host else "",
            )
        ]
    errors = [r.message for r in records if _PROBE_ERROR.search(r.message) and not compute_hangs.is_hang(r.message)]
    if not errors:
        return [Finding("probe-errors", "ok", f"no amdgpu errors in the kernel log ({len(records)} records)")]
    return [
        Finding(
            "probe-errors",
            "problem",
            f"{len(errors)} amdgpu error line(s) in the kernel log, last: " f"{errors[-1]}",
            "a board whose probe failed has no KFD node",
            "read them with "
            "`dmesg | grep amdgpu`; at probe, missing or old firmware (firmware-amd-graphics) is a common "
            "cause; hangs and resets are reported apart (compute-hangs)",
            {"lines": errors[-20:]},
        )
    ]


def _bar(board: PciDevice, sysroot: Path) -> Finding:
    device = devices_dir(sysroot) / board.bdf
    try:
        start, end, _ = (int(x, 16) for x in (device / "resource").read_text().splitlines()[0].split())
    except (OSError, IndexError, ValueError):
        return Finding("bar", "warn", f"{board.bdf}: BAR sizes could not be read ({device / 'resource'})")
    bar0 = end - start + 1 if end else 0
    try:
        vram = int((device / "mem_info_vram_total").read_text())
    except (OSError, ValueError):
        vram = None
    resizable = (device / "resource0_resize").exists()
    facts = {"bar0_bytes": bar0, "vram_bytes": vram, "resizable": resizable}
    shown = (
        f"BAR0 {bar0 >> 20} MiB" + (f", VRAM {vram >> 20} MiB" if vram else "") + (", resizable" if resizable else "")
    )
    if vram and bar0 >= vram:
        return Finding(
            "bar",
            "info",
            f"{board.bdf}: large BAR ({shown})",
            "all VRAM is host-visible and KFD reports it as FB_PUBLIC; no public evidence ties this "
            "to Conv2d results. crat-mem (opt-in) changes only what ROCm user space is told; "
            "ROC_ENABLE_LARGE_BAR exists only in CLR, which takes large-BAR from ROCr's own answer; "
            "the stock driver's small-BAR switch is amdgpu.vis_vramlimit=256",
            "nothing, unless the experiment on this board says otherwise",
            facts,
        )
    return Finding(
        "bar",
        "info",
        f"{board.bdf}: small BAR ({shown})",
        "KFD reports VRAM as FB_PRIVATE already; crat-mem would do nothing here",
        "",
        facts,
    )


def _iommu(board: PciDevice, facts: HostFacts, sysroot: Path) -> Finding:
    try:
        cmdline = (sysroot / "proc/cmdline").read_text().split()
    except OSError:
        cmdline = []
    options = [w for w in cmdline if w.split("=")[0] in ("iommu", "amd_iommu", "intel_iommu")]
    kind = None
    if board.iommu_group is not None:
        try:
            kind = (sysroot / f"sys/kernel/iommu_groups/{board.iommu_group}/type").read_text().strip()
        except OSError:
            kind = None
    data = {"enabled": facts.iommu_enabled, "cmdline": options, "group": board.iommu_group, "group_type": kind}
    if not facts.iommu_enabled:
        return Finding(
            "iommu",
            "info",
            f"IOMMU off (cmdline: {' '.join(options) or 'nothing'})",
            "ROCm runs without it; the passthrough experiment needs it on",
            "for `vm-test gpu`: " "enable it in the firmware and add intel_iommu=on or amd_iommu=on, plus iommu=pt",
            data,
        )
    mode = {"identity": "passthrough (iommu=pt)", "DMA": "translated", "DMA-FQ": "translated, lazy flush"}.get(
        kind or "", kind or "unknown"
    )
    return Finding(
        "iommu",
        "ok" if kind == "identity" else "info",
        f"IOMMU on, the board's group {board.iommu_group} in {mode} mode (cmdline: {' '.join(options) or 'nothing'})",
        "translated DMA puts every GPU access to system memory through the IOMMU; ROCm's install "
        "guide recommends iommu=pt",
        "" if kind == "identity" else "add iommu=pt to the kernel command line",
        data,
    )
