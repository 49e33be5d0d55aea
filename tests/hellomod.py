"""A tiny out-of-tree module in a kernel-shaped tree, packaged through the same code as amdgpu.

It builds against the installed headers in seconds, so the tests can drive real DKMS, real kbuild,
real sign-file and real openssl through every path (add, build, sign, verify, reuse, remove, and
each failure) without the minutes of a full amdgpu build. Like the patched amdgpu it has an
`rdna1_*` parameter and a PCI id table naming 1002:731F.
"""

import hashlib
import json
from pathlib import Path

from rdna1_kmgr.modbuild.dkms_package import ModuleSpec

LOCATION = "drivers/misc/rdna1hello"
MODULE = ModuleSpec(name="rdna1hello", location=LOCATION, make_vars=(("RDNA1HELLO_ROOT", "drivers/misc"),))

MAKEFILE = """\
# RDNA1HELLO_ROOT plays FULL_AMD_PATH's part: a folder the build must be told about out of tree.
ccflags-y := -I$(RDNA1HELLO_ROOT)/rdna1hello/include
obj-m += rdna1hello.o
rdna1hello-y := main.o table.o
"""

HEADER = """\
#ifndef RDNA1HELLO_H
#define RDNA1HELLO_H
extern const char *rdna1hello_greeting(void);
#endif
"""

MAIN_C = """\
#include <linux/module.h>
#include <linux/moduleparam.h>
#include "rdna1hello.h"

static bool rdna1_hello_enable = true;
module_param(rdna1_hello_enable, bool, 0444);
MODULE_PARM_DESC(rdna1_hello_enable, "say hello (default: true)");

static int __init rdna1hello_init(void)
{
	if (rdna1_hello_enable)
		pr_info("rdna1hello: %s\\n", rdna1hello_greeting());
	return 0;
}

static void __exit rdna1hello_exit(void)
{
}

module_init(rdna1hello_init);
module_exit(rdna1hello_exit);
MODULE_DESCRIPTION("rdna1-kmgr test module");
MODULE_LICENSE("GPL");
"""

TABLE_C = """\
#include <linux/module.h>
#include <linux/pci.h>
#include "rdna1hello.h"

static const struct pci_device_id rdna1hello_ids[] = {
	{ PCI_DEVICE(0x1002, 0x731F) },
	{ }
};
MODULE_DEVICE_TABLE(pci, rdna1hello_ids);

const char *rdna1hello_greeting(void)
{
	return "hello";
}
"""


def write_tree(root: Path) -> Path:
    """The pristine tree, from its root like a kernel source."""
    folder = root / LOCATION
    (folder / "include").mkdir(parents=True)
    (folder / "Makefile").write_text(MAKEFILE)
    (folder / "include" / "rdna1hello.h").write_text(HEADER)
    (folder / "main.c").write_text(MAIN_C)
    (folder / "table.c").write_text(TABLE_C)
    return root


def greeting_patch(word: str) -> str:
    """A patch for `patch -p1` from the tree root that changes only table.c."""
    return (
        f"--- a/{LOCATION}/table.c\n"
        f"+++ b/{LOCATION}/table.c\n"
        "@@ -10,5 +10,5 @@\n"
        " \n"
        " const char *rdna1hello_greeting(void)\n"
        " {\n"
        '-\treturn "hello";\n'
        f'+\treturn "{word}";\n'
        " }\n"
    )


BROKEN_C_PATCH = (
    f"--- a/{LOCATION}/table.c\n"
    f"+++ b/{LOCATION}/table.c\n"
    "@@ -10,5 +10,5 @@\n"
    " \n"
    " const char *rdna1hello_greeting(void)\n"
    " {\n"
    '-\treturn "hello";\n'
    '+\treturn "hello"\n'
    " }\n"
)

NOT_APPLYING_PATCH = (
    f"--- a/{LOCATION}/table.c\n"
    f"+++ b/{LOCATION}/table.c\n"
    "@@ -10,5 +10,5 @@\n"
    " \n"
    " const char *rdna1hello_greeting(void)\n"
    " {\n"
    '-\treturn "this line is not in the file";\n'
    '+\treturn "hi";\n'
    " }\n"
)


def write_series(out: Path, patches: dict[str, str], kernel_version: str = "6.1.192") -> dict:
    """A series directory shaped like render()'s output: series, NNNN-*.patch, manifest.json."""
    out.mkdir(parents=True)
    digests = {}
    for name, text in patches.items():
        (out / name).write_text(text)
        digests[name] = hashlib.sha256(text.encode()).hexdigest()
    (out / "series").write_text("".join(n + "\n" for n in patches))
    patchset = hashlib.sha256("".join(f"{n} {d}\n" for n, d in digests.items()).encode()).hexdigest()
    manifest = {
        "kernel_version": kernel_version,
        "quirks": ["hello"],
        "devices": ["0x731F"],
        "renderer_version": "test",
        "patches": digests,
        "patchset_sha256": patchset,
        "selftest_cases": [],
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest
