"""Compile probes: what the source text cannot settle, confirmed against the kernel's headers first.

The renderer proves from the driver tree that every name the series uses exists there, except the macros
the quirk code takes from the kernel's own headers (the manifest's `kernel_names`, declared in
kmod/common/common.toml), which a driver tree does not carry. Before the minutes-long compile, `build`
compiles one small file against the installed headers of the target kernel (kbuild, a single object)
that includes each macro's header and stops with `#error` naming any macro that is not defined: the
check AMD's amdgpu-dkms makes with its configure probes, for the few names this series needs.

Takes: a kernel release with its headers at /lib/modules/KREL/build, the manifest's kernel_names.
Leaves: nothing (the probe is built in a temporary folder).
"""

import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

from rdna1_kmgr.core import runner
from rdna1_kmgr.core.errors import BuildError

PROBE = "rdna1_kmgr_probe"
TIMEOUT = 300  # seconds; a single object, normally a few


def probe_source(kernel_names: Mapping[str, str]) -> str:
    """The probe's C: each macro's header included, an #error for each macro not defined."""
    headers = sorted(set(kernel_names.values()))
    lines = [
        "/* rdna1-kmgr compile probe: macros the RDNA1 series takes from the kernel's headers */",
        "#include <linux/module.h>",
    ]
    lines += [f"#include <{header}>" for header in headers]
    for name, header in sorted(kernel_names.items()):
        lines += ["", f"#ifndef {name}", f'#error "rdna1-kmgr probe: {name} is not defined by <{header}>"', "#endif"]
    lines += ["", 'MODULE_LICENSE("GPL");', ""]
    return "\n".join(lines)


def headers_dir(release: str) -> Path:
    return Path("/lib/modules") / release / "build"


def confirm(release: str, kernel_names: Mapping[str, str]) -> bool:
    """Compile the probe against KREL's headers; False when there are no headers to probe (nothing is
    claimed then), BuildError naming the first failed macro or header."""
    build = headers_dir(release)
    if not kernel_names or not (build / "Makefile").is_file():
        return False
    with tempfile.TemporaryDirectory(prefix="rdna1-kmgr-probe-") as tmp:
        (Path(tmp) / f"{PROBE}.c").write_text(probe_source(kernel_names))
        (Path(tmp) / "Kbuild").write_text(f"obj-m := {PROBE}.o\n")
        result = runner.run(
            ["make", "-C", str(build), f"M={tmp}", f"{PROBE}.o"],
            timeout=TIMEOUT,
            check=False,
            merge_stderr=True,
            error=BuildError,
            doing="the compile probe",
        )
    if result.returncode != 0:
        raise BuildError(
            f"compile probe against the headers of {release} failed: {_first_error(result.stdout)}",
            "these headers lack what the series needs; report it with the kernel's headers package",
        )
    return True


def _first_error(output: str) -> str:
    """The probe's own #error message, or the compiler's first error (a missing header is fatal)."""
    own = re.search(r"rdna1-kmgr probe: [^\"\n]*", output)
    if own:
        return own.group(0)
    first = re.search(r"^.*\berror: .*$", output, re.M)
    return first.group(0).strip() if first else runner.last_line(output)
