"""Stage doctor: the whole ROCm stack of this machine read for an RDNA1 board, and nothing changed.

Takes a sysroot (/ or a fixture tree), the invoking user (SUDO_USER when run through sudo) and Python
interpreters or venvs named by the user. Leaves a list of findings, each with what was seen, why it matters
for a gfx1010 board and what to do: the board and its driver (stock or rdna1 build, quirk mask in effect,
probe errors), KFD and device access, HSA_OVERRIDE_GFX_VERSION wherever it is set, which ROCm libraries
and PyTorch builds carry gfx1010 code objects (read from the offload bundles and code-object files
themselves, no ROCm tool needed), ROCm and kernel versions, BAR size and IOMMU mode, the installed profile.
Keeps no state.
"""
