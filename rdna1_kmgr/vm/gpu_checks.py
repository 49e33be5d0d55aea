"""The passthrough rules of the VM verdict: the GPU's facts as collect.py read them while the first load drove
the board (its driver, the module's probe line, KFD's node and VRAM heap, the workload's results)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rdna1_kmgr.vm.check import MODULE_NAME, Check, last_line, messages

# Passthrough: the driver's probe line (kmod/common/amdgpu_rdna1.c.j2), and KFD's numbers.
PROBE_LINE = re.compile(r"rdna1-kmgr: ([0-9a-f]{4}:[0-9a-f]{4}), quirks active: (.*?) \(rdna1_quirks=")
KFD_VENDOR_ATI = 4098  # 0x1002
HEAP_SYSTEM, HEAP_FB_PRIVATE = 0, 2  # HSA_MEM_HEAP_TYPE_*; 1 is FB_PUBLIC
CRAT_MEM = "crat-mem"
WORKLOAD_CASES = tuple(
    f"conv2d k={k} {part}" for k in (1, 3, 5, 7, 11) for part in ("forward", "backward input", "backward weight")
) + ("resnet18 forward",)


@dataclass(frozen=True)
class GpuTarget:
    """What a passthrough guest looks for: the GPU's ids as the guest sees them, the quirks the module should
    report active on it (None when no manifest says), the workload, if any."""

    vendor_device: str  # "1002:731f"
    quirks: tuple[str, ...] | None
    workload: str | None = None  # "conv2d"


def check_gpu(result: dict, gpu: GpuTarget, load: dict | None) -> list[Check]:
    """The passthrough rules, on the facts collect.py read while the first load drove the GPU."""
    facts = result.get("gpu")
    names = ["gpu-driver", "probe-line", "kfd-node", "vram-heap"] + (["workload"] if gpu.workload else [])
    if facts is None:
        return [Check(name, False, "no GPU facts from the guest (the module did not load)") for name in names]
    checks = [_gpu_driver(facts, gpu), _probe_line(facts, gpu, load)]
    node = _kfd_node(facts, gpu)
    checks.append(node[0])
    checks.append(_vram_heap(node[1], gpu, facts.get("devices") or []))
    if gpu.workload:
        checks.append(_workload(facts.get("workload")))
    return checks


def _gpu_driver(facts, gpu) -> Check:
    devices = facts.get("devices") or []
    if not devices:
        return Check("gpu-driver", False, f"the guest has no PCI device {gpu.vendor_device}")
    off = [d for d in devices if d.get("driver") != MODULE_NAME]
    if off:
        return Check(
            "gpu-driver",
            False,
            f"{gpu.vendor_device} at {off[0]['bdf']} is bound to "
            f"{off[0].get('driver') or 'no driver'}, not {MODULE_NAME}",
        )
    return Check("gpu-driver", True, f"{gpu.vendor_device} at {devices[0]['bdf']} bound to {MODULE_NAME}")


def _probe_line(facts, gpu, load) -> Check:
    if gpu.quirks is None:
        return Check(
            "probe-line",
            False,
            "the render's manifest is unknown, so are the quirks that should be "
            "active (give --manifest with --module)",
        )
    lines = messages(load) + (facts.get("log") or [])
    found = [m for m in (PROBE_LINE.search(line) for line in lines) if m and m[1] == gpu.vendor_device.lower()]
    if not found:
        return Check(
            "probe-line", False, f"no 'rdna1-kmgr: {gpu.vendor_device}, quirks active:' line in the kernel log"
        )
    said = found[-1][2].split()
    active = [] if said == ["none"] else said
    expected = sorted(gpu.quirks)
    if sorted(active) != expected:
        return Check(
            "probe-line",
            False,
            f"the driver reports quirks active: {' '.join(active) or 'none'}; "
            f"expected: {' '.join(expected) or 'none'}",
        )
    return Check("probe-line", True, f"quirks active: {' '.join(active) or 'none'}")


def _kfd_node(facts, gpu) -> tuple[Check, dict | None]:
    device_id = int(gpu.vendor_device.split(":")[1], 16)
    for node in facts.get("kfd_nodes") or []:
        props = node.get("properties", {})
        if props.get("vendor_id") == KFD_VENDOR_ATI and props.get("device_id") == device_id:
            return Check(
                "kfd-node",
                True,
                f"KFD node {node['node']} (device_id {device_id}, " f"{len(node.get('mem_banks', []))} memory bank(s))",
            ), node
    seen = len(facts.get("kfd_nodes") or [])
    return Check(
        "kfd-node",
        False,
        f"no KFD topology node with vendor_id {KFD_VENDOR_ATI} and device_id {device_id} " f"({seen} node(s) seen)",
    ), None


def _vram_heap(node, gpu, devices) -> Check:
    """With crat-mem on, VRAM is one FB_PRIVATE heap with no flags (the quirk's whole point). On a board whose
    BAR is smaller than its VRAM the stock driver reports exactly that by itself: the check says the quirk did
    nothing there rather than crediting it."""
    if node is None:
        return Check("vram-heap", False, "no KFD node for the GPU")
    vram = [b["properties"] for b in node.get("mem_banks", []) if b["properties"].get("heap_type") != HEAP_SYSTEM]
    shown = (
        "; ".join(
            f"heap_type {b.get('heap_type')}, size_in_bytes {b.get('size_in_bytes')}, flags " f"{b.get('flags')}"
            for b in vram
        )
        or "none"
    )
    if CRAT_MEM not in (gpu.quirks or ()):
        return Check("vram-heap", True, f"VRAM bank(s): {shown} (any heap: {CRAT_MEM} not active)")
    if not vram:
        return Check("vram-heap", False, "the GPU's KFD node has no VRAM bank")
    bad = [b for b in vram if b.get("heap_type") != HEAP_FB_PRIVATE or b.get("flags") != 0]
    if len(vram) != 1 or bad:
        return Check(
            "vram-heap",
            False,
            f"{CRAT_MEM} is active but VRAM bank(s) are: {shown} "
            f"(expected one bank, heap_type {HEAP_FB_PRIVATE} FB_PRIVATE, flags 0)",
        )
    size = vram[0].get("size_in_bytes") or 0
    bar = next((d.get("bar0_bytes") for d in devices if d.get("bar0_bytes")), None)
    if bar and bar < size:
        return Check(
            "vram-heap",
            True,
            f"{CRAT_MEM} did nothing: the BAR ({bar >> 20} MiB) is smaller than VRAM "
            f"({size >> 20} MiB), so the stock driver already reports one FB_PRIVATE "
            f"heap (heap_type 2, size_in_bytes {size}, flags 0)",
        )
    return Check(
        "vram-heap",
        True,
        f"one VRAM bank, heap_type 2 (FB_PRIVATE), size_in_bytes {size}, flags 0 "
        f"({CRAT_MEM} took effect: the BAR covers VRAM)"
        if bar
        else f"one VRAM bank, heap_type 2 (FB_PRIVATE), size_in_bytes {size}, flags 0",
    )


def _workload(workload) -> Check:
    runs = (workload or {}).get("runs") or []
    if not runs:
        return Check("workload", False, "the workload did not run")
    report = runs[-1].get("report")
    if report is None:
        return Check(
            "workload",
            False,
            f"the workload printed no report (exit {runs[-1].get('rc')}): " f"{last_line(runs[-1].get('output'))}",
        )
    if "error" in report:
        return Check("workload", False, f"the workload could not run: {report['error']}")
    cases = {c["case"]: c for c in report.get("cases", [])}
    tol = report.get("tolerance", {})
    missing = [name for name in WORKLOAD_CASES if name not in cases]
    if missing:
        return Check("workload", False, f"case(s) missing from the report: {', '.join(missing)}")
    bad = [c for c in cases.values() if not c.get("ok")]
    if bad:
        return Check(
            "workload",
            False,
            f"{len(bad)} case(s) outside rtol {tol.get('rtol')} / atol {tol.get('atol')}, "
            f"first: {bad[0]['case']} max_abs_err {bad[0]['max_abs_err']:.3g}",
        )
    worst = max(cases.values(), key=lambda c: c["max_abs_err"])
    return Check(
        "workload",
        True,
        f"{len(cases)} cases within rtol {tol.get('rtol')} / atol {tol.get('atol')} "
        f"(largest error {worst['max_abs_err']:.3g}, {worst['case']})",
    )


def workload_cases(result: dict | None) -> list[dict] | None:
    """The workload's per-case results, for the record."""
    runs = ((result or {}).get("gpu") or {}).get("workload", {}) or {}
    runs = runs.get("runs") or []
    report = runs[-1].get("report") if runs else None
    return report.get("cases") if report and "cases" in report else None
