"""`rdna1-kmgr install`: put the built, VM-validated module in place for one kernel, every change journaled.

The gate, checked before anything changes: a module `build` made for KREL, signed with a signature that
verifies against the certificate; a passing VM verdict for exactly its sha256 (or --skip-vm-check, said
loudly and recorded in the journal); with Secure Boot on, that certificate enrolled.

The steps, each journaled (intent and backups on disk first, then the step, then `done`):

    dkms-install   dkms install: the module goes to /lib/modules/KREL/updates/dkms
    depmod         depmod KREL: the module index now resolves amdgpu to it
    modprobe-conf  /etc/modprobe.d/rdna1-kmgr.conf with the parameters the build was made for, written for
                   every installed kernel at once (modprobe_conf: the file is shared, the installs are not)
    stock-loader   with the boot guard: a modprobe `install` rule and its program, so a fallback boot loads the
                   distribution's amdgpu file and a refused rdna1-kmgr file is followed by it in the same boot
                   (install/stock_loader.py), and the initramfs tool's hook that puts both in the image
    initramfs      the distribution's tool regenerates KREL's image (it copies modprobe.d, and amdgpu when the
                   image carries it)
    boot-guard     where GRUB boots the machine: the first boot is a trial, a boot that never confirms is followed
                   by boots with the quirks off (install/boot_guard.py); GRUB's configuration regenerated
    verify         `modinfo -k KREL -n amdgpu` is the installed file with the built sha256, and any amdgpu
                   the image carries is that one too (changes nothing)

A step that fails rolls back what was done (the journal replayed, the build kept); a crash leaves the journal
for `rdna1-kmgr rollback`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rdna1_kmgr.core import progress, runner
from rdna1_kmgr.core.errors import BuildError, HostError, KmgrError, UsageError
from rdna1_kmgr.core.files import sha256_file, write_atomic
from rdna1_kmgr.host import system_identity
from rdna1_kmgr.install import (
    boot_guard,
    dkms_steps,
    initramfs,
    journal_programs,
    modprobe_conf,
    rollback,
    stock_loader,
)
from rdna1_kmgr.install.install_gate import (
    Candidate,
    Gate,
    InstallRefused,
    check_conf_is_ours,
    check_gate,
    check_kernel_installed,
    check_no_foreign_module,
    installed_path,
    loud_skip,
)
from rdna1_kmgr.install.journal import (
    Journal,
    JournalError,
    abort_point,
    check_writable,
    locked,
    refuse_if_busy,
)
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.modbuild import built_module, module_checks, signing
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.render import quirk_catalog
from rdna1_kmgr.render.manifest import Manifest
from rdna1_kmgr.render.quirk_mask import QuirkMask
from rdna1_kmgr.source.target_kernel import Kernel

MODPROBE_CONF = modprobe_conf.NAME
STEPS = ("dkms-install", "depmod", "modprobe-conf", "stock-loader", "initramfs", "boot-guard", "verify")
# What depmod writes (kmod 30); the package's modules.order, modules.builtin(.modinfo) are its inputs.
DEPMOD_OUTPUTS = (
    "modules.alias",
    "modules.alias.bin",
    "modules.builtin.alias.bin",
    "modules.builtin.bin",
    "modules.dep",
    "modules.dep.bin",
    "modules.devname",
    "modules.softdep",
    "modules.symbols",
    "modules.symbols.bin",
)
DEPMOD_INPUTS = ("modules.order", "modules.builtin", "modules.builtin.modinfo")
ESCAPE_PARAMETER = modprobe_conf.ESCAPE_PARAMETER


def default_quirks(manifest: Manifest | None) -> QuirkMask | None:
    """The mask the build was rendered for: its default (the bits with no known harm)."""
    return manifest.quirks_mask if manifest else None


def _left_out_bits(manifest: Manifest | None, extra: QuirkMask) -> list[str]:
    """`<bit id> (0xN): left out of this build: <why>` for the bits of `extra` whose quirk render left out."""
    left_out = {q.id: q.why for q in manifest.left_out} if manifest else {}
    found = []
    for quirk in quirk_catalog.load_quirks().values():
        for bit in quirk.bits:
            if extra.bits & (1 << bit.bit) and quirk.id in left_out:
                found.append(f"{bit.id} ({QuirkMask(1 << bit.bit)}) was left out of this build: {left_out[quirk.id]}")
    return found


def with_quirks(candidate: Candidate, mask: QuirkMask | None) -> Candidate:
    """The candidate with rdna1_quirks=mask in modprobe.d; the mask may only hold quirks the build carries.
    A bit of a quirk the render left out (nothing to fix on this kernel, or an opt-in quirk that fits no
    variant) is refused in one line saying which and why."""
    if mask is None:
        return candidate
    if candidate.quirks is None:
        raise UsageError(
            "--quirks needs a build with the rdna1_quirks parameter",
            "this build's manifest names no quirks; rebuild it",
        )
    carried = candidate.manifest.carried_mask if candidate.manifest else None
    if carried is None:  # a build rendered before the manifest listed every bit carried its default only
        carried = candidate.quirks
    extra = mask.outside(carried)
    if extra.bits:
        left_out = _left_out_bits(candidate.manifest, extra)
        if left_out:
            raise UsageError(
                f"--quirks {mask}: {left_out[0]}",
                f"give a mask within the bits this build carries ({carried}); `rdna1-kmgr status` lists them",
            )
        raise UsageError(
            f"--quirks {mask} has bits the build lacks ({extra}); it carries {carried}",
            "give a mask within the build's quirks (see `rdna1-kmgr quirks`)",
        )
    return dataclasses.replace(candidate, quirks=mask)


def find_candidate(kernel: str, trees: dkms.Trees) -> Candidate:
    """The rdna1-amdgpu module `build` made for `kernel` (the newest when there are several)."""
    try:
        built = built_module.for_kernel(kernel, trees)
    except UsageError:
        raise InstallRefused(
            f"no rdna1-amdgpu build for kernel {kernel}",
            f"run `rdna1-kmgr build --kernel {kernel}` first; nothing was changed",
        ) from None
    package = dkms.Package(dkms.PACKAGE_NAME, built.package_version)
    return Candidate(
        package, kernel, built.path, sha256_file(built.path), default_quirks(built.manifest), built.manifest
    )


def resolved_module(kernel: str, module: str, root: TargetRoot) -> Path | None:
    """The file `modinfo -k KREL -n <module>` resolves to (what modprobe would load), or None."""
    result = runner.run(root.modinfo_command(kernel, module), check=False)
    if result.returncode != 0 or not result.stdout.strip():
        return None
    return Path(result.stdout.strip().splitlines()[0])


# --- the gate ----------------------------------------------------------------------------------------------


# --- the steps ----------------------------------------------------------------------------------------------


@dataclass
class Step:
    name: str
    command: list[str] | None
    replaces: list[Path]  # files created or replaced: backed up (or recorded absent) first
    dirs: list[Path]  # directories it may create
    run: Callable[[], None]
    undo: dict | None = None
    text: list[str] = field(default_factory=list)  # extra lines for the plan


def _parents_to_create(path: Path) -> list[Path]:
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    return missing


def _folders_to_create(paths) -> list[Path]:
    """The missing folders above these files, deepest first (the order a rollback removes them in)."""
    return sorted({d for path in paths for d in _parents_to_create(path.parent)}, key=lambda d: -len(d.parts))


def _run(command: list[str], what: str) -> None:
    runner.run(command, timeout=900, doing=what, hint=f"the command was: {' '.join(command)}")


def depmod_files(kernel: str, root: TargetRoot) -> list[Path]:
    """depmod's outputs: kmod 30's, and any other modules.* index already there (a newer kmod's weakdep)."""
    folder = root.modules_dir(kernel)
    names = set(DEPMOD_OUTPUTS)
    if folder.is_dir():
        names |= {p.name for p in folder.glob("modules.*") if p.name not in DEPMOD_INPUTS}
    return [folder / name for name in sorted(names)]


def plan_steps(
    candidate: Candidate,
    root: TargetRoot,
    trees: dkms.Trees,
    tool: initramfs.InitramfsTool,
    cert: Path,
    on_verified: Callable[[dict], None],
    guard: boot_guard.Settings | None = None,
) -> list[Step]:
    kernel = candidate.kernel
    target = installed_path(candidate, root)
    dkms_install = dkms_steps.install_command(candidate.package, kernel, trees, root)

    def run_dkms_install() -> None:
        dkms.require_dkms()
        _run(dkms_install, "dkms install")
        if not target.is_file() or sha256_file(target) != candidate.sha256:
            raise HostError(f"dkms install reported success but {target} is not the built module", "see `dkms status`")

    conf = modprobe_conf.path(root)
    # With the boot guard, GRUB puts rdna1_quirks on each boot's command line: a value here would compete.
    conf_params = {} if guard is not None else candidate.parameters
    conf_text = modprobe_conf.text_for(exclude=kernel, adding=(kernel, conf_params)) or ""
    image = tool.image(kernel)
    # Headers only, no kernel to boot: its image package's postinst makes the initramfs, with this module.
    initramfs_step = (
        Step(
            "initramfs",
            tool.regenerate_command(kernel),
            tool.outputs(kernel),
            _parents_to_create(image.parent),
            lambda: tool.regenerate(kernel),
        )
        if root.kernel_image_installed(kernel)
        else Step(
            "initramfs",
            None,
            [],
            [],
            lambda: None,
            text=[f"    skipped: {root.boot_dir}/vmlinuz-{kernel} is not installed; its package makes the initramfs"],
        )
    )
    steps = [
        Step(
            "dkms-install",
            dkms_install,
            [target],
            _parents_to_create(target.parent),
            run_dkms_install,
            undo=dkms_steps.uninstall_undo(candidate.package, kernel, trees, root),
        ),
        Step(
            "depmod",
            root.depmod_command(kernel),
            depmod_files(kernel, root),
            [],
            lambda: _run(root.depmod_command(kernel), "depmod"),
        ),
        # The file serves every installed kernel: written for all of them, and a rollback rewrites it for
        # the kernels left instead of restoring this backup (modprobe_conf says why).
        Step(
            "modprobe-conf",
            None,
            [conf],
            _parents_to_create(conf.parent),
            lambda: modprobe_conf.sync(conf, exclude=kernel, adding=(kernel, conf_params)),
            undo={"kind": "modprobe-conf", "path": str(conf), "kernel": kernel},
            text=[f"    {line}" for line in conf_text.splitlines() if not line.startswith("#")],
        ),
    ]
    if guard is not None:
        steps.append(loader_step(root, tool))
    steps.append(initramfs_step)
    if guard is not None:
        steps.append(guard_step(root, guard, kernel))
    steps += [
        Step(
            "verify",
            None,
            [],
            [],
            lambda: on_verified(verify(candidate, root, tool, cert)),
            text=[
                f"    {' '.join(root.modinfo_command(kernel, candidate.module_name))} must name {target} "
                f"with sha256 {candidate.sha256}",
                f"    lsinitramfs {image}: when it carries {candidate.module_name}, its own index must give that "
                "module (unmkinitramfs, then modinfo -b)",
            ],
        ),
    ]
    return steps


def loader_step(root: TargetRoot, tool: initramfs.InitramfsTool) -> Step:
    """The stock-amdgpu loader's rule and program, and the initramfs tool's hook; before the initramfs is made,
    so the image carries them. Files only: rollback removes them and remakes the initramfs without them."""
    wanted = stock_loader.files(root, tool)
    dirs = _folders_to_create(wanted)

    def write() -> None:
        for path, (text, mode) in wanted.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text.encode(), mode)

    return Step(
        "stock-loader",
        None,
        list(wanted),
        dirs,
        write,
        text=[f"    write {path}" for path in wanted]
        + ["    a fallback boot, or one whose rdna1-kmgr amdgpu the kernel refuses, loads the distribution's amdgpu"],
    )


