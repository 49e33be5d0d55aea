"""`rdna1-kmgr keys status|generate|enroll`: the module-signing key and its Secure Boot enrollment."""

from pathlib import Path

import click

from rdna1_kmgr.core import output, progress, user_input
from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.host import system_identity
from rdna1_kmgr.modbuild import key_status, signing

_key_options = [
    click.option("--key", metavar="FILE", help="Private key (with --cert; default: the distro's DKMS key)."),
    click.option("--cert", metavar="FILE", help="Its certificate (DER or PEM)."),
]


def _with_key_options(func):
    for option in reversed(_key_options):
        func = option(func)
    return func


@click.group()
def keys():
    """The key DKMS signs the module with, and whether Secure Boot will trust it."""


@keys.command()
@_with_key_options
@click.option("--sysroot", default="/", show_default=True, metavar="DIR", help="Read Secure Boot state under DIR.")
@output.json_option
def status(key, cert, sysroot) -> output.Shown:
    """Secure Boot state, the key pair, and whether the certificate is enrolled. Changes nothing."""
    state = key_status.read(key, cert, user_input.existing_dir(sysroot, "sysroot"))
    return output.shown(state, _status_lines(state))


def _status_lines(state: key_status.KeyStatus) -> list[str]:
    pair = state.pair
    key_note = (
        "missing"
        if not state.key_exists
        else ("private (0600)" if state.key_private else "READABLE BY OTHERS: chmod 600 it")
    )
    certificate = (
        "missing"
        if state.certificate is None
        else f"{state.certificate.subject!r}, SHA-1 {state.certificate.sha1_fingerprint}, "
        f"valid until {state.certificate.not_after}"
    )
    lines = [
        f"secure boot  {state.secure_boot_state}",
        f"key          {pair.key} ({pair.convention}): {key_note}",
        f"certificate  {pair.cert}: {certificate}",
        f"enrollment   {state.enrollment}",
    ]
    if not state.key_exists and not state.cert_exists:
        lines.append("make one with `rdna1-kmgr keys generate` (or let `rdna1-kmgr build` do it)")
    elif state.secure_boot_enabled and state.enrollment != "enrolled":
        lines.append(
            "Secure Boot is on: the module will not load until the certificate is enrolled "
            "(`rdna1-kmgr keys enroll`)"
        )
    return lines


@keys.command()
@_with_key_options
@click.option("--force", is_flag=True, help="Replace an existing pair (the new one must be enrolled again).")
@click.option("--dry-run", is_flag=True, help="Print what would be written; change nothing.")
def generate(key, cert, force, dry_run) -> output.Shown:
    """Make a signing key (readable by root only) and its certificate."""
    pair = signing.resolve(key, cert)
    if dry_run:
        replacing = force and (pair.key.exists() or pair.cert.exists())
        return output.shown(
            None,
            [
                f"openssl req -new -x509 -nodes -newkey rsa:2048 -subj /CN={signing.DEFAULT_SUBJECT} ...",
                f"write {pair.key} (mode 0600) and {pair.cert} (DER, mode 0644)"
                + (" replacing the existing pair" if replacing else ""),
            ],
        )
    signing.generate(pair, force=force)
    info = signing.certificate_info(pair.cert)
    return output.shown(
        None,
        [
            f"wrote {pair.key} (0600) and {pair.cert}: {info.subject!r}, SHA-1 {info.sha1_fingerprint}",
            "next: `rdna1-kmgr keys enroll` if Secure Boot is on",
        ],
    )


@keys.command()
@click.option("--cert", metavar="FILE", help="Certificate to enroll (default: the distro's DKMS certificate).")
@click.option(
    "--sysroot",
    default="/",
    show_default=True,
    metavar="DIR",
    help="The system whose convention applies (with --dry-run).",
)
@click.option("--dry-run", is_flag=True, help="Print the command; change nothing.")
def enroll(cert, sysroot, dry_run) -> output.Shown:
    """Queue the certificate for enrollment as a Machine Owner Key (finished at the next boot)."""
    root = user_input.existing_dir(sysroot, "sysroot")
    system = system_identity.read(root)
    if not system.on_host and not dry_run:
        raise UsageError("--sysroot is for --dry-run: enrolling asks this machine's firmware", "add --dry-run")
    convention = signing.convention(system.platform)
    path = Path(cert).absolute() if cert else convention.cert
    if dry_run:
        return output.shown(None, [" ".join(signing.enroll_command(path, convention, root)), *signing.REBOOT_STEPS])
    already = signing.enrollment(path) if path.is_file() else None
    if already in ("enrolled", "pending"):
        return output.shown(None, [f"{path} is already {already}; nothing to do"])
    progress.say("mokutil asks for a one-time password now; you type it again at the next boot.")
    signing.enroll(path, convention)
    return output.shown(None, signing.REBOOT_STEPS)
