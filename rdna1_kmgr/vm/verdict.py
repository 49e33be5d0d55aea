"""The VM verdict: what the guest is asked to do, the rules its results are judged by, and the record.

The guest (qemu/guest/collect.py) only collects facts; every rule lives here, so it is tested on canned
results and applies the same way to emulated and passthrough runs. The record is stored as
state_dir()/validations/<module sha256>.json (the latest verdict for those exact bytes); `install` reads it
back with `passing_record`.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from rdna1_kmgr.core.files import make_dirs, sha256_file, write_json
from rdna1_kmgr.core.paths import state_dir
from rdna1_kmgr.modbuild import module_elf
from rdna1_kmgr.vm.check import MODULE_NAME, Check, first_line, messages
from rdna1_kmgr.vm.gpu_checks import GpuTarget, check_gpu

SCHEMA = 1
SELFTEST_PARAM = "rdna1_selftest"
QUIRKS_PARAM = "rdna1_quirks"

# Lines the driver logs at module init; each one the module file holds must show up when it loads.
# 6.1 prints the [drm] line; 6.12 dropped it, and KFD's CPU CRAT line is printed by both.
INIT_MESSAGES = (
    "[drm] amdgpu kernel modesetting enabled",
    "Virtual CRAT table created for CPU",
)
SELFTEST_LINE = re.compile(r"rdna1-kmgr selftest: (\d+) passed, (\d+) failed")
# A failing self-test switches every quirk off and says so in the same line (kmod/common/amdgpu_rdna1.c.j2).
SELFTEST_FORCED_OFF = re.compile(r"\(first: (.*?)\): quirks forced off, rdna1_quirks=0")
# What a healthy load never prints. WARN() prints "WARNING: CPU: n PID: ... at file:line".
BAD_LINE = re.compile(r"\bOops\b|\bBUG\b|WARNING:|Call Trace:|KASAN|UBSAN:|general protection fault|Kernel panic")
STAGE_LINE = re.compile(r"rdna1-kmgr: stage ")
# Taints a module built out of tree may add: O (out-of-tree, 4096) and E (unsigned or untrusted key, 8192).
ALLOWED_TAINT_LETTERS = frozenset("OE")
ALLOWED_TAINT_BITS = 4096 | 8192


def guest_plan(
    module: module_elf.ModuleFile,
    guest_path: str,
    command_timeout: int = 300,
    gpu: GpuTarget | None = None,
    workload: dict | None = None,
) -> dict:
    """What collect.py does: load the dependencies, then two loads of the module by path, each unloaded.

    With a GPU, its facts are read while the first load (all quirks on) drives it; `workload` is how the
    guest runs the workload script ({name, script, pythons})."""
    first = [f"{SELFTEST_PARAM}=1"] if SELFTEST_PARAM in module.parameters else []
    second = [f"{QUIRKS_PARAM}=0"] if QUIRKS_PARAM in module.parameters else []
    plan = {
        "name": module.name,
        "module": guest_path,
        "depends": list(module.depends),
        "loads": [{"label": "selftest", "params": first}, {"label": "stock", "params": second}],
        "read_parameters": [SELFTEST_PARAM, QUIRKS_PARAM],
        "command_timeout": command_timeout,
    }
    if gpu is not None:
        plan["gpu"] = {
            "vendor_device": gpu.vendor_device,
            "quirks": list(gpu.quirks or ()),
            "on_load": "selftest",
            "workload": workload if gpu.workload else None,
        }
    return plan


def check_module_file(module: module_elf.ModuleFile, release: str, kernel_vermagic: str) -> list[Check]:
    """Checks that need no VM: the module is amdgpu, built for this very kernel."""
    return [
        Check(
            "module-name",
            module.name == MODULE_NAME,
            f"module name {module.name!r}" + ("" if module.name == MODULE_NAME else f", expected {MODULE_NAME!r}"),
        ),
        Check(
            "vermagic",
            module.vermagic == kernel_vermagic,
            f"vermagic {module.vermagic.strip()!r}"
            + (
                ""
                if module.vermagic == kernel_vermagic
                else f" does not match kernel {release} ({kernel_vermagic.strip()!r}): the module was built for "
                f"{module.release}"
            ),
        ),
    ]


def check_guest(
    result: dict | None,
    module: module_elf.ModuleFile,
    release: str,
    selftest_required: int | None,
    run_problem: str | None = None,
    gpu: GpuTarget | None = None,
) -> list[Check]:
    """Judge collect.py's result. `run_problem` says why the run ended badly (a timeout), when it did.
    With `gpu` (a passthrough run), the GPU's checks come on top of every emulated one."""
    if result is None:
        why = run_problem or "the guest wrote no result"
        return [Check("guest-run", False, why)]
    checks = [
        Check(
            "guest-run",
            result.get("finished") is True and run_problem is None,
            run_problem
            or (
                "guest script finished"
                if result.get("finished")
                else f"guest script stopped after step {_last_step(result)!r}"
            ),
        )
    ]
    checks.append(Check("guest-kernel", result.get("kernel") == release, f"guest ran {result.get('kernel')}"))
    checks.append(
        Check(
            "not-preloaded",
            result.get("preloaded") is False,
            f"{module.name} was already loaded before the test"
            if result.get("preloaded")
            else f"{module.name} not loaded before the test",
        )
    )
    steps = {step["name"]: step for step in result.get("steps", [])}
    checks.append(_dependencies(module, steps))
    first, second = steps.get("insmod selftest"), steps.get("insmod stock")
    checks.append(_loaded("load", first))
    checks.append(_identity(module, first))
    checks.append(_selftest(module, first, selftest_required))
    checks.append(_initmessages(module, first))
    checks.append(_clean_log(result))
    checks.append(_taint(result, first))
    checks.append(_stock_reload(module, second))
    checks.append(_unloads(steps))
    if gpu is not None:
        checks += check_gpu(result, gpu, first)
    return checks