def guard_step(root: TargetRoot, guard: boot_guard.Settings, kernel: str) -> Step:
    """The boot guard's files and links (journaled like any file), then GRUB regenerated (its menu must boot
    `kernel`) and the trial armed.
    Its undo, once rollback removed them: GRUB regenerated without it and its variables unset."""
    written = list(boot_guard.files(root, guard)) + list(boot_guard.links(root)) + boot_guard.runtime_files(root)
    dirs = _folders_to_create(written)

    def write(path: Path, text: str, mode: int) -> None:
        write_atomic(path, text.encode(), mode)

    commands = boot_guard.arm_commands(root, guard)
    return Step(
        "boot-guard",
        None,
        written,
        dirs,
        lambda: boot_guard.install(root, guard, write, kernel),
        undo={"kind": "boot-guard", "after": boot_guard.undo_commands(root)},
        text=[f"    {' '.join(c)}" for c in commands]
        + [
            f"    the first boot is a trial with {guard.mask.parameter}; it confirms itself after "
            f"{guard.confirm_after} s with {guard.target} reached, or the next boots run the distribution's amdgpu"
        ],
    )


def verify(candidate: Candidate, root: TargetRoot, tool: initramfs.InitramfsTool, cert: Path) -> dict:
    """The module index and the initramfs now give this exact module; BuildError says where they do not."""
    expected = installed_path(candidate, root)
    resolved = resolved_module(candidate.kernel, candidate.module_name, root)
    if resolved is None:
        raise BuildError(f"modinfo -k {candidate.kernel} -n {candidate.module_name} finds no module")
    if resolved != expected:
        raise BuildError(
            f"modinfo -k {candidate.kernel} -n {candidate.module_name} resolves to {resolved}, "
            f"not the installed {expected}"
        )
    digest = sha256_file(resolved)
    if digest != candidate.sha256:
        raise BuildError(f"{resolved} has sha256 {digest}, not the built module's {candidate.sha256}")
    module_checks.verify_signature(resolved, cert)
    carried = tool.carried_module(candidate.kernel, candidate.module_name)
    if carried is not None and carried.sha256 != candidate.sha256:
        which = (
            f"resolves {candidate.module_name} to {carried.resolved} (sha256 {carried.sha256[:12]}...)"
            if carried.resolved
            else f"carries {carried.entries[0]} but its index resolves none"
        )
        raise BuildError(f"the initramfs {tool.image(candidate.kernel)} {which}, not the installed module")
    return {
        "module": str(resolved),
        "sha256": digest,
        "initramfs": str(tool.image(candidate.kernel)),
        "initramfs_module": carried.resolved if carried else None,
    }


