"""Install's stages: the pipeline `rdna1-kmgr install` runs once its gate passed, and `--dry-run` plans.

Each stage is journaled: its intent (the command, the files it replaces backed up or recorded absent, the
folders it may create, how a rollback undoes it) is on disk before it changes anything, its `done` after.

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
                   the image carries is that one too (changes nothing, so not journaled)

What each stage changes is worked out for all of them before the first runs (`InstallContext.changes`): the plan
prints it, the run journals it. A stage that fails rolls back what was done (the journal replayed, the build
kept); a crash leaves the journal for `rdna1-kmgr rollback`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rdna1_kmgr.core import progress, runner
from rdna1_kmgr.core.errors import BuildError, HostError, KmgrError
from rdna1_kmgr.core.files import sha256_file, write_atomic
from rdna1_kmgr.core.pipeline import Pipeline
from rdna1_kmgr.install import boot_guard, dkms_steps, initramfs, modprobe_conf, rollback, stock_loader
from rdna1_kmgr.install.install_gate import Candidate, installed_path
from rdna1_kmgr.install.install_result import Verified
from rdna1_kmgr.install.journal import Journal, JournalError, abort_point
from rdna1_kmgr.install.journal_records import Done
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.install.undo import RewriteModprobeConf, Undo, Writer, regenerate
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.modbuild import module_checks

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


@dataclass(frozen=True)
class Change:
    """What one stage changes, as its journal intent records it and the plan prints it."""

    command: list[str] | None
    replaces: list[Path]  # files created or replaced: backed up (or recorded absent) first
    dirs: list[Path]  # directories it may create
    undo: Undo | None = None  # how rollback undoes it, beyond restoring the files (None: restoring is all)
    text: list[str] = field(default_factory=list)  # more lines for the plan


@dataclass
class InstallContext:
    """What install's stages read and fill."""

    candidate: Candidate
    root: TargetRoot
    trees: dkms.Trees
    tool: initramfs.InitramfsTool
    cert: Path
    journal: Journal
    guard: boot_guard.Settings | None  # None: no boot guard (boot_guard.settings says why)
    changes: dict[str, Change] = field(default_factory=dict)  # each stage's, worked out before any runs
    verified: Verified | None = None

    @property
    def kernel(self) -> str:
        return self.candidate.kernel

    @property
    def pipeline(self) -> Pipeline[InstallContext]:
        return GUARDED if self.guard is not None else UNGUARDED

    def work_out_changes(self) -> None:
        """Every stage's change, from the system as it is before the first stage runs."""
        self.changes = {
            stage.name: stage.change(self) for stage in self.pipeline.stages if isinstance(stage, JournaledStage)
        }


# --- the journaled step every stage is -------------------------------------------------------------------------


class JournaledStage:
    """A stage that says its change before it runs (`plan`), and journals it around doing it (`run`)."""

    name = ""
    journaled = True

    def change(self, ctx: InstallContext) -> Change:
        raise NotImplementedError

    def apply(self, ctx: InstallContext) -> None:
        raise NotImplementedError

    def plan(self, ctx: InstallContext) -> list[str]:
        change = ctx.changes[self.name]
        number = ctx.pipeline.names.index(self.name) + 1
        lines = [f"{number}. {self.name}" + (f": {' '.join(change.command)}" if change.command else "")]
        for folder in reversed(change.dirs):  # outermost first
            lines.append(f"    create the directory {folder}")
        for path in change.replaces:
            if path.name.endswith(".new"):
                continue  # the tool's temporary name for the image (journaled in case a crash leaves it)
            lines.append(f"    {'replace' if path.exists() or path.is_symlink() else 'create'} {path}")
        return lines + change.text

    def run(self, ctx: InstallContext) -> None:
        change = ctx.changes[self.name]
        progress.say(f"rdna1-kmgr: {self.name}" + (f": {' '.join(change.command)}" if change.command else ""))
        if self.journaled:
            ctx.journal.record_intent(self.name, change.command, change.replaces, change.dirs, change.undo)
        try:
            self.apply(ctx)
        except BaseException as err:
            _roll_back_failed(ctx.journal, self.name, err)
            raise _failure(self.name, err) from None
        if self.journaled:
            ctx.journal.append(Done(self.name))
        abort_point(self.name)


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


def _parents_to_create(path: Path) -> list[Path]:
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    return missing


def _folders_to_create(paths: Iterable[Path]) -> list[Path]:
    """The missing folders above these files, deepest first (the order a rollback removes them in)."""
    return sorted({d for path in paths for d in _parents_to_create(path.parent)}, key=lambda d: -len(d.parts))