def selftest_counts(result: dict | None) -> dict | None:
    """{passed, failed} from the selftest line of the first load, or None when there is none."""
    if not result:
        return None
    for step in result.get("steps", []):
        if step["name"] == "insmod selftest":
            found = _selftest_line(step)
            return {"passed": int(found[1]), "failed": int(found[2])} if found else None
    return None


# --- individual rules -----------------------------------------------------------------------------------------


def _dependencies(module, steps) -> Check:
    if not module.depends:
        return Check("dependencies", True, "none needed")
    step = steps.get("depends")
    if step is None:
        return Check("dependencies", False, "not reached")
    if step["rc"] != 0:
        return Check(
            "dependencies",
            False,
            f"modprobe of {', '.join(module.depends)} failed: "
            f"{first_line(step['output']) or 'exit code ' + str(step['rc'])}",
        )
    return Check("dependencies", True, f"loaded {', '.join(module.depends)}")


def _loaded(name: str, step: dict | None) -> Check:
    if step is None:
        return Check(name, False, "not reached")
    if step["rc"] != 0:
        reason = first_line(step["output"]) or f"exit code {step['rc']}"
        kernel_said = [line for line in messages(step) if not STAGE_LINE.search(line)]
        if kernel_said:
            reason += f"; kernel: {kernel_said[-1]}"
        return Check(name, False, f"insmod {' '.join(step['argv'][2:])} failed: {reason}".replace("  ", " "))
    after = step.get("after", {})
    if after.get("initstate") != "live":
        return Check(name, False, f"module state after insmod is {after.get('initstate')!r}, not 'live'")
    return Check(name, True, "insmod " + (" ".join(step["argv"][2:]) or "(no parameters)") + ": live")


def _identity(module, step) -> Check:
    """The module in the kernel is the file under test: same build id (or srcversion)."""
    if step is None or step["rc"] != 0:
        return Check("identity", False, "not loaded")
    after = step.get("after", {})
    loaded_id = module_elf.note_build_id(bytes.fromhex(after["build_id_note"])) if after.get("build_id_note") else None
    if module.build_id and loaded_id:
        same = loaded_id == module.build_id
        return Check(
            "identity", same, f"loaded build id {loaded_id}" + ("" if same else f" != file's {module.build_id}")
        )
    if module.srcversion and after.get("srcversion"):
        same = after["srcversion"] == module.srcversion
        return Check(
            "identity",
            same,
            f"loaded srcversion {after['srcversion']}" + ("" if same else f" != file's {module.srcversion}"),
        )
    return Check("identity", False, "neither a build id nor a srcversion to compare")