def plan_lines(candidate: Candidate, gate: Gate, steps: list[Step], replacing: list[str]) -> list[str]:
    lines = [
        f"install {candidate.package.ref} for kernel {candidate.kernel}",
        f"  module {candidate.module} (sha256 {candidate.sha256}), signed by {gate.signer!r}, verified "
        f"against {gate.certificate}",
    ]
    if gate.vm_skipped:
        lines.append(f"  WITHOUT a passing VM verdict (--skip-vm-check): {gate.vm_check['why']}")
    else:
        lines.append(f"  VM verdict {gate.vm_check['verdict']} ({gate.vm_check['mode']}): {gate.vm_check['record']}")
    lines += replacing
    for number, step in enumerate(steps, 1):
        lines.append(f"{number}. {step.name}" + (f": {' '.join(step.command)}" if step.command else ""))
        for folder in reversed(step.dirs):  # outermost first
            lines.append(f"    create the directory {folder}")
        for path in step.replaces:
            if path.name.endswith(".new"):
                continue  # the tool's temporary name for the image (journaled in case a crash leaves it)
            lines.append(f"    {'replace' if path.exists() or path.is_symlink() else 'create'} {path}")
        lines += step.text
    journal = Journal(candidate.kernel)
    lines.append(f"journal {journal.path}; the files replaced are backed up in {journal.backups}/ before each step")
    return lines


