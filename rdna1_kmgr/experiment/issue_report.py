"""`rdna1-kmgr report`: what an issue tracker (TheRock's, PyTorch's) asks an owner for, in one Markdown file to
paste, the JSON beside it and, with --html, the experiment's grid; nothing private in any of them.

Not doctor's own report (doctor/report.py, `rdna1-kmgr doctor`): this one gathers doctor's findings, the kernel
and its SVM/CWSR facts (those doctor's queue check reads), the KFD nodes as rocminfo would list them, the ROCm and
torch versions, the installed build and its quirk mask (`status`) and the last experiment's table. It reads what
it can without root and says what it could not read. Every text it writes goes through one redaction
(host/private_values.py) at the end, with the values collected from the machine: user names, homes, the host
name, serial numbers, machine ids, network addresses.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr import __version__
from rdna1_kmgr.core.errors import KmgrError, UsageError
from rdna1_kmgr.core.files import write_atomic, write_json
from rdna1_kmgr.core.output import to_json
from rdna1_kmgr.doctor import kfd_access, queue_cwsr
from rdna1_kmgr.doctor import report as doctor_report
from rdna1_kmgr.experiment import answer
from rdna1_kmgr.experiment.apply import KERNEL_LATEST
from rdna1_kmgr.follow import status as follow_status
from rdna1_kmgr.host import host_facts, kmsg, private_values
from rdna1_kmgr.vm.experiment import experiments_dir

OUTPUT_NAME = re.compile(r"[^/\0]+\.md")
# What a ROCm maintainer asks for first (`dmesg | grep -iE 'amdgpu|kfd'`), bounded: the last lines, each cut short
KERNEL_LOG = re.compile(r"amdgpu|kfd", re.I)
KERNEL_LOG_LINES = 60
KERNEL_LOG_WIDTH = 240
MARKS = {"ok": "ok", "info": "info", "warn": "WARN", "problem": "PROBLEM"}


@dataclass(frozen=True)
class Written:
    markdown: Path
    json: Path
    html: Path | None
    not_read: tuple[str, ...] = ()  # what the report says it could not read (listed at its end)


def default_output() -> Path:
    return Path.cwd() / f"rdna1-kmgr-report-{time.strftime('%Y%m%dT%H%M%S')}.md"


def checked_output(given: str | None) -> Path:
    """Where the Markdown goes: a .md file in an existing folder (the JSON and HTML take its name)."""
    path = Path(given).absolute() if given else default_output()
    if not OUTPUT_NAME.fullmatch(path.name):
        raise UsageError(f"invalid --output {given!r}: not a file name ending in .md", "give e.g. ./report.md")
    if not path.parent.is_dir():
        raise UsageError(f"invalid --output {given!r}: no folder {path.parent}", "give a path in an existing folder")
    if path.is_dir():
        raise UsageError(f"invalid --output {given!r}: it is a folder", "give a file name ending in .md")
    return path


def gather(sysroot: Path, pythons: list[str], user_name: str | None) -> dict:
    """Everything the report says, as one JSON value (not yet redacted)."""
    unread: list[str] = []
    facts = host_facts.detect(sysroot)
    doctor = to_json(doctor_report.run(sysroot, pythons, user_name))
    found = doctor["findings"]
    queue = next((f["facts"] for f in found if f["check"] == "queue"), None)
    if queue is None:  # doctor checks the queue only with a board: the kernel's facts all the same
        validates, how = queue_cwsr.kernel_validates(sysroot, facts.kernel_release)
        svm = queue_cwsr.read_svm_facts(sysroot, facts.kernel_release)
        queue = {"kernel": facts.kernel_release, "validates": validates, "how": how, "svm": svm.to_json()}
    records = kmsg.records(sysroot)
    if not records:
        unread.append("the kernel log (/dev/kmsg): probe errors, ring timeouts and resets are not in this report")
    on_host = sysroot.resolve() == Path("/")
    return {
        "rdna1_kmgr": __version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "system": {
            "distribution": facts.distro_name,
            "kernel": facts.kernel_release,
            "secure_boot": facts.secure_boot_state,
            "iommu": facts.iommu_enabled,
        },
        "kernel_queue_facts": queue,
        "kfd_nodes": [_node(n) for n in kfd_access.read_nodes(sysroot)],
        "versions": next((f["facts"] for f in found if f["check"] == "versions"), {}),
        "torch": [f["facts"] for f in found if f["check"] == "torch" and f["facts"].get("version")],
        "installed_build": _installed(unread),
        "doctor": doctor,
        "experiment": _experiment(unread),
        # status and the experiment read the running host's state: with --sysroot they are not the tree's
        "from_the_host": [] if on_host else ["installed_build", "experiment"],
        "kernel_log": [r.message[:KERNEL_LOG_WIDTH] for r in records if KERNEL_LOG.search(r.message)][
            -KERNEL_LOG_LINES:
        ],
        "not_read": unread,
    }


def _node(node: kfd_access.KfdNode) -> dict:
    """A KFD node with what rocminfo shows of it: processor, compute units' SIMDs, capability bits."""
    capability = node.properties.get("capability")
    return {
        **node.to_json(),
        "simd_count": node.properties.get("simd_count"),
        "cpu_cores_count": node.properties.get("cpu_cores_count"),
        "capability": f"0x{capability:08x}" if capability is not None else None,
    }