def _run(command: list[str], what: str) -> None:
    runner.run(command, timeout=900, doing=what, hint=f"the command was: {' '.join(command)}")


# --- the stages -------------------------------------------------------------------------------------------------


class DkmsInstallStage(JournaledStage):
    name = "dkms-install"

    def change(self, ctx: InstallContext) -> Change:
        target = installed_path(ctx.candidate, ctx.root)
        return Change(
            dkms_steps.install_command(ctx.candidate.package, ctx.kernel, ctx.trees, ctx.root),
            [target],
            _parents_to_create(target.parent),
            undo=dkms_steps.uninstall_undo(ctx.candidate.package, ctx.kernel, ctx.trees, ctx.root),
        )

    def apply(self, ctx: InstallContext) -> None:
        dkms.require_dkms()
        command = ctx.changes[self.name].command
        assert command is not None
        _run(command, "dkms install")
        target = installed_path(ctx.candidate, ctx.root)
        if not target.is_file() or sha256_file(target) != ctx.candidate.sha256:
            raise HostError(f"dkms install reported success but {target} is not the built module", "see `dkms status`")


def depmod_files(kernel: str, root: TargetRoot) -> list[Path]:
    """depmod's outputs: kmod 30's, and any other modules.* index already there (a newer kmod's weakdep)."""
    folder = root.modules_dir(kernel)
    names = set(DEPMOD_OUTPUTS)
    if folder.is_dir():
        names |= {p.name for p in folder.glob("modules.*") if p.name not in DEPMOD_INPUTS}
    return [folder / name for name in sorted(names)]


class DepmodStage(JournaledStage):
    name = "depmod"

    def change(self, ctx: InstallContext) -> Change:
        return Change(ctx.root.depmod_command(ctx.kernel), depmod_files(ctx.kernel, ctx.root), [])

    def apply(self, ctx: InstallContext) -> None:
        _run(ctx.root.depmod_command(ctx.kernel), "depmod")


class ModprobeConfStage(JournaledStage):
    """The file serves every installed kernel: written for all of them, and a rollback rewrites it for the kernels
    left instead of restoring this backup (modprobe_conf says why)."""

    name = "modprobe-conf"

    @staticmethod
    def parameters(ctx: InstallContext) -> dict[str, str]:
        # With the boot guard, GRUB puts rdna1_quirks on each boot's command line: a value here would compete.
        return {} if ctx.guard is not None else ctx.candidate.parameters

    def change(self, ctx: InstallContext) -> Change:
        conf = modprobe_conf.path(ctx.root)
        text = modprobe_conf.text_for(exclude=ctx.kernel, adding=(ctx.kernel, self.parameters(ctx))) or ""
        return Change(
            None,
            [conf],
            _parents_to_create(conf.parent),
            undo=RewriteModprobeConf(conf, ctx.kernel),
            text=[f"    {line}" for line in text.splitlines() if not line.startswith("#")],
        )

    def apply(self, ctx: InstallContext) -> None:
        modprobe_conf.sync(modprobe_conf.path(ctx.root), exclude=ctx.kernel, adding=(ctx.kernel, self.parameters(ctx)))


class StockLoaderStage(JournaledStage):
    """The stock-amdgpu loader's rule and program, and the initramfs tool's hook; before the initramfs is made,
    so the image carries them. Files only: rollback removes them and remakes the initramfs without them."""

    name = "stock-loader"

    def change(self, ctx: InstallContext) -> Change:
        wanted = stock_loader.files(ctx.root, ctx.tool)
        return Change(
            None,
            list(wanted),
            _folders_to_create(wanted),
            text=[f"    write {path}" for path in wanted]
            + [
                "    a fallback boot, or one whose rdna1-kmgr amdgpu the kernel refuses, loads the distribution's "
                "amdgpu"
            ],
        )

    def apply(self, ctx: InstallContext) -> None:
        for path, (text, mode) in stock_loader.files(ctx.root, ctx.tool).items():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text.encode(), mode)


class InitramfsStage(JournaledStage):
    """Headers only, no kernel to boot: its image package's postinst makes the initramfs, with this module; the
    stage is journaled all the same, with nothing to replace."""

    name = "initramfs"

    def change(self, ctx: InstallContext) -> Change:
        if not ctx.root.kernel_image_installed(ctx.kernel):
            return Change(
                None,
                [],
                [],
                text=[
                    f"    skipped: {ctx.root.boot_dir}/vmlinuz-{ctx.kernel} is not installed; its package makes the "
                    "initramfs"
                ],
            )
        image = ctx.tool.image(ctx.kernel)
        return Change(
            ctx.tool.regenerate_command(ctx.kernel), ctx.tool.outputs(ctx.kernel), _parents_to_create(image.parent)
        )

    def apply(self, ctx: InstallContext) -> None:
        if ctx.changes[self.name].command is not None:  # None: skipped, as planned
            ctx.tool.regenerate(ctx.kernel)


