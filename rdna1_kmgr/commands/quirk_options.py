"""The options that choose the quirks and the boards, shared by `build` and `render`."""

import click

HELP_DEVICES = (
    "RDNA1 PCI device id the quirks apply to (repeatable; default: every id of the RDNA1 chips found on "
    "this machine, 0x731F where there is none)."
)


def quirk_selection(command):
    """--quirk, --no-quirk and --device, as the command's `quirks`, `without` and `devices` parameters."""
    for option in reversed(
        (
            click.option(
                "--quirk",
                "quirks",
                multiple=True,
                metavar="ID",
                help="Only this quirk, and the default-on ones this kernel needs (repeatable; default all).",
            ),
            click.option(
                "--no-quirk",
                "without",
                multiple=True,
                metavar="ID",
                help="Leave this quirk out, default-on or not (repeatable).",
            ),
            click.option("--device", "devices", multiple=True, metavar="0xNNNN", help=HELP_DEVICES),
        )
    ):
        command = option(command)
    return command