def _selftest(module, step, required: int | None) -> Check:
    if SELFTEST_PARAM not in module.parameters:
        return Check("selftest", False, f"the module has no {SELFTEST_PARAM} parameter: not an rdna1-kmgr build")
    if step is None or step["rc"] != 0:
        return Check("selftest", False, "not reached")
    found = _selftest_line(step)
    if not found:
        errors = [line for line in messages(step) if "rdna1-kmgr selftest" in line]
        return Check("selftest", False, "no selftest summary line" + (f"; {errors[-1]}" if errors else ""))
    passed, failed = int(found[1]), int(found[2])
    need = max(required or 1, 1)
    ok = failed == 0 and passed >= need
    detail = f"{passed} passed, {failed} failed (needs >= {need} passed, 0 failed)"
    forced = SELFTEST_FORCED_OFF.search(found.string)
    failures = [line for line in messages(step) if re.search(r"rdna1-kmgr selftest: .* case \d+ failed", line)]
    if forced:
        detail += f"; first failure: {forced[1]}; the module switched every quirk off (rdna1_quirks=0)"
    elif failures:
        detail += f"; first failure: {failures[0]}"
    return Check("selftest", ok, detail)


def _initmessages(module, step) -> Check:
    expected = [text for text in INIT_MESSAGES if text in module.texts]
    if not expected:
        return Check("init-messages", False, "the module holds none of the known init messages")
    if step is None or step["rc"] != 0:
        return Check("init-messages", False, "not loaded")
    text = "\n".join(messages(step))
    missing = [m for m in expected if m not in text]
    if missing:
        return Check("init-messages", False, f"missing: {'; '.join(missing)}")
    return Check("init-messages", True, f"seen: {'; '.join(expected)}")


def _clean_log(result) -> Check:
    """No oops, BUG, WARNING, call trace or KASAN report from the first load of the module on."""
    lines, started = [], False
    for step in result.get("steps", []):
        started = started or step["name"].startswith("insmod ")
        if started:
            lines.extend(messages(step))
    lines.extend(result.get("tail_log", []) if started else [])
    lines.extend((result.get("gpu") or {}).get("log", []))  # passthrough: read while the GPU was driven
    bad = [line for line in lines if BAD_LINE.search(line) and not STAGE_LINE.search(line)]
    if not started:
        return Check("kernel-log", False, "module never loaded")
    if bad:
        return Check("kernel-log", False, f"{len(bad)} bad line(s), first: {bad[0]}")
    return Check("kernel-log", True, f"no Oops/BUG/WARNING/Call Trace/KASAN in {len(lines)} lines")


def _taint(result, step) -> Check:
    if step is None or step["rc"] != 0:
        return Check("taint", False, "not loaded")
    after = step.get("after", {})
    letters = set(after.get("taint") or "")
    added = after.get("tainted", 0) & ~result.get("tainted_before", 0)
    extra = sorted(letters - ALLOWED_TAINT_LETTERS) + taint_letters(added & ~ALLOWED_TAINT_BITS)
    detail = (
        f"module taint {''.join(sorted(letters)) or 'none'}, kernel taint {after.get('tainted', 0)} "
        f"(was {result.get('tainted_before', 0)})"
    )
    if extra:
        detail += f"; not allowed: {', '.join(sorted(set(extra)))}"
    return Check("taint", not extra, detail)


# The kernel's taint flags by bit, as /proc/sys/kernel/tainted counts them
# (Documentation/admin-guide/tainted-kernels.rst).
_TAINT_FLAGS = "PFSRMBUDAWCIOELKXTN"


def taint_letters(mask: int) -> list[str]:
    return [
        (_TAINT_FLAGS[bit] if bit < len(_TAINT_FLAGS) else f"bit {bit}")
        for bit in range(mask.bit_length())
        if mask >> bit & 1
    ]


def _stock_reload(module, step) -> Check:
    if QUIRKS_PARAM not in module.parameters:
        return Check("stock-reload", False, f"the module has no {QUIRKS_PARAM} parameter: not an rdna1-kmgr build")
    loaded = _loaded("stock-reload", step)
    if not loaded.ok:
        return loaded
    value = step.get("after", {}).get("parameters", {}).get(QUIRKS_PARAM)
    if value != "0":
        return Check("stock-reload", False, f"{QUIRKS_PARAM} reads {value!r} after loading with {QUIRKS_PARAM}=0")
    return Check("stock-reload", True, f"loaded with {QUIRKS_PARAM}=0, parameter reads 0")


