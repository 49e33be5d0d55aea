"""Stage doctor: the whole ROCm stack of this machine read for an RDNA1 board, and nothing changed.

Takes a sysroot (/ or a fixture tree), the invoking user (SUDO_USER when run through sudo) and Python
interpreters or venvs named by the user. Leaves a list of findings, each with what was seen, why it matters
for a gfx1010 board and what to do, cheap checks before expensive ones: the board and its driver (stock or
rdna1 build, quirk mask in effect, probe errors), KFD and device access, HSA_OVERRIDE_GFX_VERSION wherever it
is set, which PyTorch builds and ROCm libraries carry gfx1010 code (read from offload bundles, code-object
files and TheRock's kpack archives themselves, no ROCm tool needed), TheRock's wheels and their device wheels,
the CWSR queue failure of kernels >= 6.12 with 2026 ROCm, mixed /opt/rocm stacks, MIOpen settings, the kpack
loader's settings (ROCM_KPACK_*), PCIe atomics, compute hangs, ROCm and kernel versions, BAR size and IOMMU
mode, the installed profile.
Keeps no state.
"""
