"""`rdna1-kmgr status`: what is built and installed per kernel, and whether it is in use."""

import click

from rdna1_kmgr.core import output
from rdna1_kmgr.follow.status import run, text_lines


@click.command()
@click.option(
    "--cert", metavar="FILE", help="Certificate to check signatures against (default: the distro's DKMS one)."
)
@output.json_option
def status(cert) -> output.Shown:
    """Per kernel: package and version, module sha256, signature and enrollment, verdict, parameters, loaded."""
    result = run(cert)
    return output.shown(result, text_lines(result))
