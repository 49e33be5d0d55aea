"""`rdna1-kmgr render` and `rdna1-kmgr quirks`: the patch series for a kernel source, and the catalog."""

from pathlib import Path

import click

from rdna1_kmgr.commands.quirk_options import quirk_selection
from rdna1_kmgr.core import user_input
from rdna1_kmgr.core.output import emit_json
from rdna1_kmgr.host import host_facts
from rdna1_kmgr.host.rdna1_boards import format_id
from rdna1_kmgr.render import quirk_catalog
from rdna1_kmgr.render.patch_series import render as render_series


@click.command()
@click.option(
    "--source",
    "source",
    required=True,
    metavar="SRC",
    help="Kernel source root (its top Makefile and drivers/gpu/drm/amd are enough).",
)
@click.option("--out", "out", required=True, metavar="OUT", help="Folder for series, patches and manifest.json.")
@quirk_selection
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def render(
    source: str, out: str, quirks: tuple[str, ...], without: tuple[str, ...], devices: tuple[str, ...], as_json: bool
):
    """Render the amdgpu/amdkfd patch series for a kernel source."""
    src = user_input.existing_dir(source, "kernel source")
    ids = [user_input.pci_device_id(d) for d in devices] or list(host_facts.board_devices().ids)
    manifest = render_series(src, Path(out), list(quirks), ids, list(without))
    if as_json:
        emit_json(manifest.to_json())
        return
    click.echo(f"Linux {manifest.kernel_version}: {len(manifest.series)} patches in {Path(out).resolve()}")
    for name in manifest.series:
        click.echo(f"  {name}")
    click.echo(f"devices: {' '.join(manifest.devices)}; self-test cases: {manifest.selftest_cases}")
    for line in manifest.notes():
        click.echo(line)
    for q in manifest.quirks:
        click.echo(f"quirk {q.id}: variant {q.variant}, because this tree's")
        for fact in q.facts:
            click.echo(f"    {fact}")
    click.echo(f"apply with: for p in $(cat {out}/series); do patch -p1 -d {src} < {out}/$p; done")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the catalog as JSON.")
def quirks(as_json: bool):
    """List the quirks in the catalog, each variant with the facts of the source that choose it."""
    found = sorted(quirk_catalog.load_quirks().values(), key=lambda q: q.bit)
    if as_json:
        emit_json(
            [
                dict(
                    id=q.id,
                    summary=q.summary,
                    changes=q.changes,
                    scope=q.scope,
                    evidence=list(q.evidence),
                    needed_when=[dict(fact=str(n.fact), otherwise=n.otherwise) for n in q.needed_when],
                    fixed_when=[dict(fact=str(f.fact), because=f.because) for f in q.fixed_when],
                    bits=[
                        dict(
                            bit=b.bit,
                            id=b.id,
                            mask=format_id(1 << b.bit),
                            title=b.title,
                            default=b.default,
                            risk=b.risk,
                        )
                        for b in q.bits
                    ],
                    variants=[dict(id=v.id, kernels=v.kernels, facts=[str(f) for f in v.facts]) for v in q.variants],
                )
                for q in found
            ]
        )
        return
    for q in found:
        click.echo(f"{q.id}: {q.summary}")
        for b in q.bits:
            click.echo(f"    bit {b.bit} {b.id} ({'on' if b.default else 'off'} by default): {b.title}")
        click.echo(f"    changes: {q.changes}")
        if q.scope:
            click.echo(f"    matters: {q.scope}")
        click.echo("    evidence owners need it: " + ("; ".join(q.evidence) if q.evidence else "none (opt-in)"))
        for need in q.needed_when:
            click.echo(f"    needed only where {need.fact} (else left out: {need.otherwise})")
        for fixed in q.fixed_when:
            click.echo(f"    left out where {fixed.fact}: {fixed.because}")
        for v in q.variants:
            click.echo(f"    {v.id} (first seen in Linux {v.kernels}) when:")
            for fact in v.facts:
                click.echo(f"        {fact}")
