"""`rdna1-kmgr status`: per kernel, what rdna1-kmgr built and installed, and whether it is in use. Reads only.

A kernel is listed when it has a journal, a DKMS entry of rdna1-amdgpu, a follow record, or is the running one. For
each:
the DKMS package versions and their states; the amdgpu that `modinfo -k KREL -n amdgpu` resolves to, its
sha256 and whether it is ours; its signature (checked with openssl against the certificate) and the
certificate's enrollment; the VM verdict of the module each DKMS build left and of the installed one (pass or
fail, when, in which mode, what was checked); what `follow` decided for it (pending, patched,
or stock and why) and which amdgpu its next boot loads; the parameters configured in modprobe.d, given on the kernel
command line and in effect in the loaded module; and, for the running kernel, whether this module is loaded.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, TypedDict

from rdna1_kmgr.core.errors import BuildError, KmgrError
from rdna1_kmgr.core.files import sha256_file
from rdna1_kmgr.follow import follow_record
from rdna1_kmgr.host import host_facts
from rdna1_kmgr.install import boot_guard, user_profile
from rdna1_kmgr.install.journal import Journal
from rdna1_kmgr.install.module_install import MODPROBE_CONF, resolved_module
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.modbuild import module_checks, module_elf, package_build, signing
from rdna1_kmgr.render.manifest import Manifest
from rdna1_kmgr.vm import verdict

MODULE = "amdgpu"
PARAMETER_PREFIX = "rdna1_"


def configured_options(root: TargetRoot, module: str = MODULE) -> list[dict]:
    """`options <module> ...` lines in effect, with their file, in the order modprobe reads them."""
    chosen: dict[str, Path] = {}
    for folder in root.modprobe_dirs():
        if folder.is_dir():
            for conf in folder.glob("*.conf"):
                chosen.setdefault(conf.name, conf)  # an earlier folder hides the same name in later ones
    found = []
    for name in sorted(chosen):
        try:
            text = chosen[name].read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            words = line.split("#", 1)[0].split()
            if len(words) >= 2 and words[0] == "options" and words[1] == module:
                found.append({"file": str(chosen[name]), "options": dict(_pair(w) for w in words[2:])})
    return found


def cmdline_options(root: TargetRoot, module: str = MODULE) -> dict[str, str]:
    try:
        words = root.proc_cmdline.read_text().split()
    except OSError:
        return {}
    prefix = f"{module}."
    return dict(_pair(w[len(prefix) :]) for w in words if w.startswith(prefix))


def loaded_parameters(root: TargetRoot, module: str = MODULE) -> dict[str, str] | None:
    folder = root.sys_module / module / "parameters"
    if not folder.is_dir():
        return None
    values = {}
    for param in sorted(folder.glob(f"{PARAMETER_PREFIX}*")):
        try:
            values[param.name] = param.read_text().strip()
        except OSError:
            values[param.name] = "?"
    return values


def _pair(word: str) -> tuple[str, str]:
    key, _, value = word.partition("=")
    return key, value


def _loaded_is(path: Path, root: TargetRoot, module: str = MODULE) -> bool | None:
    """Whether the loaded module is that file (same build id, else srcversion); None when not loaded."""
    base = root.sys_module / module
    if not (base / "initstate").exists() and not (base / "parameters").is_dir():
        return None
    try:
        info = module_elf.read(path)
    except KmgrError:
        return False
    note = base / "notes" / ".note.gnu.build-id"
    if info.build_id and note.is_file():
        return module_elf.note_build_id(note.read_bytes()) == info.build_id
    srcversion = base / "srcversion"
    if info.srcversion and srcversion.is_file():
        return srcversion.read_text().strip() == info.srcversion
    return False


def _signature(path: Path, cert: Path) -> dict:
    signer = " ".join(module_checks.modinfo_field(path, "signer")) if path.is_file() else ""
    if not cert.is_file():
        return {"signer": signer, "valid": None, "detail": f"no certificate {cert}"}
    try:
        module_checks.verify_signature(path, cert)
    except BuildError as err:
        return {"signer": signer, "valid": False, "detail": err.line()}
    return {"signer": signer, "valid": True, "detail": f"verifies against {cert}"}


def _verdict(sha256: str) -> dict | None:
    try:
        record = verdict.read(sha256)
    except ValueError as err:
        return {"verdict": "unreadable", "detail": str(err)}
    if record is None:
        return None
    return {
        "verdict": record.verdict,
        "mode": record.mode,
        "kernel": record.kernel,
        "reason": record.reason,
        "record": str(verdict.record_path(sha256)),
        "when": record.started,
        "accel": record.accel,
        "checked": [c.name for c in record.checks],
        "failed": [c.name for c in record.checks if not c.ok],
    }


def _builds(entries: list, kernel: str, trees: dkms.Trees) -> list[dict]:
    """The module each DKMS build of this kernel left, with its verdict (the one `install` will ask for)."""
    builds = []
    for entry in entries:
        if entry.kernel != kernel or entry.state not in ("built", "installed"):
            continue
        try:
            module = dkms.built_module(dkms.Package(entry.name, entry.version), kernel, trees)
        except BuildError:
            continue
        digest = sha256_file(module)
        builds.append(
            {
                "version": entry.version,
                "module": str(module),
                "sha256": digest,
                "verdict": _verdict(digest),
                "quirks": build_quirks(_manifest_of(dkms.Package(entry.name, entry.version), trees)),
            }
        )
    return builds


def _manifest_of(package: dkms.Package, trees: dkms.Trees) -> Manifest | None:
    try:
        return Manifest.read(package.source_dir(trees) / dkms.MANIFEST_NAME)
    except (OSError, KmgrError):
        return None  # status reads what it can; install and follow say what is wrong with it


def build_quirks(manifest: Manifest | None) -> dict | None:
    """What a build carries, from its render manifest: the rdna1_quirks bits `install --quirks` may switch on,
    those on by default, and the quirks render left out with why (None: no manifest)."""
    if manifest is None:
        return None
    return {
        "carried": [b.id for b in manifest.bits],
        "mask": manifest.carried_mask.bits if manifest.carried_mask is not None else None,
        "default": [b.id for b in manifest.bits if b.default],
        "default_mask": manifest.quirks_mask.bits if manifest.quirks_mask is not None else None,
        "left_out": [{"id": q.id, "why": q.why} for q in manifest.left_out],
    }


def quirks_lines(quirks: dict | None) -> list[str]:
    if not quirks:
        return []
    mask = f" (0x{quirks['mask']:x})" if isinstance(quirks.get("mask"), int) else ""
    lines = [
        f"  quirks      carried: {' '.join(quirks['carried']) or 'none'}{mask}; on by default: "
        f"{' '.join(quirks['default']) or 'none'}"
    ]
    lines += [f"              left out: {q['id']}: {q['why']}" for q in quirks["left_out"]]
    return lines


# A kernel's amdgpu parameters, as status --json shows them (a TypedDict: "modprobe.d" is no identifier).
# modprobe.d: each file's options; ours: our modprobe.d file when there is one; the running kernel only: cmdline,
# the kernel command line's amdgpu.* options, and loaded, the loaded module's rdna1_* parameters (None: no
# parameters folder in /sys, the module is not loaded).
Parameters = TypedDict(
    "Parameters",
    {
        "modprobe.d": list[dict],
        "ours": str | None,
        "cmdline": NotRequired[dict[str, str]],
        "loaded": NotRequired[dict[str, str] | None],
    },
)


@dataclass(frozen=True)
class KernelStatus:
    """One kernel's part of `status` (--json: these fields; the values below them are the JSON objects)."""

    kernel: str
    running: bool
    dkms: list[dict]  # package, version, state: each DKMS entry of rdna1-amdgpu for this kernel
    built: list[dict]  # the module each DKMS build left: version, module, sha256, verdict, quirks
    journal: dict | None  # the install journal's state, version, module_sha256, vm_check, since (or corrupted)
    module: dict | None  # the amdgpu modinfo resolves to: path, sha256, rdna1_kmgr (ours: signature, verdict)
    parameters: Parameters
    loaded: dict | None  # the running kernel: amdgpu_loaded, is_this_module
    follow: follow_record.FollowRecord | None  # follow's record
    next_boot: str