# --- the run ---------------------------------------------------------------------------------------------------


@dataclass
class InstallRequest:
    kernel: Kernel | None = None  # resolved at the command edge (target_kernel.resolve_kernel); None: tests
    skip_vm_check: bool = False
    cert: str | None = None
    dry_run: bool = False
    quirks: QuirkMask | None = None  # rdna1_quirks to write instead of all the build's quirks (the experiment's pick)
    confirm_after: int = boot_guard.CONFIRM_AFTER  # seconds a trial boot must be up before it confirms itself
    confirm_target: str | None = None  # the systemd target it must reach (default: the machine's default target)


def _existing(journal: Journal, candidate: Candidate | None) -> str:
    """fresh, same (this very module is installed), replace (another build is), or refuses an unfinished one."""
    state = journal.state()
    if state.begin is None and not state.steps:
        return "fresh"
    if not state.committed or state.rollback_started:
        raise JournalError(
            f"an earlier {state.begin['operation'] if state.begin else 'run'} for {journal.kernel} did not "
            f"finish ({state.description})",
            f"run `rdna1-kmgr rollback --kernel {journal.kernel}` first; nothing was changed",
        )
    if (
        candidate is not None
        and state.begin.get("module_sha256") == candidate.sha256
        and state.begin.get("parameters", candidate.parameters) == candidate.parameters
    ):
        return "same"
    return "replace"