def _unloads(steps) -> Check:
    for label in ("selftest", "stock"):
        step = steps.get(f"rmmod {label}")
        if step is None:
            return Check("unload", False, f"rmmod after the {label} load not reached")
        if step["rc"] != 0 or step.get("after", {}).get("loaded"):
            return Check("unload", False, f"rmmod after the {label} load failed: {first_line(step['output'])}")
    return Check("unload", True, "rmmod succeeded after both loads")


def _selftest_line(step):
    found = None
    for line in messages(step):
        found = SELFTEST_LINE.search(line) or found
    return found


def _last_step(result) -> str:
    steps = result.get("steps") or []
    return steps[-1]["name"] if steps else "(none)"


# --- the record -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """The verdict of one run, the same shape for every mode: emulated, passthrough (the module driving the passed
    GPU, with or without a workload) and plumbing (any device passed, seen, given back; no module)."""

    verdict: str  # pass or fail
    reason: str  # the first failing check, or "all checks passed"
    mode: str  # emulated, passthrough or plumbing
    kernel: str
    module: str | None  # the path that was tested (plumbing: None)
    module_sha256: str | None
    accel: str | None
    checks: tuple[Check, ...]
    selftest: dict | None  # {passed, failed, required}
    console_log: str | None
    seconds: float
    started: str
    tool_version: str
    details: dict = field(default_factory=dict)  # run facts: accel probe, stages, build id, vm_seconds
    # Passthrough and plumbing runs: bdf, vendor_device, iommu_group, accepted_reset_risk, forced, reset, the
    # devices given back; passthrough adds workload cases and came_back, plumbing guest_saw and group.
    passthrough: dict | None = None
    schema: int = SCHEMA
    record: str | None = None  # where it is stored

    def __post_init__(self):
        object.__setattr__(self, "checks", tuple(self.checks))

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Record:
        data = dict(data)
        if data.get("plumbing_only"):
            data = _from_plumbing_file(data)
        data["checks"] = [Check(**c) for c in data.get("checks", [])]
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


# What a plumbing-only run wrote before its record was a Record: its device facts at the top level.
_PLUMBING_FACTS = ("vendor_device", "guest_saw", "iommu_group", "group", "devices", "reset", "accepted_reset_risk")


def _from_plumbing_file(data: dict) -> dict:
    facts = {"bdf": data.get("device"), **{k: data.get(k) for k in _PLUMBING_FACTS}, "forced": data.get("forced", [])}
    return {
        **data,
        "mode": "plumbing",
        "module": None,
        "module_sha256": None,
        "selftest": None,
        "details": {"vm_seconds": data.get("vm_seconds")},
        "passthrough": facts,
    }


def decide(checks: list[Check]) -> tuple[str, str]:
    failed = [c for c in checks if not c.ok]
    if failed:
        return "fail", f"{failed[0].name}: {failed[0].detail}"
    return "pass", "all checks passed"


def validations_dir() -> Path:
    return state_dir() / "validations"


def record_path(sha256: str) -> Path:
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return validations_dir() / f"{sha256}.json"


def write(record: Record, path: Path | None = None) -> Path:
    """Store the record atomically (a reader sees the old one or the new one, whole): at `path`, or by its
    module's sha256 under validations/."""
    stored = store(record, path)
    assert stored.record is not None  # store says where it put it
    return Path(stored.record)


def store(record: Record, path: Path | None = None) -> Record:
    """write, and the record as stored (with where)."""
    path = path or record_path(record.module_sha256 or "")  # no module, no place by its hash: refused
    make_dirs(path.parent)
    stored = replace(record, record=str(path))
    write_json(path, stored.to_json(), indent=2, sort_keys=True)
    return stored


def read(sha256: str) -> Record | None:
    path = record_path(sha256)
    try:
        return Record.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, TypeError) as err:
        raise ValueError(f"unreadable verdict record {path}: {err}") from None


def passing_record(module_path: Path, kernel: str) -> Record | None:
    """The passing verdict for exactly these bytes on `kernel`, or None (for `install`)."""
    record = read(sha256_file(module_path))
    if record is None or not record.passed or record.kernel != kernel:
        return None
    return record
