"""Stage 5, vm-test: the built module proven in a QEMU guest of its own kernel (emulated or with the GPU).

Takes a built module and its kernel release. Leaves a verdict record keyed by the module's sha256 in
/var/lib/rdna1-kmgr/validations/, guest kernels unpacked in /var/cache/rdna1-kmgr/, the raw guest output in
/var/log/rdna1-kmgr/; a passthrough run also keeps the vfio-pci journal in /var/lib/rdna1-kmgr/vfio/ until
every device it moved is given back.
"""