def _installed(unread: list[str]) -> dict | None:
    """`status`'s view: per kernel, the amdgpu in use, ours or stock, the build's quirks and the mask loaded."""
    try:
        result = to_json(follow_status.run())  # the report is status's --json, in part
    except (KmgrError, OSError) as err:
        unread.append(f"the installed build (`rdna1-kmgr status`): {getattr(err, 'strerror', None) or err}")
        return None
    kernels = []
    for k in result["kernels"]:
        built = k.get("built") or []
        kernels.append(
            {
                "kernel": k["kernel"],
                "running": k["running"],
                "amdgpu": k["module"]["path"] if k["module"] else None,
                "rdna1_kmgr": bool(k["module"] and k["module"]["rdna1_kmgr"]),
                "packages": [f"{d['package']}/{d['version']}: {d['state']}" for d in k["dkms"]],
                "quirks": built[-1]["quirks"] if built else None,
                "configured": k["parameters"]["modprobe.d"],
                "loaded": k["parameters"].get("loaded"),
                "next_boot": k["next_boot"],
            }
        )
    return {"secure_boot": result["secure_boot"], "kernels": kernels, "profile": result.get("profile")}


def _experiment(unread: list[str]) -> dict:
    """The last host experiment's record and the last kernel cells' record, where the experiment keeps them."""
    folder = experiments_dir()
    records: dict[str, dict | None] = {}
    for kind, name in (("host", answer.LATEST), ("kernel", KERNEL_LATEST)):
        path = folder / name
        try:  # a file in a folder the user cannot enter cannot even be asked whether it exists
            readable = not path.exists() or os.access(path, os.R_OK)
        except PermissionError:
            readable = False
        if not readable:
            unread.append(f"the last {kind} experiment ({path}): not readable without root")
            records[kind] = None
            continue
        records[kind] = answer.read_json(path)
    return records


def experiment_rows(experiment: dict) -> list[answer.Row]:
    host = experiment.get("host") or {}
    kernel = experiment.get("kernel") or {}
    return [answer.record_row(c) for c in host.get("cells", [])] + [answer.Row(**r) for r in kernel.get("rows", [])]


def _yes_no(value: bool | None) -> str:
    return "unknown" if value is None else "yes" if value else "no"


