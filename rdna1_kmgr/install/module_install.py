"""`rdna1-kmgr install`: put the built, VM-validated module in place for one kernel, every change journaled.

The gate, checked before anything changes: a module `build` made for KREL, signed with a signature that
verifies against the certificate; a passing VM verdict for exactly its sha256 (or --skip-vm-check, said
loudly and recorded in the journal); with Secure Boot on, that certificate enrolled.

Then install's stages (install_stages: dkms-install, depmod, modprobe-conf, [stock-loader,] initramfs,
[boot-guard,] verify), each journaled: `--dry-run` prints their plan, the install runs the same pipeline.
A stage that fails rolls back what was done (the journal replayed, the build kept); a crash leaves the journal
for `rdna1-kmgr rollback`. What install did or would do is an InstallResult.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core import progress
from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.core.files import sha256_file
from rdna1_kmgr.host import system_identity
from rdna1_kmgr.install import boot_guard, initramfs, journal_programs, modprobe_conf, rollback
from rdna1_kmgr.install.install_begin import InstallBegin
from rdna1_kmgr.install.install_gate import (
    Candidate,
    Gate,
    InstallRefused,
    check_conf_is_ours,
    check_gate,
    check_kernel_installed,
    check_no_foreign_module,
    loud_skip,
)
from rdna1_kmgr.install.install_result import InstallResult, Verified
from rdna1_kmgr.install.install_stages import InstallContext, verify
from rdna1_kmgr.install.install_stages import resolved_module as resolved_module  # status reads it from here
from rdna1_kmgr.install.journal import Journal, JournalError, check_writable, locked, refuse_if_busy
from rdna1_kmgr.install.journal_records import Commit
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.modbuild import built_module, signing
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.render import quirk_catalog
from rdna1_kmgr.render.manifest import Manifest
from rdna1_kmgr.render.quirk_mask import QuirkMask
from rdna1_kmgr.source.target_kernel import Kernel

MODPROBE_CONF = modprobe_conf.NAME
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
    assert built.package_version is not None  # for_kernel's builds are DKMS entries, each with its version
    package = dkms.Package(dkms.PACKAGE_NAME, built.package_version)
    return Candidate(
        package, kernel, built.path, sha256_file(built.path), default_quirks(built.manifest), built.manifest
    )


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
            f"an earlier {state.begin.operation if state.begin else 'run'} for {journal.kernel} did not "
            f"finish ({state.description})",
            f"run `rdna1-kmgr rollback --kernel {journal.kernel}` first; nothing was changed",
        )
    installed = state.install
    if (
        candidate is not None
        and installed is not None
        and installed.module_sha256 == candidate.sha256
        and (installed.parameters is None or installed.parameters == candidate.parameters)
    ):
        return "same"
    return "replace"


@dataclass(frozen=True)
class Target:
    """What install acts on, found before the gate: the kernel's journal, the build, and what is in place."""

    root: TargetRoot
    trees: dkms.Trees
    journal: Journal
    candidate: Candidate
    cert: Path
    tool: initramfs.InitramfsTool
    existing: str  # _existing's word

    @property
    def kernel(self) -> str:
        return self.candidate.kernel


def _target(request: InstallRequest, candidate: Candidate | None) -> Target:
    root, trees = TargetRoot.from_env(), dkms.Trees.from_env()
    if candidate is not None:
        kernel = candidate.kernel
    elif request.kernel is not None:
        kernel = request.kernel.release
    else:
        raise ValueError("InstallRequest.kernel is resolved at the command edge (target_kernel.resolve_kernel)")
    refuse_if_busy()
    journal = Journal(kernel)
    journal.state()  # a corrupted journal is refused before anything else
    if not request.dry_run:
        check_writable()  # a dry run writes nothing: a normal user may ask for the plan
    candidate = with_quirks(candidate or find_candidate(kernel, trees), request.quirks)
    cert = Path(request.cert).absolute() if request.cert else signing.convention().cert
    tool = initramfs.detect(root, system_identity.read().platform.initramfs_tool if root.is_system else None)
    return Target(root, trees, journal, candidate, cert, tool, _existing(journal, candidate))


@dataclass(frozen=True)
class ReplaceExisting:
    """The install now in place undone first, by rollback's own list of stages; the same build with other
    parameters (install --quirks) keeps its DKMS package through the undo."""

    journal: Journal
    keep_build: bool
    by: str  # the package that replaces it

    def plan(self) -> list[str]:
        undo = rollback.plan_for(self.journal, keep_build=self.keep_build)
        return ["first undo the install now in place:", *(f"  {line}" for line in undo)]

    def run(self) -> None:
        for line in rollback.replay(self.journal, keep_build=self.keep_build, reason=f"replaced by {self.by}"):
            progress.say(f"rdna1-kmgr: {line}")


@dataclass(frozen=True)
class Prepared:
    """An install that passed its gate: its stages' context, what it replaces, and its plan."""

    target: Target
    gate: Gate
    ctx: InstallContext
    replace: ReplaceExisting | None
    planned: InstallResult


