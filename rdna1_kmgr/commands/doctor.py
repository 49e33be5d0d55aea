"""`rdna1-kmgr doctor`: the whole ROCm stack read for the board, each finding with why and what to do."""

import click

from rdna1_kmgr.core import output, user_input
from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.doctor.kfd_access import invoking_user
from rdna1_kmgr.doctor.report import run, text_lines


@click.command()
@output.json_option
@click.option(
    "--sysroot",
    default="/",
    show_default=True,
    metavar="DIR",
    help="Read this tree instead of / (a fixture or a mounted system).",
)
@click.option(
    "--python",
    "pythons",
    multiple=True,
    metavar="PATH",
    help="Also read this interpreter's or venv's PyTorch (repeatable).",
)
@click.option(
    "--user",
    "user_name",
    metavar="NAME",
    help="Check device access and shell files for this user (default: SUDO_USER, else you).",
)
def doctor(sysroot, pythons, user_name) -> output.Shown:
    """Board, driver, KFD, device access, HSA_OVERRIDE_GFX_VERSION and the *_VISIBLE_DEVICES variables wherever
    they are set, gfx1010 code in PyTorch and ROCm (TheRock's split wheels too, with a pip line that works), the
    queue's control-stack and CWSR checks, ROCm stacks, MIOpen settings, PCIe atomics, hangs and GPU page faults.
    Reads only; ends with the one command to run next."""
    sysroot = user_input.existing_dir(sysroot, "sysroot")
    if user_name:
        user_name = user_input.user_name(user_name)
        if invoking_user(sysroot, user_name) is None:
            raise UsageError(
                f"--user {user_name!r} is not a user of {sysroot}", "give a name `getent passwd` lists there"
            )
    result = run(sysroot, list(pythons), user_name)
    return output.shown(result, text_lines(result))
