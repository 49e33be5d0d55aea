"""Stage 1, detect: facts about the machine, read and never changed.

Takes a sysroot (/ or a fixture tree). Leaves HostFacts: kernel release, distro, the PCI display devices and
which of them is the RDNA1 target, headers, DKMS, Secure Boot, IOMMU, KVM; SystemIdentity (distribution,
codename, running release, Ubuntu's /proc/version_signature) with its Platform (platforms.toml's record of
the distribution's ways) for the later stages; and the kernel log as records.
Keeps no state of its own.
"""
