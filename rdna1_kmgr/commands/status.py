"""`rdna1-kmgr status`: what is built and installed per kernel, and whether it is in use."""

import click

from rdna1_kmgr.core.output import emit_json
from rdna1_kmgr.follow.status import run, text_lines


@click.command()
@click.option(
    "--cert", metavar="FILE", help="Certificate to check signatures against (default: the distro's DKMS one)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status(cert, as_json):
    """Per kernel: package and version, module sha256, signature and enrollment, verdict, parameters, loaded."""
    result = run(cert)
    if as_json:
        emit_json(result)
    else:
        click.echo("\n".join(text_lines(result)))