def run(
    request: InstallRequest,
    candidate: Candidate | None = None,
    confirm: Callable[[list[str]], bool] | None = None,
) -> dict:
    """Everything `rdna1-kmgr install` does; returns the JSON result. `candidate` overrides the lookup (tests)."""
    root = TargetRoot.from_env()
    trees = dkms.Trees.from_env()
    if candidate is not None:
        kernel = candidate.kernel
    else:
        if request.kernel is None:
            raise ValueError("InstallRequest.kernel is resolved at the command edge (target_kernel.resolve_kernel)")
        kernel = request.kernel.release
    refuse_if_busy()
    journal = Journal(kernel)
    journal.state()  # a corrupted journal is refused before anything else
    if not request.dry_run:
        check_writable()  # a dry run writes nothing: a normal user may ask for the plan
    candidate = with_quirks(candidate or find_candidate(kernel, trees), request.quirks)
    cert = Path(request.cert).absolute() if request.cert else signing.convention().cert
    existing = _existing(journal, candidate)
    tool = initramfs.detect(root, system_identity.read().platform.initramfs_tool if root.is_system else None)
    if existing == "same":
        result = verify(candidate, root, tool, cert)
        return {
            "kernel": kernel,
            "package": candidate.package.name,
            "package_version": candidate.package.version,
            "already_installed": True,
            "dry_run": request.dry_run,
            **result,
        }

    check_kernel_installed(kernel, root)
    gate = check_gate(candidate, cert, request.skip_vm_check, root)
    replacing = []
    # The same build with other parameters (install --quirks) keeps its DKMS package through the undo.
    same_build = existing == "replace" and (journal.state().begin or {}).get("version") == candidate.package.version
    if existing == "replace":
        replacing = ["first undo the install now in place:"] + [
            f"  {line}" for line in rollback.plan_for(journal, keep_build=same_build)
        ]
    else:
        check_no_foreign_module(candidate, root, trees)
    check_conf_is_ours(root)
    tool.require_supported()
    guard, no_guard = guard_settings(candidate, root, request)
    verified: dict = {}
    steps = plan_steps(candidate, root, trees, tool, cert, verified.update, guard)
    lines = plan_lines(candidate, gate, steps, replacing)
    # the build's own mask leaves the module as the stock one: said first, not found out after the reboot
    if candidate.manifest and request.quirks is None and candidate.manifest.nothing_on_note():
        lines.insert(0, candidate.manifest.nothing_on_note())
    if no_guard:
        lines.append(f"no boot guard: {no_guard}")
    summary = {
        "kernel": kernel,
        "package": candidate.package.name,
        "package_version": candidate.package.version,
        "module_sha256": candidate.sha256,
        "vm_check": gate.vm_check,
        "parameters": candidate.parameters,
        "boot_guard": guard.to_json() if guard else {"off": no_guard},
        "plan": lines,
    }
    if gate.vm_skipped:
        progress.current_stream().write(loud_skip(gate))
    if request.dry_run:
        return {**summary, "dry_run": True}
    if confirm is not None and not confirm(lines):
        raise UsageError("not confirmed", "nothing was changed; pass --yes to install without asking")

    with locked(f"install --kernel {kernel}"):
        for line in journal_programs.stop_left_over(journal):  # a killed run's, before anything changes
            progress.say(f"rdna1-kmgr: {line}")
        if _existing(journal, candidate) != existing:
            raise JournalError(
                f"the journal of {kernel} changed while this run was getting ready",
                "run the command again; nothing was changed",
            )
        if existing == "replace":
            for line in rollback.replay(journal, keep_build=same_build, reason=f"replaced by {candidate.package.ref}"):
                progress.say(f"rdna1-kmgr: {line}")
        journal.begin(
            "install",
            kernel=kernel,
            package=candidate.package.name,
            version=candidate.package.version,
            module=str(candidate.module),
            module_sha256=candidate.sha256,
            vm_check=gate.vm_check,
            parameters=candidate.parameters,
            certificate=str(cert),
            root=str(root.path),
            boot_guard=guard.to_json() if guard else None,
            trees={"source": str(trees.source), "dkms": str(trees.dkms)},
        )
        with journal_programs.recorded(journal):
            _run_steps(journal, steps)
        journal.append("commit", verified=verified)
    return {
        **summary,
        "dry_run": False,
        "verified": verified,
        "journal": str(journal.path),
        "next_boot": next_boot_text(candidate, verified, root, guard),
    }


