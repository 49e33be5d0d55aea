"""`rdna1-kmgr build`: render, DKMS-build, sign and verify amdgpu for one kernel."""

import sys
from pathlib import Path

import click

from rdna1_kmgr.commands.quirk_options import quirk_selection
from rdna1_kmgr.core import output, progress, user_input
from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.host import system_identity
from rdna1_kmgr.modbuild.build_result import BuildResult
from rdna1_kmgr.modbuild.module_build import BuildRequest, plan, run
from rdna1_kmgr.source.target_kernel import resolve_kernel


def _confirm_install(plan_) -> bool:
    if not sys.stdin.isatty():
        return False  # nobody to ask: packages.ensure_prerequisites names what is missing
    progress.say("To build, these packages are needed:")
    for step in plan_.describe():
        progress.say(f"  {step}")
    return click.confirm("Install them now?", default=True, err=True)


def _refuse_contradictions(
    jobs: int | None, yes_and_no_install: bool, sysroot_without_dry_run: bool, source, sha256, keyring
) -> None:
    """Options that cannot go together, or one without the other it needs: one line, before anything is read."""
    if jobs is not None and jobs < 1:
        raise UsageError(f"invalid job count {jobs}", "give -j 1 or more")
    if yes_and_no_install:
        raise UsageError("--yes and --no-install contradict each other", "give one of them")
    if sysroot_without_dry_run:
        raise UsageError("--sysroot is for --dry-run", "a build is for this machine's kernels: drop --sysroot")
    if keyring and not (source and "://" in source):
        raise UsageError("--keyring needs --source with a URL", "give the tarball's URL")
    if sha256 and not source:
        raise UsageError("--sha256 needs --source", "give the tarball it is the hash of")


@click.command()
@click.option("--kernel", metavar="KREL", help="Kernel release to build for (default: the running kernel).")
@click.option(
    "--source",
    metavar="PATH|URL",
    help="Driver source: an unpacked tree, a tarball or .deb, or a tarball URL (default: the distro's).",
)
@click.option("--sha256", metavar="HEX", help="Expected SHA-256 of the --source tarball.")
@click.option(
    "--keyring",
    metavar="FILE",
    help="Keys (gpg --export) that must have signed the sha256sums.asc beside a --source https URL.",
)
@quirk_selection
# The help names no number: it is the same on every machine, as the generated reference and man page are.
@click.option("-j", "--jobs", type=int, metavar="N", help="Parallel compile jobs (default: this machine's cores + 1).")
@click.option("--key", metavar="FILE", help="Private key to sign with (with --cert; default: the distro's DKMS key).")
@click.option("--cert", metavar="FILE", help="Certificate of --key (DER or PEM).")
@click.option("--yes", is_flag=True, help="Install missing prerequisites without asking.")
@click.option("--no-install", is_flag=True, help="Fail, naming the missing prerequisites, instead of installing them.")
@click.option(
    "--debug-info",
    is_flag=True,
    help="Compile with the kernel config's debug info (slower, a larger kbuild tree; for reading crash "
    "dumps). Default: without; the installed module is stripped either way.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the plan with its exact commands; change nothing (the source is fetched into the cache).",
)
@click.option("--sysroot", metavar="DIR", help="With --dry-run: read the kernel and distribution facts under DIR.")
@output.json_option
def build(
    kernel,
    source,
    sha256,
    keyring,
    quirks,
    without,
    devices,
    jobs,
    key,
    cert,
    yes,
    no_install,
    debug_info,
    dry_run,
    sysroot,
) -> output.Shown:
    """Build the patched amdgpu module for a kernel through DKMS, sign it and verify it."""
    _refuse_contradictions(jobs, yes and no_install, bool(sysroot) and not dry_run, source, sha256, keyring)
    # the one place the kernel is decided (and --kernel checked); a dry run decides it for the --sysroot system
    system = system_identity.read(user_input.existing_dir(sysroot, "sysroot") if sysroot else Path("/"))
    target = resolve_kernel(kernel, "planning a build" if dry_run else "building", system=system)
    request = BuildRequest(
        kernel=target,
        source=source,
        sha256=sha256,
        keyring=keyring,
        quirks=list(quirks) or None,
        without=list(without) or None,
        devices=[user_input.pci_device_id(d) for d in devices] or None,
        jobs=jobs,
        yes=yes,
        no_install=no_install,
        key=key,
        cert=cert,
        sysroot=sysroot,
        debug_info=debug_info,
    )
    if dry_run:
        planned = plan(request)
        return output.shown(planned, planned.plan)
    result = run(request, confirm=_confirm_install)
    return output.shown(result, _built_lines(result))


def _built_lines(result: BuildResult) -> list[str]:
    """What was built, one fact a line under the module's path."""
    verb = "reused" if result.reused else f"built in {result.seconds} s"
    return [
        f"{result.module} ({verb})",
        f"  kernel {result.kernel}, package {result.package}/{result.package_version}",
        f"  signed by {result.signer!r}, verified against {result.certificate}",
        f"  on by default: {' '.join(result.quirks_on) or 'nothing'}; compiled in, off until switched on: "
        f"{' '.join(result.quirks_off) or 'nothing'}",
        f"  devices {' '.join(result.devices)}; parameters {' '.join(result.parameters)}",
        f"  sha256 {result.sha256}",
        *(f"  removed the older build {result.package}/{old}" for old in result.removed_versions),
        *(
            f"  kept {result.package}/{old}: it is installed (`rdna1-kmgr install` replaces it)"
            for old in result.kept_installed_versions
        ),
    ]
