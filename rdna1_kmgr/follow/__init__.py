"""Stage 7, follow: the patched driver follows the owner to every kernel the package manager installs.

Takes a kernel release from the distribution's kernel hooks (or from the owner: `rdna1-kmgr follow --kernel`),
once some kernel has an rdna1-kmgr install (the owner opted in). Runs the earlier stages for it with the quirks
installed now: the kernel's exact source, render, build and sign, the emulated VM test, install. Leaves the
new kernel patched, or stock with the reason in follow/<KREL>.json under /var/lib/rdna1-kmgr (see
follow_record.py), the whole story in /var/log/rdna1-kmgr/follow-<KREL>-<time>.log. A removed kernel's
DKMS package, kbuild tree, journal and records go with it. hooks.py places the hooks that call all this.

status.py is the read model above it all (like doctor): what each kernel has, from every stage's state,
changing nothing.
"""
