"""Fedora's kernel source: the SRPM of exactly the running `kernel-<version>-<release>`, unpacked.

Fedora builds `kernel-6.11.4-301.fc41` (uname -r 6.11.4-301.fc41.x86_64) from the upstream tarball
(Source0, linux-6.11.4.tar.xz) plus one patch of its own (patch-6.11-redhat.patch, applied by the spec's
%prep with `patch -p1`). `dnf download --source kernel-6.11.4-301.fc41` fetches the SRPM; rpm2cpio opens it.
Here the tarball's amd subset is unpacked as for any tarball, then the parts of Fedora's patch that touch
that subset are applied to it (the rest of the patch has no file to apply to), and the version the SRPM's
header names must be the tree's.

Proven here on an SRPM built at test time with Debian's rpm tools; `dnf download` itself is written, not
run (no Fedora archive is reachable from this machine).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from rdna1_kmgr.core import cache_entry, runner
from rdna1_kmgr.core.errors import SourceError, UsageError
from rdna1_kmgr.core.files import write_json
from rdna1_kmgr.core.paths import cache_dir
from rdna1_kmgr.core.progress import say
from rdna1_kmgr.source.kernel_source import AMD_SUBSET, ORIGIN_FILE, kernel_version, unpack_amd_subset

# uname -r of a Fedora kernel: 6.11.4-301.fc41.x86_64
_RELEASE = re.compile(r"^(\d+\.\d+\.\d+)-(\d+\.fc\d+)\.([a-z0-9_]+)$")
_TARBALL = re.compile(r"^linux-\d+\.\d+(\.\d+)?(-rc\d+)?\.tar\.(xz|gz|bz2)$")
_REDHAT_PATCH = re.compile(r"^patch-\d+\.\d+\S*-redhat\.patch$")


@dataclass(frozen=True)
class FedoraKernel:
    version: str  # 6.11.4
    release: str  # 301.fc41

    @property
    def nvr(self) -> str:
        return f"kernel-{self.version}-{self.release}"

    def download_command(self) -> list[str]:
        """What fetches its SRPM on Fedora (written, not run here)."""
        return ["dnf", "download", "--source", self.nvr]


def fedora_kernel(krel: str) -> FedoraKernel | None:
    match = _RELEASE.fullmatch(krel)
    return FedoraKernel(match.group(1), match.group(2)) if match else None


def srpm_identity(srpm: Path) -> tuple[str, str, str]:
    """(name, version, release) from the SRPM's header."""
    out = runner.run(
        ["rpm", "-qp", "--nosignature", "--qf", "%{NAME}\\t%{VERSION}\\t%{RELEASE}\\n", str(srpm)],
        error=SourceError,
        doing=f"reading {srpm.name}",
        hint="is it a source RPM?",
    ).stdout
    fields = out.strip().split("\t")
    if len(fields) != 3:
        raise SourceError(f"{srpm} has no name, version and release rpm can read", "is it a source RPM?")
    return fields[0], fields[1], fields[2]


def check_signature(srpm: Path) -> str:
    """`rpm -Kv` on the SRPM: a digest or signature that does not verify is refused (SourceError); a signature
    whose key is not in rpm's keyring (Fedora's keys imported: `rpm --import
    /etc/pki/rpm-gpg/RPM-GPG-KEY-fedora-*`), or no signature, is said, since then nothing vouches for it
    but where the file came from. What was found, in one line."""
    result = runner.run(["rpm", "-Kv", str(srpm)], check=False, timeout=300)
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    bad = [line for line in lines if line.endswith(": BAD") or " BAD" in line]
    if bad or (result.returncode != 0 and not any(line.endswith("NOKEY") for line in lines)):
        raise SourceError(
            f"{srpm.name} does not verify: {(bad or lines or [f'rpm -K exit status {result.returncode}'])[0]}",
            "nothing was unpacked; download it again (`dnf download --source`)",
        )
    if any(line.endswith("NOKEY") for line in lines):
        return f"the signature of {srpm.name} was not checked: its key is not in rpm's keyring (import Fedora's)"
    if not any("Signature" in line for line in lines):
        return f"{srpm.name} is not signed: its digests match, nothing vouches for where it came from"
    return f"the signature of {srpm.name} verifies against rpm's keyring"


