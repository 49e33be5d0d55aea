"""An Ubuntu system as far as rdna1-kmgr reads one, made at test time: a sysroot (os-release, the running
kernel's release, /proc/version and /proc/version_signature) and a `linux-source-X.Y.0` package laid out like
Ubuntu's, served by a local file:// apt repository.

Ubuntu's linux-source-6.8.0 (version 6.8.0-48.48) holds /usr/src/linux-source-6.8.0/linux-source-6.8.0.tar.bz2
(top folder linux-source-6.8.0/) and a link /usr/src/linux-source-6.8.0.tar.bz2 to it. The package made here
has that layout and an Ubuntu version, and its tarball holds the real Debian amd subset the suite already
fetched (Makefile + drivers/gpu/drm/amd): real kernel source, never committed, Ubuntu's packaging around it.
"""

import subprocess
from pathlib import Path

from apt_fixtures import build_deb

OS_RELEASE = """PRETTY_NAME="Ubuntu 24.04.1 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.1 LTS (Noble Numbat)"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
UBUNTU_CODENAME=noble
"""


def ubuntu_sysroot(
    root: Path,
    release: str,
    version: str,
    upstream: str,
    flavour: str = "generic",
    update_secureboot_policy: bool = False,
) -> Path:
    """A tree with what says "Ubuntu noble, running kernel `release`, the build `version` of Linux `upstream`"."""
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc/os-release").write_text(OS_RELEASE)
    (root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/osrelease").write_text(release + "\n")
    abi = version.split("-")[1].split(".")[0]
    (root / "proc/version").write_text(
        f"Linux version {release} (buildd@ubuntu) (x86_64-linux-gnu-gcc-13 (Ubuntu 13.2.0-23ubuntu4) 13.2.0, "
        f"GNU ld (GNU Binutils for Ubuntu) 2.42) #{abi}-Ubuntu SMP PREEMPT_DYNAMIC Mon Sep 23 10:00:00 UTC 2024\n"
    )
    (root / "proc/version_signature").write_text(f"Ubuntu {version}-{flavour} {upstream}\n")
    if update_secureboot_policy:  # shim-signed's program: only its presence is read (dry runs)
        (root / "usr/sbin").mkdir(parents=True, exist_ok=True)
        (root / "usr/sbin/update-secureboot-policy").write_text("#!/bin/sh\n")
        (root / "usr/sbin/update-secureboot-policy").chmod(0o755)
    return root


def ubuntu_linux_source_deb(amd_tree: Path, out_dir: Path, base: str, version: str) -> Path:
    """linux-source-<base>_<version>_all.deb made from an unpacked amd subset, laid out like Ubuntu's."""
    name = f"linux-source-{base}"
    deb = out_dir / f"{name}_{version}_all.deb"
    if deb.is_file():
        return deb
    work = out_dir / f".work-{name}-{version}"
    subprocess.run(["rm", "-rf", str(work)], check=True)
    ball = work / "ball" / name
    ball.mkdir(parents=True)
    (ball / "Makefile").symlink_to(amd_tree / "Makefile")
    (ball / "drivers/gpu/drm").mkdir(parents=True)
    (ball / "drivers/gpu/drm/amd").symlink_to(amd_tree / "drivers/gpu/drm/amd")
    src = work / "pkg" / "usr/src" / name
    src.mkdir(parents=True)
    with open(src / f"{name}.tar.bz2", "wb") as out:
        tar = subprocess.Popen(
            ["tar", "-c", "-h", "--owner=0", "--group=0", "-C", str(work / "ball"), name], stdout=subprocess.PIPE
        )
        subprocess.run(["bzip2", "-1"], stdin=tar.stdout, stdout=out, check=True)
        assert tar.wait() == 0
    (work / "pkg/usr/src" / f"{name}.tar.bz2").symlink_to(f"{name}/{name}.tar.bz2")
    build_deb(
        work / "pkg",
        work / "out.deb",
        {
            "Package": name,
            "Source": "linux",
            "Version": version,
            "Architecture": "all",
            "Maintainer": "rdna1-kmgr tests <tests@localhost>",
            "Provides": f"linux-source, linux-source-{base.rsplit('.', 1)[0]}",
            "Depends": "binutils, bzip2",
            "Section": "devel",
            "Priority": "optional",
            "Description": f"Linux kernel source for version {base} with Ubuntu patches\n"
            " Test fixture: the amd subset of Debian's real source in Ubuntu's packaging.",
        },
        compress=False,
    )
    (work / "out.deb").rename(deb)
    subprocess.run(["rm", "-rf", str(work)], check=True)
    return deb
