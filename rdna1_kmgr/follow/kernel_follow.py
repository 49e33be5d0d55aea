"""`rdna1-kmgr follow --kernel KREL`: give a newly installed kernel the patched amdgpu, or leave it stock and say why.

The quirks are the ones installed now: the manifest of the newest finished install's package (the owner opted
in by installing one; without any install, follow does nothing). For KREL, in order, each a stage of the flow:

    image      KREL is installed (/lib/modules/KREL/kernel): install needs it, and so does a package manager
               that is still on its way (the hook runs again when it gets there)
    source     the kernel's exact driver source (the distribution's, through the tool's own apt state)
    render     the installed quirks rendered for that source; a source whose anchors are missing is refused here
    build      the DKMS build, signed and verified (reused when this patch set is built for KREL already);
               never installs packages: missing headers are a reason, and the header hook runs again
    vm-test    the emulated VM verdict for exactly that module (a passing one already stored is reused)
    install    the journaled install of `rdna1-kmgr install`, which rolls itself back when a step fails

The first failing stage ends it: nothing after it runs, the install (the only stage that changes what the
kernel loads) either never started or rolled itself back, so the kernel keeps its stock amdgpu. The reason goes
to follow/<KREL>.json (`status` shows it), the whole story to /var/log/rdna1-kmgr/follow-<KREL>-<time>.log.

`follow defer` (the kernel hooks, inside dpkg) only notes the kernel as pending; `follow pending` (apt's
Post-Invoke hook, the boot unit) follows every pending kernel. With `--hook` nothing fails the caller: one line
per kernel says what happened, and the exit status is 0.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rdna1_kmgr.core import progress, user_input
from rdna1_kmgr.core.errors import BuildError, Exit, HostError, KmgrError
from rdna1_kmgr.core.files import make_dirs, open_private_log
from rdna1_kmgr.core.paths import log_dir
from rdna1_kmgr.core.pipeline import Pipeline
from rdna1_kmgr.follow import follow_record
from rdna1_kmgr.follow.follow_record import FollowRecord
from rdna1_kmgr.host import system_identity
from rdna1_kmgr.install import install_stages, module_install, rollback
from rdna1_kmgr.install.install_begin import InstallBegin
from rdna1_kmgr.install.journal import Busy, Journal
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.modbuild import built_module, module_build, signing
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.modbuild.build_result import BuildResult
from rdna1_kmgr.render.manifest import Manifest
from rdna1_kmgr.source import target_kernel
from rdna1_kmgr.vm import engine, verdict


class StageFailed(KmgrError):
    """A stage of the follow-up failed: the kernel stays stock."""

    exit_code = Exit.BUILD

    def __init__(self, stage: str, err: KmgrError):
        super().__init__(f"{stage}: {err.what}", err.hint)
        self.stage = stage
        self.cause = err
        self.exit_code = err.exit_code


# --- what is installed now ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Installed:
    """The finished install whose quirks new kernels get."""

    kernel: str
    package: dkms.Package
    trees: dkms.Trees
    quirks: list[str]
    devices: list[int]
    without: list[str] = field(default_factory=list)  # the quirks the owner left out (--no-quirk)


@dataclass(frozen=True)
class Finished:
    """A finished install still in place: what it began with, and when."""

    install: InstallBegin
    since: str


def finished_installs() -> dict[str, Finished]:
    """Kernel -> every finished install still in place."""
    found = {}
    for kernel in Journal.kernels():
        try:
            state = Journal(kernel).state()
        except KmgrError:
            continue  # a corrupted journal says nothing trustworthy
        if state.in_place:
            found[kernel] = Finished(state.in_place, state.since or "")
    return found


def current_install(exclude: str | None = None) -> Installed | None:
    """The newest finished install (not `exclude`'s), with the quirks its render manifest names; None: opted out."""
    installs = {k: f for k, f in finished_installs().items() if k != exclude and f.install.package is not None}
    if not installs:
        return None
    kernel, newest = max(installs.items(), key=lambda item: item[1].since)
    trees, package = newest.install.dkms_trees, newest.install.package
    assert package is not None  # kept above
    manifest_path = package.source_dir(trees) / dkms.MANIFEST_NAME
    try:
        manifest = Manifest.read(manifest_path)
    except (OSError, KmgrError) as err:
        why = err.what if isinstance(err, KmgrError) else str(err)
        raise HostError(
            f"the render manifest of the installed {package.ref} ({manifest_path}) is unreadable: {why}",
            f"rebuild and reinstall it for {kernel}, or give the quirks to `rdna1-kmgr build`",
        ) from None
    # what the owner asked the build for (None: the default, every quirk that fits the kernel)
    quirks = list(manifest.asked_quirks or ())
    devices = [int(d, 16) for d in manifest.devices]
    return Installed(kernel, package, trees, quirks, devices, list(manifest.declined_quirks))


# --- the log ----------------------------------------------------------------------------------------------------


class Story:
    """Writes every line to the caller's stream and to the kernel's follow log."""

    def __init__(self, log: Path):
        self.stream = progress.current_stream()  # where the caller reads progress (apt's output, a terminal)
        self.log = log
        make_dirs(log.parent)
        self._file = open_private_log(log)

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.stream.flush()
        self._file.write(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
        self._file.flush()

    def isatty(self) -> bool:
        return False  # progress in whole lines (a quarter at a time): the log and apt's output read them

    def say(self, line: str) -> None:
        self.write(f"rdna1-kmgr: {line}\n")

    def close(self) -> None:
        self._file.close()


@contextmanager
def follow_lock() -> Iterator[None]:
    """One follow-up at a time (a second hook run waits instead of building the same thing twice)."""
    path = follow_record.follow_dir() / "lock"
    make_dirs(path.parent)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(
                f"another `rdna1-kmgr follow` holds {path}", "it follows the pending kernels too; wait for it"
            ) from None
        yield


# --- one kernel ---------------------------------------------------------------------------------------------


def plan(kernel: str, source: str | None = None) -> list[str]:
    """What `follow --kernel` would do (changes nothing): its pipeline planned."""
    kernel = user_input.kernel_release(kernel)
    if kernel in finished_installs():
        return [f"nothing to do for {kernel}: it has an rdna1-kmgr install already"]
    installed = current_install(exclude=kernel)
    if installed is None:
        return [f"nothing to do for {kernel}: no kernel has an rdna1-kmgr install (follow acts once one has)"]
    target = target_kernel.resolve_kernel(kernel, "planning a build", system=system_identity.read())
    request = _build_request(target, installed, source)
    lines = [
        f"follow {kernel} with the quirks installed for {installed.kernel} ({installed.package.ref}): "
        f"{' '.join(installed.quirks)}; devices {' '.join(f'0x{d:04X}' for d in installed.devices)}"
    ]
    lines += [f"  {line}" for line in module_build.plan(request, FOLLOW).plan]
    lines.append(
        f"  any failure: {kernel} keeps the stock amdgpu; the reason goes to "
        f"{follow_record.follow_dir()}/{kernel}.json and `rdna1-kmgr status`"
    )
    return lines


def _build_request(kernel: target_kernel.Kernel, installed: Installed, source: str | None) -> module_build.BuildRequest:
    return module_build.BuildRequest(
        kernel=kernel,
        source=source,
        quirks=installed.quirks or None,
        devices=installed.devices or None,
        without=installed.without or None,
        no_install=True,
    )


@dataclass(frozen=True)
class NotOptedIn:
    """What follow says for a kernel while no kernel has an rdna1-kmgr install: nothing (it keeps no record)."""

    kernel: str
    state: str = "not-opted-in"
    reason: str = "no kernel has an rdna1-kmgr install; follow acts once one has"


def follow(kernel: str, source: str | None = None) -> FollowRecord | NotOptedIn:
    """Patch `kernel` or leave it stock; returns its follow record. StageFailed when it stays stock."""
    kernel = user_input.kernel_release(kernel)
    finished = finished_installs().get(kernel)
    if finished is not None:  # a reinstalled kernel package: the module in updates/dkms survived it
        package = finished.install.package
        return follow_record.write(
            FollowRecord(
                kernel,
                "patched",
                package=package.name if package else None,
                package_version=package.version if package else None,
                verdict=finished.install.verdict,  # None: installed without a VM verdict
                module_sha256=finished.install.module_sha256,
                reason="installed already",
            )
        )
    installed = current_install(exclude=kernel)
    if installed is None:
        follow_record.forget(kernel)
        return NotOptedIn(kernel)
    with follow_lock():
        log = log_dir() / f"follow-{kernel}-{time.strftime('%Y%m%d-%H%M%S')}.log"
        story = Story(log)
        follow_record.write(FollowRecord(kernel, "running", pid=os.getpid(), log=str(log)))
        try:
            story.say(
                f"following {kernel} with the quirks installed for {installed.kernel} "
                f"({installed.package.ref}): {' '.join(installed.quirks)}"
            )
            with progress.reporting_to(story):  # the downloads', apt's and the VM test's lines too
                built, record = _stages(kernel, installed, source, story)
        except StageFailed as err:
            story.say(f"{kernel} keeps the stock amdgpu: {err.line()}")
            follow_record.write(FollowRecord(kernel, "stock", stage=err.stage, reason=err.cause.line(), log=str(log)))
            raise
        except BaseException as err:  # Ctrl-C, a crash: stock, and it says so
            why = type(err).__name__ + (f": {err}" if str(err) else "")
            follow_record.write(FollowRecord(kernel, "stock", stage="interrupted", reason=why, log=str(log)))
            raise
        finally:
            story.close()
        return follow_record.write(
            FollowRecord(
                kernel,
                "patched",
                log=str(log),
                package=built.package,
                package_version=built.package_version,
                module_sha256=built.sha256,
                verdict=record.verdict,
                verdict_record=str(verdict.record_path(built.sha256)),
                quirks=tuple(built.quirks),
            )
        )


# --- the stages -------------------------------------------------------------------------------------------


@dataclass
class FollowContext(module_build.BuildContext):
    """The build's context, and what the VM verdict and the install add."""

    installed: Installed | None = None
    record: verdict.Record | None = None


class ImageStage:
    """The kernel is installed: install needs its modules folder, and a package manager still on its way runs the
    hook again when it gets there."""

    name = "image"

    def plan(self, ctx: FollowContext) -> list[str]:
        return []

    def run(self, ctx: FollowContext) -> None:
        root = TargetRoot.from_env()
        kernel = ctx.kernel.release
        if not (root.modules_dir(kernel) / "kernel").is_dir():
            raise HostError(
                f"kernel {kernel} is not installed ({root.modules_dir(kernel)} holds no modules)",
                f"install linux-image-{kernel}; its hook follows it then",
            )


class VmVerdictStage:
    name = "vm-test"

    def plan(self, ctx: FollowContext) -> list[str]:
        return [
            f"vm-test: the emulated verdict for that module on {ctx.kernel.release} (a stored passing one is reused)"
        ]

    def run(self, ctx: FollowContext) -> None:
        kernel = ctx.kernel.release
        module = built_module.for_kernel(kernel)
        record = verdict.passing_record(module.path, kernel)
        if record is not None and record.module_sha256:  # a passing record is always of one module
            progress.say(f"rdna1-kmgr: reusing the passing VM verdict {verdict.record_path(record.module_sha256)}")
        else:
            record = engine.validate_module(
                module.path,
                kernel,
                fetch=True,
                selftest_required=module.selftest_cases,
            )  # its lines ("vm-test: ...") go to the story: reporting_to in follow
            if not record.passed:
                raise BuildError(f"the VM verdict is {record.verdict}: {record.reason}", f"record {record.record}")
        ctx.record = record


class InstallStage:
    name = "install"

    def plan(self, ctx: FollowContext) -> list[str]:
        kernel = ctx.kernel.release
        plain, guarded = install_stages.UNGUARDED.names, install_stages.GUARDED.names
        return [
            f"install: `rdna1-kmgr install --kernel {kernel}`, its journaled stages {', '.join(plain)} (with the "
            f"boot guard {', '.join(guarded)}); their exact plan once built: "
            f"`rdna1-kmgr install --kernel {kernel} --dry-run`"
        ]

    def run(self, ctx: FollowContext) -> None:
        kernel = ctx.kernel.release
        if Journal(kernel).exists():
            # An earlier follow-up of this kernel killed inside its install (a power cut, say): undo that first.
            progress.say(f"rdna1-kmgr: an earlier install for {kernel} did not finish: rolling it back first")
            rollback.run(kernel, keep_build=True)
        result = module_install.run(module_install.InstallRequest(kernel=ctx.kernel))
        for line in result.next_boot:
            progress.say(f"rdna1-kmgr: {line}")


# Follow is the build's stages, the source's and the render's first (a source the installed quirks do not fit
# is the likeliest reason to stay stock, and follow never installs the prerequisites a build may install),
# then the VM verdict and the install. Each fetches and renders once.
FOLLOW = Pipeline(
    (
        ImageStage(),
        module_build.KERNEL,
        module_build.FETCH,
        module_build.RENDER,
        module_build.PREREQUISITES,
        module_build.SIGNING_KEY,
        module_build.PROBE,
        module_build.DKMS_BUILD,
        module_build.VERIFY,
        VmVerdictStage(),
        InstallStage(),
    )
)
# The name a failure is recorded under (follow/<KREL>.json, `status`), as follow has always named its stages.
RECORDED_STAGE = {"kernel": "source", "fetch": "source", "render": "render", "vm-test": "vm-test", "image": "image"}


def _recorded(stage: str) -> str:
    return RECORDED_STAGE.get(stage, "install" if stage == "install" else "build")


@contextmanager
def _failing_as(stage: list[str]) -> Iterator[None]:
    """A KmgrError inside becomes StageFailed under the recorded name of the stage running (stage[0])."""
    try:
        yield
    except StageFailed:
        raise
    except KmgrError as err:
        raise StageFailed(_recorded(stage[0]), err) from None


def _stages(kernel: str, installed: Installed, source: str | None, story: Story) -> tuple[BuildResult, verdict.Record]:
    """The built package and its VM verdict (StageFailed: the stage that failed)."""
    running = ["image"]
    said: list[str] = []

    def starting(name: str) -> None:
        running[0] = name
        if not said or said[-1] != _recorded(name):
            said.append(_recorded(name))
            story.say(f"--- {_recorded(name)}")

    with _failing_as(running), tempfile.TemporaryDirectory(prefix="rdna1-kmgr-follow-") as tmp:
        running[0] = "kernel"
        system = system_identity.read()
        target = target_kernel.resolve_kernel(kernel, system=system)
        request = _build_request(target, installed, source)
        running[0] = "signing key"
        keys = signing.resolve(request.key, request.cert, system.platform)
        ctx = FollowContext(request, system, target, keys, Path(tmp), installed=installed)
        FOLLOW.run(ctx, on_stage=starting)
    assert ctx.result is not None and ctx.record is not None
    return ctx.result, ctx.record


# --- the hooks' entry points ----------------------------------------------------------------------------------


def defer(kernel: str) -> str | None:
    """Note `kernel` for later (inside dpkg: nothing else); None when follow has nothing to do (opted out)."""
    kernel = user_input.kernel_release(kernel)
    if not finished_installs():
        return None
    if kernel in finished_installs():
        return f"{kernel} has an rdna1-kmgr install already"
    follow_record.write(FollowRecord(kernel, "pending"))
    return f"{kernel}: noted; amdgpu is patched for it once the package manager is done"