def _run_steps(journal: Journal, steps: list[Step]) -> None:
    for step in steps:
        progress.say(f"rdna1-kmgr: {step.name}" + (f": {' '.join(step.command)}" if step.command else ""))
        if step.name != "verify":
            journal.record_intent(step.name, step.command, step.replaces, step.dirs, step.undo)
        try:
            step.run()
        except BaseException as err:
            _roll_back_failed(journal, step.name, err)
            raise _failure(step.name, err) from None
        if step.name != "verify":
            journal.append("done", step=step.name)
        abort_point(step.name)


def guard_settings(
    candidate: Candidate, root: TargetRoot, request: InstallRequest
) -> tuple[boot_guard.Settings | None, str | None]:
    """The boot guard this install sets up, or why there is none."""
    return boot_guard.settings(root, candidate.quirks, request.confirm_after, request.confirm_target)


def _roll_back_failed(journal: Journal, step: str, err: BaseException) -> None:
    why = err.line() if isinstance(err, KmgrError) else (type(err).__name__ + (f": {err}" if str(err) else ""))
    progress.say(f"rdna1-kmgr: install failed at {step} ({why}); rolling back")
    try:
        for line in rollback.replay(journal, keep_build=True, reason=f"install failed at {step}"):
            progress.say(f"rdna1-kmgr: {line}")
    except KmgrError as failed:
        raise JournalError(
            f"install failed at {step} ({why}), and rolling it back failed too: {failed.what}",
            f"run `rdna1-kmgr rollback --kernel {journal.kernel}` once the cause is fixed",
        ) from None


def _failure(step: str, err: BaseException) -> BaseException:
    if isinstance(err, KmgrError):
        return type(err)(
            f"install failed at {step}: {err.what}",
            (f"{err.hint}; " if err.hint else "") + "everything it changed was rolled back",
        )
    return err


def next_boot_text(
    candidate: Candidate, verified: dict, root: TargetRoot, guard: boot_guard.Settings | None = None
) -> list[str]:
    kernel = candidate.kernel
    params = " ".join(f"{k}={v}" for k, v in sorted(candidate.parameters.items())) or "its default parameters"
    source = f"({root.modprobe_dir / MODPROBE_CONF})"
    if guard is not None:
        params, source = guard.mask.parameter, "(from the kernel command line GRUB's boot guard writes)"
    carried = verified.get("initramfs_module")
    where = (
        "from the initramfs"
        if carried
        else "from /lib/modules once the root file system is mounted (the initramfs does not carry it)"
    )
    lines = [
        f"Installed {candidate.package.ref}: {verified.get('module')} (sha256 {candidate.sha256[:12]}...).",
        f"At the next boot of {kernel}, {candidate.module_name} is loaded {where}, with {params} {source}.",
    ]
    if guard is not None:
        lines += [
            f"That boot is a trial: it confirms itself once {guard.target} is reached and it has been up "
            f"{guard.confirm_after} s (or run `rdna1-kmgr confirm`).",
            "If it never confirms (a hang, a freeze, the power button), the boots after it load the "
            "distribution's amdgpu by themselves (GRUB decides before the kernel runs) and say so at login; so "
            "does any boot whose module the kernel refuses; "
            f"`rdna1-kmgr retry` tries once more, `rdna1-kmgr rollback --kernel {kernel}` removes it.",
        ]
    else:
        lines.append(
            f"If that boot goes wrong: at the boot menu press `e`, add {ESCAPE_PARAMETER} to the line "
            "starting with `linux` (stock amdgpu behaviour for that boot), boot with Ctrl-X or F10, then "
            f"run `rdna1-kmgr rollback --kernel {kernel}`."
        )
    if kernel == os.uname().release and (root.sys_module / candidate.module_name).is_dir():
        lines.append(f"The running kernel keeps the {candidate.module_name} it loaded at boot until you reboot.")
    return lines