def unpack_srpm(srpm: Path, dest_root: Path | None = None) -> Path:
    """The amd subset of a kernel SRPM's tarball with Fedora's patch applied, in dest_root (default
    cache_dir()/src) as <version>-<release>; an earlier unpack is reused."""
    srpm = Path(srpm)
    if not srpm.is_file():
        raise UsageError(f"{srpm}: no such file", "give a kernel-*.src.rpm")
    name, version, release = srpm_identity(srpm)
    if name != "kernel":
        raise SourceError(f"{srpm.name} is the source of {name}, not of the kernel", "give a kernel-*.src.rpm")
    say(check_signature(srpm))
    dest_root = Path(dest_root) if dest_root is not None else cache_dir() / "src"
    dest_root.mkdir(parents=True, exist_ok=True)
    key = f"{version}-{release}"
    with cache_entry.exclusive(dest_root, key):
        if (dest_root / key / ORIGIN_FILE).is_file():
            return dest_root / key
        with cache_entry.staging(dest_root, key) as tmp:
            files = _rpm2cpio(srpm, tmp / "srpm")
            tarball = _one(files, _TARBALL, srpm, "upstream tarball (linux-X.Y.Z.tar.xz)")
            patch = _one(files, _REDHAT_PATCH, srpm, "Fedora patch (patch-X.Y-redhat.patch)")
            tree = unpack_amd_subset(tarball, tmp / "unpacked")
            applied = apply_subset_patch(tree, patch)
            if kernel_version(tree) != Version(version):
                raise SourceError(
                    f"{srpm.name} is kernel {version} but its Makefile says Linux {kernel_version(tree)}",
                    "the SRPM is not what its header says",
                )
            origin = {
                "archive": srpm.name,
                "package": name,
                "rpm_version": key,
                "kernel_version": version,
                "tarball": tarball.name,
                "patch": patch.name,
                "patched_files": applied,
                "subset": list(AMD_SUBSET),
            }
            write_json(tree / ORIGIN_FILE, origin, indent=2, sort_keys=True)
            return cache_entry.publish(tree, dest_root / key)


def subset_sections(patch_text: str) -> tuple[str, list[str]]:
    """The parts of a git-style patch that change files of AMD_SUBSET, and those files."""
    sections = re.split(r"(?m)^(?=diff --git )", patch_text)
    kept, files = [], []
    for section in sections:
        match = re.match(r"diff --git a/(\S+) b/\S+", section)
        if match and any(match.group(1) == part or match.group(1).startswith(part + "/") for part in AMD_SUBSET):
            kept.append(section)
            files.append(match.group(1))
    return "".join(kept), files


def apply_subset_patch(tree: Path, patch: Path) -> list[str]:
    """Apply the subset's part of `patch` to `tree` with patch -p1; the files it changed."""
    text, files = subset_sections(patch.read_text(errors="surrogateescape"))
    if files:
        runner.run(
            ["patch", "-p1", "--batch", "--forward", "--quiet", "-d", str(tree)],
            input=text,
            error=SourceError,
            doing=f"applying {patch.name} to the amd subset",
            hint="the patch does not fit the tarball it came with; fetch the SRPM again",
        )
    return files


def _rpm2cpio(srpm: Path, dest: Path) -> list[Path]:
    dest.mkdir(parents=True)
    archive = runner.run(
        ["rpm2cpio", str(srpm)],
        text=False,
        error=SourceError,
        timeout=600,
        doing=f"rpm2cpio {srpm.name}",
        hint="install rpm2cpio",
    ).stdout
    runner.run(
        ["cpio", "-idm", "--quiet", "--no-absolute-filenames"],
        input=archive,
        text=False,
        cwd=dest,
        error=SourceError,
        doing=f"unpacking {srpm.name}",
        timeout=600,
    )
    return sorted(p for p in dest.iterdir() if p.is_file())


def _one(files: list[Path], pattern: re.Pattern, srpm: Path, what: str) -> Path:
    found = [p for p in files if pattern.fullmatch(p.name)]
    if len(found) != 1:
        raise SourceError(
            f"{srpm.name} holds {len(found)} files that look like the {what}", "is it Fedora's kernel SRPM?"
        )
    return found[0]