@dataclass(frozen=True)
class Certificate:
    path: str
    enrollment: str


@dataclass(frozen=True)
class CompilerCache:
    """The builds' ccache (modbuild/package_build.py): where, how much it holds, its cap."""

    path: str
    bytes: int
    max_size: str | None  # ccache.conf's max_size; None until a build sets it


@dataclass(frozen=True)
class StatusReport:
    """Everything `status` says; --json is its fields."""

    secure_boot: str
    certificate: Certificate
    kernels: list[KernelStatus]
    boot_guard: dict  # boot_guard.describe
    profile: dict | None  # user_profile.status
    compiler_cache: CompilerCache | None


def kernel_status(kernel: str, root: TargetRoot, trees: dkms.Trees, cert: Path, dkms_entries: list) -> KernelStatus:
    running = kernel == os.uname().release and root.is_system
    journal = Journal(kernel)
    try:
        state = journal.state()
        installed = state.install
        journal_info = (
            None
            if state.begin is None and not state.steps
            else {
                "state": state.description,
                "path": str(journal.path),
                "version": installed.package.version if installed and installed.package else None,
                "module_sha256": installed.module_sha256 if installed else None,
                "vm_check": installed.vm_check if installed else None,
                "since": state.since,
            }
        )
    except KmgrError as err:
        journal_info = {"state": "corrupted", "path": str(journal.path), "detail": err.line()}
    resolved = resolved_module(kernel, MODULE, root)
    module = None
    if resolved is not None and resolved.is_file():
        digest = sha256_file(resolved)
        ours = bool(journal_info and journal_info.get("module_sha256") == digest) or "/updates/dkms/" in str(resolved)
        module = {"path": str(resolved), "sha256": digest, "rdna1_kmgr": ours}
        if ours:
            module["signature"] = _signature(resolved, cert)
            module["verdict"] = _verdict(digest)
    params: Parameters = {
        "modprobe.d": configured_options(root),
        "ours": str(root.modprobe_dir / MODPROBE_CONF) if (root.modprobe_dir / MODPROBE_CONF).is_file() else None,
    }
    if running:
        params["cmdline"] = cmdline_options(root)
        params["loaded"] = loaded_parameters(root)
    loaded = _loaded_is(resolved, root) if running and resolved is not None else None
    follow = follow_record.read(kernel)
    if follow is None and kernel in follow_record.pending():
        follow = follow_record.FollowRecord(kernel, "pending", None)  # the marker without its record
    return KernelStatus(
        kernel=kernel,
        running=running,
        dkms=[{"package": e.name, "version": e.version, "state": e.state} for e in dkms_entries if e.kernel == kernel],
        built=_builds(dkms_entries, kernel, trees),
        journal=journal_info,
        module=module,
        parameters=params,
        loaded=None
        if not running
        else {"amdgpu_loaded": (root.sys_module / MODULE).is_dir(), "is_this_module": loaded},
        follow=follow,
        next_boot=_next_boot(module, follow),
    )


