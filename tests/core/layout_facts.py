"""Where the package under test lives and which of its Python files the layout rules read.

A helper module, not a test module: test_layout and test_exit_codes import from it.
"""

from pathlib import Path

import rdna1_kmgr

PACKAGE = Path(rdna1_kmgr.__file__).parent


def modules():
    return sorted(
        p for p in PACKAGE.rglob("*.py") if not {"kmod", "dkms", "qemu", "hooks"} & set(p.relative_to(PACKAGE).parts)
    )
