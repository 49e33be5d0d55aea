"""Stage 2, source: the exact amdgpu driver source of a kernel release, and finding places in it.

Takes a kernel release (or a path or URL). Leaves a verified tree of drivers/gpu/drm/amd whose version is the
kernel's, unpacked once and atomically into /var/cache/rdna1-kmgr/src/; packages from other suites are
fetched from the archive the system's apt uses (its URIs, keyrings, proxy) through a private apt state under
/var/cache/rdna1-kmgr/apt/, so no suite is ever added to the system's sources.
"""
