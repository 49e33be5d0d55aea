"""`rdna1-kmgr detect`: what this host has, read only."""

from pathlib import Path

import click

from rdna1_kmgr.core import output, user_input
from rdna1_kmgr.host.host_facts import HostFacts
from rdna1_kmgr.host.host_facts import detect as detect_host
from rdna1_kmgr.host.rdna1_boards import DEFAULT_TARGET, chip_of, format_id, is_rdna1


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
    "--target",
    default=format_id(DEFAULT_TARGET),
    show_default=True,
    metavar="0xNNNN",
    help="PCI device id of the RDNA1 board to work on.",
)
def detect(sysroot: str, target: str) -> output.Shown:
    """Report kernel, distro, GPUs, headers, DKMS, Secure Boot, IOMMU and KVM. Changes nothing."""
    facts = detect_host(user_input.existing_dir(sysroot, "sysroot"), user_input.pci_device_id(target))
    return output.shown(facts, text_lines(facts))


def text_lines(facts: HostFacts) -> list[str]:
    """The report as `detect` prints it, one fact a line."""
    # DKMS is only asked of the running host; a sysroot's DKMS is not read.
    dkms = facts.dkms_version or ("not installed" if facts.sysroot == Path("/") else "not read (sysroot)")
    lines = [
        f"kernel       {facts.kernel_release}",
        f"distro       {facts.distro_name or facts.distro_id or 'unknown'}",
        f"headers      {'present' if facts.headers_present else 'missing'} ({facts.headers_path})",
        f"dkms         {dkms}",
        f"secure boot  {facts.secure_boot_state}",
        f"iommu        {'on' if facts.iommu_enabled else 'off'}",
        f"kvm          {'yes' if facts.kvm_present else 'no'} (/dev/kvm)",
    ]
    target = facts.target
    lines.append("display devices:" if facts.display_devices else "display devices: none")
    for dev in facts.display_devices:
        tags = []
        if is_rdna1(dev.vendor, dev.device):
            tags.append(f"RDNA1 {chip_of(dev.device)}")
        if target is not None and dev.bdf == target.bdf:
            tags.append("TARGET")
        if dev.boot_vga:
            tags.append("boot VGA")
        group = "no IOMMU group" if dev.iommu_group is None else f"IOMMU group {dev.iommu_group}"
        if dev.group_members:
            group += " with " + " ".join(dev.group_members)
        lines.append(
            f"  {dev.bdf}  {dev.vendor:04x}:{dev.device:04x}  class {dev.pci_class:06x}"
            f"  driver {dev.driver or '(none)'}  {group}" + (f"  [{', '.join(tags)}]" if tags else "")
        )
    if not facts.rdna1_devices:
        lines.append("no RDNA1 GPU found")
    wanted = f"{format_id(facts.target_id)} ({chip_of(facts.target_id)})"
    lines.append(f"target       {wanted}: " + (target.bdf if target else "not present"))
    return lines