class BootGuardStage(JournaledStage):
    """The boot guard's files and links (journaled like any file), then GRUB regenerated (its menu must boot the
    kernel) and the trial armed. Its undo, once rollback removed them: GRUB regenerated without it and its
    variables unset."""

    name = "boot-guard"

    def change(self, ctx: InstallContext) -> Change:
        guard = ctx.guard
        assert guard is not None
        root = ctx.root
        written = list(boot_guard.files(root, guard)) + list(boot_guard.links(root)) + boot_guard.runtime_files(root)
        return Change(
            None,
            written,
            _folders_to_create(written),
            undo=regenerate(Writer.BOOT_GUARD, boot_guard.undo_commands(root)),
            text=[f"    {' '.join(c)}" for c in boot_guard.arm_commands(root, guard)]
            + [
                f"    the first boot is a trial with {guard.mask.parameter}; it confirms itself after "
                f"{guard.confirm_after} s with {guard.target} reached, or the next boots run the distribution's amdgpu"
            ],
        )

    def apply(self, ctx: InstallContext) -> None:
        assert ctx.guard is not None

        def write(path: Path, text: str, mode: int) -> None:
            write_atomic(path, text.encode(), mode)

        boot_guard.install(ctx.root, ctx.guard, write, ctx.kernel)


class VerifyStage(JournaledStage):
    name = "verify"
    journaled = False  # it changes nothing

    def change(self, ctx: InstallContext) -> Change:
        candidate = ctx.candidate
        return Change(
            None,
            [],
            [],
            text=[
                f"    {' '.join(ctx.root.modinfo_command(ctx.kernel, candidate.module_name))} must name "
                f"{installed_path(candidate, ctx.root)} with sha256 {candidate.sha256}",
                f"    lsinitramfs {ctx.tool.image(ctx.kernel)}: when it carries {candidate.module_name}, its own "
                "index must give that module (unmkinitramfs, then modinfo -b)",
            ],
        )

    def apply(self, ctx: InstallContext) -> None:
        ctx.verified = verify(ctx.candidate, ctx.root, ctx.tool, ctx.cert)


def resolved_module(kernel: str, module: str, root: TargetRoot) -> Path | None:
    """The file `modinfo -k KREL -n <module>` resolves to (what modprobe would load), or None."""
    result = runner.run(root.modinfo_command(kernel, module), check=False)
    out = result.stdout
    assert isinstance(out, str)  # run as text
    if result.returncode != 0 or not out.strip():
        return None
    return Path(out.strip().splitlines()[0])


def verify(candidate: Candidate, root: TargetRoot, tool: initramfs.InitramfsTool, cert: Path) -> Verified:
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
    # The same module when its ELF bytes are: the image may hold it decompressed (initramfs.CarriedModule)
    if carried is not None and carried.module_sha256 != module_checks.content_sha256(resolved):
        which = (
            f"resolves {candidate.module_name} to {carried.resolved} (sha256 {(carried.sha256 or '')[:12]}...)"
            if carried.resolved
            else f"carries {carried.entries[0]} but its index resolves none"
        )
        raise BuildError(f"the initramfs {tool.image(candidate.kernel)} {which}, not the installed module")
    return Verified(str(resolved), digest, str(tool.image(candidate.kernel)), carried.resolved if carried else None)


DKMS_INSTALL, DEPMOD, MODPROBE_CONF = DkmsInstallStage(), DepmodStage(), ModprobeConfStage()
STOCK_LOADER, INITRAMFS, BOOT_GUARD, VERIFY = StockLoaderStage(), InitramfsStage(), BootGuardStage(), VerifyStage()
# With the boot guard, the stock loader goes into the image and the guard is armed once the image is made.
UNGUARDED: Pipeline[InstallContext] = Pipeline((DKMS_INSTALL, DEPMOD, MODPROBE_CONF, INITRAMFS, VERIFY))
GUARDED: Pipeline[InstallContext] = Pipeline(
    (DKMS_INSTALL, DEPMOD, MODPROBE_CONF, STOCK_LOADER, INITRAMFS, BOOT_GUARD, VERIFY)
)
