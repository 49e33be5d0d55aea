"""`rdna1-kmgr render` and `rdna1-kmgr quirks`: the patch series for a kernel source, and the catalog."""

from pathlib import Path

import click

from rdna1_kmgr.commands.quirk_options import quirk_selection
from rdna1_kmgr.core import output, user_input
from rdna1_kmgr.host import host_facts
from rdna1_kmgr.render import quirk_listing
from rdna1_kmgr.render.manifest import Manifest
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
@output.json_option
def render(
    source: str, out: str, quirks: tuple[str, ...], without: tuple[str, ...], devices: tuple[str, ...]
) -> output.Shown:
    """Render the amdgpu/amdkfd patch series for a kernel source."""
    src = user_input.existing_dir(source, "kernel source")
    ids = [user_input.pci_device_id(d) for d in devices] or list(host_facts.board_devices().ids)
    manifest = render_series(src, Path(out), list(quirks), ids, list(without))
    return output.shown(manifest, _rendered_lines(manifest, src, out))


def _rendered_lines(manifest: Manifest, src: Path, out: str) -> list[str]:
    lines = [f"Linux {manifest.kernel_version}: {len(manifest.series)} patches in {Path(out).resolve()}"]
    lines += [f"  {name}" for name in manifest.series]
    lines.append(f"devices: {' '.join(manifest.devices)}; self-test cases: {manifest.selftest_cases}")
    lines += manifest.notes()
    for q in manifest.quirks:
        lines.append(f"quirk {q.id}: variant {q.variant}, because this tree's")
        lines += [f"    {fact}" for fact in q.facts]
    lines.append(f"apply with: for p in $(cat {out}/series); do patch -p1 -d {src} < {out}/$p; done")
    return lines


@click.command()
@output.json_option
def quirks() -> output.Shown:
    """List the quirks in the catalog, each variant with the facts of the source that choose it."""
    catalog = quirk_listing.listing()
    return output.shown(catalog, quirk_listing.text_lines(catalog))