def markdown(report: dict) -> str:
    """The text to paste: what trackers ask first (versions, node facts), then what fails and how."""
    system, queue = report["system"], report["kernel_queue_facts"]
    doctor, versions = report["doctor"], report["versions"]
    svm = queue.get("svm") or {}
    lines = [
        f"## rdna1-kmgr report ({report['time']}, rdna1-kmgr {report['rdna1_kmgr']})",
        "",
        "### System",
        f"- distribution: {system['distribution']}; kernel: `{system['kernel']}`; secure boot: "
        f"{system['secure_boot']}; IOMMU: {'on' if system['iommu'] else 'off'}",
        f"- board: {doctor['board'] or 'none found'}, {doctor['board_processor']}; ROCm loads {doctor['rocm_loads']} "
        "code",
        f"- KFD checks the CWSR size (running kernel): {_yes_no(queue.get('validates'))} ({queue.get('how')})",
        f"- SVM API offered to libhsakmt: {_yes_no(svm.get('svm_api'))} (GPU node capability "
        f"{svm.get('gpu_capabilities') or '-'}; {svm.get('config') or 'no kernel config'}: "
        f"{', '.join(f'{k}={v}' for k, v in (svm.get('options') or {}).items()) or '-'})",
        f"- HSA_USE_SVM: {_assignments(queue.get('hsa_use_svm'))}; rdna1_quirks loaded: "
        f"{_mask(queue.get('rdna1_quirks'))}",
        "",
        "### Versions",
        f"- ROCm packages: {_pairs(versions.get('packages'))}; /opt/rocm: {_pairs(versions.get('opt_rocm'))}",
        f"- ROCm wheels: {'; '.join(versions.get('python_wheels') or []) or 'none'}",
    ]
    for torch in report["torch"]:
        sdk = (torch.get("rocm_sdk") or {}).get("versions") or {}
        wheels = "".join(f", {name} {version}" for name, version in sdk.items() if name.startswith("rocm-sdk-core"))
        lines.append(f"- torch {torch['version']} (HIP {torch.get('hip')}{wheels}) in `{torch['site']}`")
    if not report["torch"]:
        lines.append("- torch: none found")
    lines += ["", "### KFD nodes", "| node | processor | gfx_target_version | simd | cpu cores | capability |"]
    lines.append("|---|---|---|---|---|---|")
    for n in report["kfd_nodes"]:
        lines.append(
            f"| {n['node']} | {n['processor'] or 'CPU'} | {n['gfx_target_version']} | {n['simd_count']} | "
            f"{n['cpu_cores_count']} | {n['capability'] or '-'} |"
        )
    if not report["kfd_nodes"]:
        lines.append("| - | no KFD topology | | | | |")
    host = "" if not report["from_the_host"] else " (the running host's, not the system read)"
    lines += ["", f"### Installed build{host}"] + _installed_lines(report["installed_build"])
    summary = doctor["summary"]
    lines += [
        "",
        f"### doctor: {summary['problem']} problem(s), {summary['warn']} warning(s)",
    ]
    for f in doctor["findings"]:
        lines.append(f"- **{MARKS[f['level']]}** `{f['check']}`: {f['seen']}")
        if f["level"] in ("warn", "problem") and f["todo"]:
            lines.append(f"  - do: {f['todo']}")
    lines += ["", f"### Last experiment{host}"] + _experiment_lines(report["experiment"])
    lines += ["", "### Kernel log (amdgpu, KFD; the last lines)"]
    lines += ["```", *report["kernel_log"], "```"] if report["kernel_log"] else ["- no amdgpu or KFD line"]
    if report["not_read"]:
        lines += ["", "### Not read (run as root to include)"] + [f"- {what}" for what in report["not_read"]]
    return "\n".join(lines) + "\n"


def _assignments(found: list[dict] | None) -> str:
    return ", ".join(f"{a['value']!r} in {a['file']}:{a['line']}" for a in found or []) or "not set"


def _mask(value) -> str:
    return f"0x{value:x}" if isinstance(value, int) else "none (stock amdgpu, or not loaded)"


def _pairs(values: dict | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in (values or {}).items()) or "none"


def _installed_lines(installed: dict | None) -> list[str]:
    if installed is None:
        return ["- not read"]
    lines = []
    for k in installed["kernels"]:
        quirks = k["quirks"] or {}
        lines.append(
            f"- `{k['kernel']}`{' (running)' if k['running'] else ''}: amdgpu "
            f"{'rdna1-kmgr build' if k['rdna1_kmgr'] else 'stock'} ({k['amdgpu'] or 'none'}); "
            f"{'; '.join(k['packages']) or 'no rdna1-amdgpu package'}; quirks carried: "
            f"{' '.join(quirks.get('carried') or []) or '-'} (mask {_mask(quirks.get('mask'))}); loaded: "
            f"{' '.join(f'{a}={b}' for a, b in (k['loaded'] or {}).items()) or '-'}; next boot: {k['next_boot']}"
        )
    return lines or ["- no kernel has an rdna1-kmgr build or install"]


def _experiment_lines(experiment: dict) -> list[str]:
    rows = experiment_rows(experiment)
    if not rows:
        return ["- none run (`rdna1-kmgr experiment`)"]
    said = [line for kind in ("host", "kernel") for line in (experiment.get(kind) or {}).get("answer") or []]
    return ["```", *answer.table(rows), "", *said, "```"]


def write(report: dict, output: Path, with_html: bool, owner: tuple[int, int] | None) -> Written:
    """The Markdown, the JSON beside it and the page, each redacted as a whole, written without following a
    link, as `owner`."""
    hidden = private_values.collect(Path(report["doctor"]["sysroot"]))
    unread = [f"{path}: a serial or id it holds could not be collected (root's alone)" for path in hidden.unreadable]
    report = {**report, "not_read": report["not_read"] + unread}
    text = hidden.redact(markdown(report))
    write_atomic(output, text.encode(), owner=owner)
    json_path = output.with_suffix(".json")
    write_json(json_path, hidden.redact_value(report), indent=1, owner=owner)
    page = None
    if with_html:
        page = output.with_suffix(".html")
        html = answer.html_page(experiment_rows(report["experiment"]), "rdna1-kmgr report", text.splitlines())
        write_atomic(page, hidden.redact(html).encode(), owner=owner)
    return Written(output, json_path, page, tuple(report["not_read"]))
