"""Stage 4, build+sign: a DKMS package of the rendered series, built, signed and checked.

Takes a kernel release and a rendered series. Leaves a signed amdgpu.ko in the DKMS tree
(/var/lib/dkms/rdna1-amdgpu/<version>/<kernel>/), its package under /usr/src, a persistent kbuild tree per
kernel in /var/cache/rdna1-kmgr/kbuild/ and the build log in /var/log/rdna1-kmgr/; the module's vermagic,
signature, parameters and aliases are verified before it is handed on.
"""