def _prepare(request: InstallRequest, target: Target) -> Prepared:
    """The gate, then every stage's change worked out and planned (nothing changed)."""
    candidate, root = target.candidate, target.root
    check_kernel_installed(target.kernel, root)
    gate = check_gate(candidate, target.cert, request.skip_vm_check, root)
    replace = None
    if target.existing == "replace":
        installed = target.journal.state().install
        same_build = installed is not None and installed.package == candidate.package
        replace = ReplaceExisting(target.journal, same_build, candidate.package.ref)
    else:
        check_no_foreign_module(candidate, root, target.trees)
    check_conf_is_ours(root)
    target.tool.require_supported()
    guard, no_guard = guard_settings(candidate, root, request)
    ctx = InstallContext(candidate, root, target.trees, target.tool, target.cert, target.journal, guard)
    ctx.work_out_changes()
    lines = plan_lines(ctx, gate, replace.plan() if replace else [])
    # the build's own mask leaves the module as the stock one: said first, not found out after the reboot
    note = candidate.manifest.nothing_on_note() if candidate.manifest and request.quirks is None else None
    lines = ([note] if note else []) + lines + ([f"no boot guard: {no_guard}"] if no_guard else [])
    planned = InstallResult(
        target.kernel,
        candidate.package.name,
        candidate.package.version,
        dry_run=True,
        module_sha256=candidate.sha256,
        vm_check=gate.vm_check,
        parameters=candidate.parameters,
        boot_guard=guard.to_json() if guard else {"off": no_guard},
        plan=tuple(lines),
    )
    return Prepared(target, gate, ctx, replace, planned)


def _begin(prepared: Prepared) -> None:
    """The journal's first record: what is installed, from where, through which gate."""
    target, ctx = prepared.target, prepared.ctx
    begun = InstallBegin(
        kernel=target.kernel,
        package=target.candidate.package,
        module=str(target.candidate.module),
        module_sha256=target.candidate.sha256,
        vm_check=prepared.gate.vm_check,
        parameters=target.candidate.parameters,
        certificate=str(target.cert),
        root=str(target.root.path),
        boot_guard=ctx.guard.to_json() if ctx.guard else None,
        trees=target.trees,
    )
    target.journal.begin(begun)


def _apply(prepared: Prepared) -> InstallResult:
    """Under the lock: a killed run's programs stopped, what is in place undone, then begin, the stages, commit."""
    target, ctx = prepared.target, prepared.ctx
    for line in journal_programs.stop_left_over(target.journal):  # a killed run's, before anything changes
        progress.say(f"rdna1-kmgr: {line}")
    if _existing(target.journal, target.candidate) != target.existing:
        raise JournalError(
            f"the journal of {target.kernel} changed while this run was getting ready",
            "run the command again; nothing was changed",
        )
    if prepared.replace is not None:
        prepared.replace.run()
    _begin(prepared)
    with journal_programs.recorded(target.journal):
        ctx.pipeline.run(ctx)  # a stage that fails rolls back what was done, then raises
    assert ctx.verified is not None  # the last stage verified the install
    target.journal.append(Commit(ctx.verified.to_json()))
    return dataclasses.replace(
        prepared.planned,
        dry_run=False,
        verified=ctx.verified,
        journal=str(target.journal.path),
        next_boot=tuple(next_boot_text(target.candidate, ctx.verified, target.root, ctx.guard)),
    )


def plan_lines(ctx: InstallContext, gate: Gate, replacing: list[str]) -> list[str]:
    """What is installed and why the gate let it through, the install now in place undone first (when there is
    one), then install's pipeline planned."""
    candidate = ctx.candidate
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
    lines += ctx.pipeline.plan(ctx)
    journal = ctx.journal
    lines.append(f"journal {journal.path}; the files replaced are backed up in {journal.backups}/ before each step")
    return lines


def run(
    request: InstallRequest,
    candidate: Candidate | None = None,
    confirm: Callable[[list[str]], bool] | None = None,
) -> InstallResult:
    """Everything `rdna1-kmgr install` does; what it did (or, dry, would do). `candidate` overrides the lookup
    (tests)."""
    target = _target(request, candidate)
    if target.existing == "same":
        verified = verify(target.candidate, target.root, target.tool, target.cert)
        package = target.candidate.package
        return InstallResult(
            target.kernel, package.name, package.version, request.dry_run, already_installed=True, verified=verified
        )
    prepared = _prepare(request, target)
    if prepared.gate.vm_skipped:
        progress.current_stream().write(loud_skip(prepared.gate))
    if request.dry_run:
        return prepared.planned
    if confirm is not None and not confirm(list(prepared.planned.plan)):
        raise UsageError("not confirmed", "nothing was changed; pass --yes to install without asking")
    with locked(f"install --kernel {target.kernel}"):
        return _apply(prepared)


def guard_settings(
    candidate: Candidate, root: TargetRoot, request: InstallRequest
) -> tuple[boot_guard.Settings | None, str | None]:
    """The boot guard this install sets up, or why there is none."""
    return boot_guard.settings(root, candidate.quirks, request.confirm_after, request.confirm_target)


def next_boot_text(
    candidate: Candidate, verified: Verified, root: TargetRoot, guard: boot_guard.Settings | None = None
) -> list[str]:
    kernel = candidate.kernel
    params = " ".join(f"{k}={v}" for k, v in sorted(candidate.parameters.items())) or "its default parameters"
    source = f"({root.modprobe_dir / MODPROBE_CONF})"
    if guard is not None:
        params, source = guard.mask.parameter, "(from the kernel command line GRUB's boot guard writes)"
    carried = verified.initramfs_module
    where = (
        "from the initramfs"
        if carried
        else "from /lib/modules once the root file system is mounted (the initramfs does not carry it)"
    )
    lines = [
        f"Installed {candidate.package.ref}: {verified.module} (sha256 {candidate.sha256[:12]}...).",
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
