"""`rdna1-kmgr report`: a Markdown file to paste into an issue tracker, the JSON beside it, nothing private."""

import os

import click

from rdna1_kmgr.core import output, user_input
from rdna1_kmgr.experiment import issue_report


@click.command()
@click.option(
    "--output",
    "output_path",
    metavar="PATH",
    help="The Markdown file (.md); the JSON (and the page) beside it. Default: rdna1-kmgr-report-<time>.md here.",
)
@click.option("--html", "with_html", is_flag=True, help="Also the page with the experiment's grid (.html).")
@click.option("--sysroot", default="/", show_default=True, metavar="DIR", help="Read this tree instead of /.")
@click.option("--python", "pythons", multiple=True, metavar="PATH", help="Also read this Python's PyTorch.")
@click.option("--user", "user_name", metavar="NAME", help="The user doctor speaks for (default: SUDO_USER, else you).")
def report(output_path, with_html, sysroot, pythons, user_name) -> output.Shown:
    """doctor's findings, the kernel and its SVM/CWSR facts, KFD nodes, ROCm and torch versions, the installed
    build and its mask, the last experiment's table: user names, homes, host name and serials redacted. Runs
    without root (says what it could not read). Changes nothing but the files it writes."""
    path = issue_report.checked_output(output_path)
    root = user_input.existing_dir(sysroot, "sysroot")
    written = issue_report.write(
        issue_report.gather(root, list(pythons), user_name), path, with_html, _invoking_owner()
    )
    lines = [str(made) for made in (written.markdown, written.json, written.html) if made is not None]
    if written.not_read and os.geteuid() != 0:
        lines.append(
            f"not read without root: {len(written.not_read)} part(s), listed at the end of the report; "
            "`sudo rdna1-kmgr report` includes them"
        )
    lines.append(
        "read it before you share it: names, homes, the host name and serials are replaced by <user>, "
        "<home>, <host>, <serial>"
    )
    return output.shown(None, lines)


def _invoking_owner() -> tuple[int, int] | None:
    """The user who ran sudo owns the files root writes for them."""
    uid, gid = os.environ.get("SUDO_UID", ""), os.environ.get("SUDO_GID", "")
    if os.geteuid() == 0 and uid.isdecimal() and gid.isdecimal():
        return int(uid), int(gid)
    return None
