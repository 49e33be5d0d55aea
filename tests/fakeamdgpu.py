"""A tiny module named amdgpu, built against real kernel headers in seconds, for VM tests of the plumbing.

It has the patched driver's two parameters and prints its init line and, with rdna1_selftest=1, the
selftest summary, so a real guest run of it can pass every check; its variants break one thing each
the way a bad build would. The real amdgpu (tests with `built_module_61`) proves the driver itself.
"""

import subprocess
from pathlib import Path

SOURCE = r"""
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/bug.h>

static bool rdna1_selftest;
module_param(rdna1_selftest, bool, 0444);
MODULE_PARM_DESC(rdna1_selftest, "print the selftest summary");
static uint rdna1_quirks = 3;
module_param(rdna1_quirks, uint, 0444);
MODULE_PARM_DESC(rdna1_quirks, "quirk bits");

static int __init fake_init(void)
{
	pr_info("[drm] amdgpu kernel modesetting enabled.\n");
	if (rdna1_selftest)
		pr_info("rdna1-kmgr selftest: %d passed, %d failed\n", PASSED, FAILED);
#ifdef WARN_AT_INIT
	WARN_ON(rdna1_quirks != 0);
#endif
	return 0;
}

static void __exit fake_exit(void)
{
}

module_init(fake_init);
module_exit(fake_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("rdna1-kmgr test stand-in for amdgpu");
"""

# variant -> extra compiler flags
VARIANTS = {
    "good": "-DPASSED=7 -DFAILED=0",
    "selftest-fails": "-DPASSED=6 -DFAILED=1",
    "warns": "-DPASSED=7 -DFAILED=0 -DWARN_AT_INIT",
}


def build(release: str, variant: str, workdir: Path) -> Path:
    """amdgpu.ko of `variant` for kernel `release` (its headers must be installed)."""
    folder = workdir / f"fake-amdgpu-{variant}-{release}"
    folder.mkdir(parents=True)
    (folder / "amdgpu.c").write_text(SOURCE)
    (folder / "Makefile").write_text(f"obj-m := amdgpu.o\nccflags-y := {VARIANTS[variant]}\n")
    proc = subprocess.run(
        ["make", "-C", f"/lib/modules/{release}/build", f"M={folder}", "modules"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"building the fake amdgpu ({variant}) failed:\n{proc.stdout}\n{proc.stderr}")
    return folder / "amdgpu.ko"