def _next_boot(module: dict | None, follow: follow_record.FollowRecord | None) -> str:
    """Which amdgpu the kernel's next boot loads, as things stand (a pending follow-up may change it)."""
    now = "the rdna1-kmgr build" if module and module["rdna1_kmgr"] else "the stock amdgpu"
    if follow is not None and follow.state in ("pending", "running"):
        return f"{now}; the patched one once `rdna1-kmgr follow` finishes ({follow.state})"
    return now


def run(cert: str | None = None) -> StatusReport:
    root = TargetRoot.from_env()
    trees = dkms.Trees.from_env()
    cert_path = Path(cert).absolute() if cert else signing.convention().cert
    entries = dkms.status(dkms.PACKAGE_NAME, trees) if shutil.which("dkms") else []
    kernels = set(Journal.kernels()) | {e.kernel for e in entries if e.kernel} | set(follow_record.kernels())
    if root.is_system:
        kernels.add(os.uname().release)
    facts = host_facts.detect(root.path)
    enrollment = signing.enrollment(cert_path) if cert_path.is_file() else f"no certificate {cert_path}"
    return StatusReport(
        secure_boot=facts.secure_boot_state,
        certificate=Certificate(str(cert_path), enrollment),
        kernels=[kernel_status(k, root, trees, cert_path, entries) for k in sorted(kernels)],
        boot_guard=boot_guard.describe(root),
        profile=user_profile.status(),
        compiler_cache=compiler_cache(),
    )


def compiler_cache() -> CompilerCache:
    folder = package_build.ccache_dir()
    held = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0
    conf = folder / "ccache.conf"
    caps = [line.split("=", 1)[1].strip() for line in _lines(conf) if line.split("=", 1)[0].strip() == "max_size"]
    return CompilerCache(str(folder), held, caps[-1] if caps else None)


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []


