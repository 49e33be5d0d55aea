"""Shared setup for the DKMS, signing and build tests: isolated DKMS trees and a real kernel's headers."""

import glob
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import hellomod
import pytest

from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.modbuild import signing


def installed_releases() -> list[str]:
    """Kernel releases whose headers are installed here, oldest first, or skip."""
    builds = sorted(glob.glob("/lib/modules/*/build/Makefile"))
    if not builds:
        pytest.skip("no kernel headers installed (/lib/modules/*/build)")
    if shutil.which("dkms") is None:
        pytest.skip("dkms is not installed")
    return [Path(b).parent.parent.name for b in builds]


def installed_release() -> str:
    """A kernel release whose headers are installed here (the newest), or skip."""
    return installed_releases()[-1]


@dataclass
class Sandbox:
    """DKMS source/dkms trees, cache and log folders of one test, all under tmp_path."""

    root: Path
    trees: dkms.Trees
    cache: Path
    logs: Path
    keys: signing.KeyPair
    kernel: str

    def leftovers(self) -> list[str]:
        """Everything a build left in the DKMS trees and the cache (logs are meant to stay)."""
        found = []
        for folder in (self.trees.source, self.trees.dkms, self.cache):
            if folder.exists():
                found += [str(p) for p in folder.rglob("*")]
        return found

    @property
    def kernel_version(self) -> str:
        """The Linux version of the sandbox's kernel (6.1.192 for 6.1.0-56-amd64), from its package."""
        from rdna1_kmgr.source import kernel_source

        return str(kernel_source.upstream_version(kernel_source.debian_kernel_version(self.kernel)))

    def package(self, manifest: dict) -> dkms.Package:
        version = dkms.package_version(manifest["kernel_version"], manifest["patchset_sha256"])
        return dkms.Package("rdna1hello", version, hellomod.MODULE)


def make_sandbox(tmp_path: Path, monkeypatch, keys: signing.KeyPair, kernel: str | None = None) -> Sandbox:
    kernel = kernel or installed_release()
    trees = dkms.Trees(source=tmp_path / "usr-src", dkms=tmp_path / "var-lib-dkms")
    monkeypatch.setenv("RDNA1_KMGR_DKMS_SOURCE_TREE", str(trees.source))
    monkeypatch.setenv("RDNA1_KMGR_DKMS_TREE", str(trees.dkms))
    monkeypatch.setenv("RDNA1_KMGR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("RDNA1_KMGR_LOG", str(tmp_path / "log"))
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path / "state"))
    hellomod.write_tree(tmp_path / "tree")
    return Sandbox(tmp_path, trees, tmp_path / "cache", tmp_path / "log", keys, kernel)


def make_keys(folder: Path, subject: str = "rdna1-kmgr test key") -> signing.KeyPair:
    pair = signing.KeyPair(folder / "test.key", folder / "test.der", "given")
    signing.generate(pair, subject=subject, days=2)
    return pair


def sign_file_for(kernel: str) -> str:
    """The kernel's sign-file (Debian keeps it in linux-kbuild-X.Y)."""
    series = ".".join(kernel.split(".")[:2])  # 6.1.0-56-amd64 -> 6.1
    candidates = [f"/usr/lib/linux-kbuild-{series}/scripts/sign-file", f"/lib/modules/{kernel}/build/scripts/sign-file"]
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    pytest.skip(f"no sign-file for {kernel}")


def kbuild(tree: Path, kernel: str, location: str, make_vars: dict[str, str]) -> Path:
    """Build a module straight with kbuild (no DKMS); the .ko path."""
    args = [
        "make",
        "-C",
        f"/lib/modules/{kernel}/build",
        f"M={tree / location}",
        *(f"{k}={v}" for k, v in make_vars.items()),
        "modules",
    ]
    subprocess.run(args, check=True, capture_output=True)
    return next((tree / location).glob("*.ko"))