def text_lines(result: StatusReport) -> list[str]:
    lines = [
        f"secure boot   {result.secure_boot}",
        f"certificate   {result.certificate.path}: {result.certificate.enrollment}",
    ]
    cache = result.compiler_cache
    if cache:
        cap = (
            f" of {cache.max_size}"
            if cache.max_size
            else f", no cap yet (the next build sets {package_build.CCACHE_MAX_SIZE})"
        )
        lines.append(f"ccache        {cache.bytes / 1e6:.0f} MB{cap} in {cache.path}")
    guard = result.boot_guard or {}
    if guard.get("installed"):
        lines.append(
            f"boot guard    this boot: {guard['this_boot'] or 'not started by the guard'}; next boot: "
            f"{guard['next_boot']} (grubenv rdna1_kmgr={guard['state'] or 'unset'}, mask {guard['mask']})"
        )
        if guard.get("loaded"):
            lines.append(f"amdgpu loaded {guard['loaded']['says']}")
        lines.append(f"              {guard['message']}")
    if not result.kernels:
        lines.append("no kernel has an rdna1-kmgr build or install")
    for k in result.kernels:
        lines.append("")
        lines.append(f"kernel {k.kernel}" + ("  (running)" if k.running else ""))
        for entry in k.dkms:
            lines.append(f"  package     {entry['package']}/{entry['version']}: {entry['state']}")
            for built in k.built:
                if built["version"] == entry["version"]:
                    lines.append(f"  built       {built['module']}")
                    lines += quirks_lines(built.get("quirks"))
                    lines.append("  verdict     " + verdict_text(built["verdict"]))
        if not k.dkms:
            lines.append("  package     no rdna1-amdgpu build")
        j = k.journal
        if j:
            lines.append(
                f"  journal     {j['state']}"
                + (f" ({j['version']}, since {j['since']})" if j.get("version") else "")
                + (f": {j['detail']}" if j.get("detail") else "")
            )
            if isinstance(j.get("vm_check"), dict) and j["vm_check"].get("skipped"):
                lines.append(
                    f"              installed WITHOUT a passing VM verdict (--skip-vm-check): {j['vm_check']['why']}"
                )
            if j["state"] in ("install unfinished", "rollback unfinished"):
                lines.append(f"              run `rdna1-kmgr rollback --kernel {k.kernel}` to finish undoing it")
        m = k.module
        if m is None:
            lines.append(f"  amdgpu      modinfo finds none for {k.kernel}")
        else:
            lines.append(f"  amdgpu      {m['path']}" + ("  (rdna1-kmgr)" if m["rdna1_kmgr"] else "  (stock)"))
            lines.append(f"  sha256      {m['sha256']}")
            if "signature" in m:
                s = m["signature"]
                state = {True: "valid", False: "INVALID", None: "not checked"}[s["valid"]]
                lines.append(f"  signature   {state}, signer {s['signer']!r} ({s['detail']})")
                lines.append("  verdict     " + verdict_text(m["verdict"]))
        if k.follow is not None:
            lines.append(f"  follow      {follow_record.describe(k.follow)}")
        lines.append(f"  next boot   {k.next_boot}")
        p = k.parameters
        for entry in p["modprobe.d"]:
            opts = " ".join(f"{a}={b}" for a, b in entry["options"].items())
            lines.append(f"  modprobe.d  {opts}  ({entry['file']})")
        if not p["modprobe.d"]:
            lines.append("  modprobe.d  no options for amdgpu")
        if k.running and k.loaded is not None:
            if p.get("cmdline"):
                lines.append("  cmdline     " + " ".join(f"amdgpu.{a}={b}" for a, b in p["cmdline"].items()))
            loaded = k.loaded
            if not loaded["amdgpu_loaded"]:
                lines.append("  loaded      amdgpu is not loaded in the running kernel")
            else:
                which = {True: "this module", False: "another amdgpu (not the one installed)", None: "unknown"}
                lines.append(
                    f"  loaded      {which[loaded['is_this_module']]}; parameters "
                    + (" ".join(f"{a}={b}" for a, b in (p.get("loaded") or {}).items()) or "no rdna1_* ones")
                )
    lines += profile_lines(result.profile)
    return lines


def profile_lines(profile: dict | None) -> list[str]:
    """The user-space profile section (`rdna1-kmgr profile install`)."""
    if not profile:
        return []
    if profile["installed"] is None:
        return ["", "profile       none installed (`rdna1-kmgr profile list`)"]
    files = " ".join(f"{path} ({name or 'absent'})" for path, name in profile["files"].items())
    return [
        "",
        f"profile       {profile['installed']}: {profile['state']} since {profile.get('since')}",
        f"              {files}",
    ]


def verdict_text(v: dict | None) -> str:
    """pass (emulated, tcg) 2026-11-23T11:52:01+00:00: vermagic load ... (record ...), or why there is none."""
    if v is None:
        return "none: run `rdna1-kmgr vm-test`"
    if v["verdict"] == "unreadable":
        return f"unreadable: {v['detail']}"
    how = ", ".join(x for x in (v.get("mode"), v.get("accel")) if x)
    checked = " ".join(v.get("checked") or [])
    failed = f"; FAILED {' '.join(v['failed'])}: {v['reason']}" if v.get("failed") else ""
    return f"{v['verdict']} ({how}) {v.get('when') or ''}: checked {checked}{failed} (record {v['record']})"
