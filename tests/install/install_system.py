"""Scratch systems for the install tests: the stand-in amdgpu built and signed through real DKMS (`pristine`), a
scratch system root with a "stock" amdgpu and the update-initramfs test double (`fake_tools`, `system`), and the
CLI run against them.

A helper module, not a test module: test_module_install, test_killed_install, test_install_quirks and test_dracut
import from it.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from dkms_helpers import installed_release, make_keys
from install_checks import system_hash, verdict_record
from sysfs_fixtures import FakeSysroot

from rdna1_kmgr.core import progress
from rdna1_kmgr.install import journal as jr
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.modbuild import package_build as kbuild
from rdna1_kmgr.modbuild import signing
from rdna1_kmgr.vm import verdict

CLI = Path(sys.executable).parent / "rdna1-kmgr"
AMD_TREE = "drivers/gpu/drm/amd"


STANDIN_MAKEFILE = "obj-m += amdgpu.o\n"
STANDIN_C = """\
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/pci.h>

static uint amdgpu_rdna1_quirks = 3;
module_param_named(rdna1_quirks, amdgpu_rdna1_quirks, uint, 0444);
MODULE_PARM_DESC(rdna1_quirks, "test stand-in for the RDNA1 quirk mask");
static bool amdgpu_rdna1_selftest;
module_param_named(rdna1_selftest, amdgpu_rdna1_selftest, bool, 0444);
MODULE_PARM_DESC(rdna1_selftest, "test stand-in");

static const struct pci_device_id standin_ids[] = {
	{ PCI_DEVICE(0x1002, 0x731F) },
	{ }
};
MODULE_DEVICE_TABLE(pci, standin_ids);

static int __init standin_init(void) { return 0; }
static void __exit standin_exit(void) { }
module_init(standin_init);
module_exit(standin_exit);
MODULE_DESCRIPTION("rdna1-kmgr test stand-in for amdgpu (%s)");
MODULE_LICENSE("GPL");
"""


FAKE_UPDATE_INITRAMFS = """\
#!/bin/sh
# Test double for initramfs-tools' update-initramfs -c -k KREL -b BOOTDIR on a scratch root (BOOTDIR's
# parent). Like mkinitramfs it copies the modules and modprobe.d into a staging tree, runs depmod there and
# packs it as a zstd cpio, which the real lsinitramfs and unmkinitramfs read. RDNA1_KMGR_TEST_INITRAMFS_STALE leaves
# updates/ out (an image whose index still gives the stock module).
set -e
while [ $# -gt 0 ]; do
    case "$1" in -k) krel=$2; shift ;; -b) boot=$2; shift ;; esac
    shift
done
root=$(dirname "$boot")
[ -z "$RDNA1_KMGR_TEST_INITRAMFS_SLEEP" ] || sleep "$RDNA1_KMGR_TEST_INITRAMFS_SLEEP"
if [ -n "$RDNA1_KMGR_TEST_INITRAMFS_FAIL" ]; then echo "E: the test asked this update-initramfs to fail" >&2; exit 1; fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib/modules" "$stage/etc"
cp -a "$root/lib/modules/$krel" "$stage/lib/modules/"
rm -f "$stage/lib/modules/$krel/build"
[ -z "$RDNA1_KMGR_TEST_INITRAMFS_STALE" ] || rm -rf "$stage/lib/modules/$krel/updates"
cp -a "$root/etc/modprobe.d" "$stage/etc/"
depmod -b "$stage" "$krel"
(cd "$stage" && find . -mindepth 1 | sed 's|^\\./||' | LC_ALL=C sort | cpio -o -H newc --quiet --reproducible) \\
    | zstd -q -c > "$boot/initrd.img-$krel.new"
mv "$boot/initrd.img-$krel.new" "$boot/initrd.img-$krel"
"""


def write_standin_tree(root: Path, flavour: str) -> Path:
    folder = root / AMD_TREE / "amdgpu"
    folder.mkdir(parents=True)
    (folder / "Makefile").write_text(STANDIN_MAKEFILE)
    (folder / "amdgpu.c").write_text(STANDIN_C % flavour)
    return root


def write_series(out: Path, kernel_version: str, tag: str) -> dict:
    """A render-shaped series with no patches and a manifest naming the quirk mask the module is built for."""
    out.mkdir(parents=True)
    (out / "series").write_text("")
    manifest = {
        "kernel_version": kernel_version,
        "quirks": [{"id": "coarse-mtype", "bit": 0}, {"id": "crat-mem", "bit": 1}],
        "quirks_mask": 3,
        "devices": ["0x731F"],
        "selftest_cases": 0,
        "patches": {},
        "patchset_sha256": hashlib.sha256(tag.encode()).hexdigest(),
    }
    (out / "manifest.json").write_text(json.dumps(manifest))
    return manifest


@dataclass
class Pristine:
    """DKMS trees with the stand-in built, and a snapshot to put them back to before each test."""

    base: Path
    kernel: str
    trees: dkms.Trees
    keys: signing.KeyPair
    package: dkms.Package
    module_sha256: str
    stock_module: Path
    env: dict

    def reset(self) -> None:
        for live, saved in ((self.trees.source, "src"), (self.trees.dkms, "dkms")):
            shutil.rmtree(live, ignore_errors=True)
            shutil.copytree(self.base / "snapshot" / saved, live, symlinks=True)


def build_standin(base: Path, kernel: str, trees: dkms.Trees, keys: signing.KeyPair, tag: str) -> dkms.Package:
    tree = write_standin_tree(base / f"tree-{tag}", tag)
    manifest = write_series(base / f"series-{tag}", "6.1.192", tag)
    package = dkms.Package(dkms.PACKAGE_NAME, dkms.package_version("6.1.192", manifest["patchset_sha256"]))
    log = open(base / f"build-{tag}.log", "w")
    with progress.reporting_to(log):
        kbuild.build_package(
            package,
            kernel,
            tree,
            [AMD_TREE],
            base / f"series-{tag}",
            keys,
            [0x731F],
            ["rdna1_quirks"],
            jobs=2,
            trees=trees,
        )
    return package


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Pristine:
    if os.geteuid() != 0:
        pytest.skip("dkms install and depmod on a scratch root still need root")
    kernel = installed_release()
    base = tmp_path_factory.mktemp("standin")
    env = {
        "RDNA1_KMGR_DKMS_SOURCE_TREE": str(base / "usr-src"),
        "RDNA1_KMGR_DKMS_TREE": str(base / "var-lib-dkms"),
        "RDNA1_KMGR_CACHE": str(base / "cache"),
        "RDNA1_KMGR_LOG": str(base / "log"),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        trees = dkms.Trees.from_env()
        (base / "keys").mkdir()
        keys = make_keys(base / "keys")
        package = build_standin(base, kernel, trees, keys, "v1")
        module = dkms.built_module(package, kernel, trees)
        # The "stock" amdgpu: the same source built straight with kbuild (unsigned, so other bytes).
        stock_tree = write_standin_tree(base / "stock", "stock")
        subprocess.run(
            ["make", "-C", f"/lib/modules/{kernel}/build", f"M={stock_tree / AMD_TREE / 'amdgpu'}", "modules"],
            check=True,
            capture_output=True,
        )
        (base / "snapshot").mkdir()
        shutil.copytree(trees.source, base / "snapshot" / "src", symlinks=True)
        shutil.copytree(trees.dkms, base / "snapshot" / "dkms", symlinks=True)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return Pristine(
        base, kernel, trees, keys, package, jr.sha256_file(module), stock_tree / AMD_TREE / "amdgpu" / "amdgpu.ko", env
    )


@dataclass
class FakeSystem:
    root: Path
    state: Path
    kernel: str
    pristine: Pristine
    env: dict = field(default_factory=dict)

    @property
    def cert_args(self) -> list[str]:
        return ["--cert", str(self.pristine.keys.cert)]

    def cli(self, *args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(CLI), *args], capture_output=True, text=True, env={**self.env, **(env or {})}, timeout=timeout
        )

    def popen(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        # A session of its own, so that a test can kill it with its children, as a power cut would.
        return subprocess.Popen(
            [str(CLI), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**self.env, **(env or {})},
            start_new_session=True,
        )

    def install(self, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return self.cli("install", "--kernel", self.kernel, "--yes", *self.cert_args, *extra, env=env)

    def rollback(self, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return self.cli("rollback", "--kernel", self.kernel, "--yes", *extra, env=env)

    def hash(self) -> dict:
        return system_hash(self.root, self.kernel)

    def resolves_to(self) -> Path | None:
        out = subprocess.run(
            ["modinfo", "-b", str(self.root), "-k", self.kernel, "-n", "amdgpu"], capture_output=True, text=True
        )
        return Path(out.stdout.strip()) if out.returncode == 0 else None

    @property
    def stock_path(self) -> Path:
        return self.root / "lib/modules" / self.kernel / "kernel" / AMD_TREE / "amdgpu/amdgpu.ko"

    @property
    def installed_path(self) -> Path:
        # DKMS keeps the built file's name: amdgpu.ko.xz for a kernel that compresses its modules (6.12).
        built = dkms.built_module(self.pristine.package, self.kernel, self.pristine.trees)
        return self.root / "lib/modules" / self.kernel / "updates/dkms" / built.name

    def write_verdict(self, sha256: str | None = None, kernel: str | None = None, result: str = "pass") -> Path:
        old = os.environ.get("RDNA1_KMGR_STATE")
        os.environ["RDNA1_KMGR_STATE"] = str(self.state)
        try:
            return verdict.write(verdict_record(sha256 or self.pristine.module_sha256, kernel or self.kernel, result))
        finally:
            if old is None:
                os.environ.pop("RDNA1_KMGR_STATE")
            else:
                os.environ["RDNA1_KMGR_STATE"] = old

    def dkms_states(self) -> list[tuple[str, str]]:
        return [
            (e.version, e.state) for e in dkms.status(dkms.PACKAGE_NAME, self.pristine.trees) if e.kernel == self.kernel
        ]

    def journal_kinds(self) -> list[str]:
        """The kinds of the journal's records, but for `program` (one per program a step started)."""
        path = self.state / "journal" / self.kernel / "journal.jsonl"
        kinds = [json.loads(line)["kind"] for line in path.read_text().splitlines()] if path.exists() else []
        return [kind for kind in kinds if kind != "program"]


def make_root(
    root: Path, kernel: str, stock: Path, bin_dir: Path, env: dict, with_initramfs: bool = True, with_image: bool = True
) -> None:
    FakeSysroot(root).kernel(kernel).os_release("debian", "12", "Debian GNU/Linux 12 (bookworm)")
    modules = root / "lib/modules" / kernel
    modules.mkdir(parents=True)
    (modules / "build").symlink_to(f"/lib/modules/{kernel}/build")
    if with_image:  # the image package's modules; without it, only the headers' build link is there
        (modules / "kernel" / AMD_TREE / "amdgpu").mkdir(parents=True)
        shutil.copy2(stock, modules / "kernel" / AMD_TREE / "amdgpu/amdgpu.ko")
        (modules / "modules.order").write_text(f"kernel/{AMD_TREE}/amdgpu/amdgpu.ko\n")
        subprocess.run(["depmod", "-b", str(root), kernel], check=True, capture_output=True)
    (root / "etc/modprobe.d").mkdir(parents=True)
    (root / "etc/modprobe.d/someone-elses.conf").write_text("options snd_hda_intel power_save=1\n")
    (root / "boot").mkdir()
    if with_image:  # the kernel itself installed, not only its headers
        (root / "boot" / f"vmlinuz-{kernel}").write_bytes(b"kernel image")
    if with_initramfs:
        subprocess.run(
            [str(bin_dir / "update-initramfs"), "-c", "-k", kernel, "-b", str(root / "boot")], check=True, env=env
        )


@pytest.fixture(scope="module")
def fake_tools(tmp_path_factory) -> Path:
    bin_dir = tmp_path_factory.mktemp("fakebin")
    script = bin_dir / "update-initramfs"
    script.write_text(FAKE_UPDATE_INITRAMFS)
    script.chmod(0o755)
    return bin_dir


def _new_system(tmp_path, monkeypatch, pristine, fake_tools, with_initramfs=True, with_image=True) -> FakeSystem:
    pristine.reset()
    root, state = tmp_path / "root", tmp_path / "state"
    env = {
        **os.environ,
        **pristine.env,
        "RDNA1_KMGR_ROOT": str(root),
        "RDNA1_KMGR_STATE": str(state),
        "PATH": f"{fake_tools}:{os.environ['PATH']}",
    }
    env.pop(jr.ABORT_ENV, None)
    for key in ("RDNA1_KMGR_ROOT", "RDNA1_KMGR_STATE", "PATH", *pristine.env):
        monkeypatch.setenv(key, env[key])
    make_root(root, pristine.kernel, pristine.stock_module, fake_tools, env, with_initramfs, with_image)
    return FakeSystem(root, state, pristine.kernel, pristine, env)


@pytest.fixture
def system(tmp_path, monkeypatch, pristine, fake_tools) -> FakeSystem:
    """A scratch system with the stand-in built (DKMS state `built`), a passing verdict for it, no install."""
    fs = _new_system(tmp_path, monkeypatch, pristine, fake_tools)
    fs.write_verdict()
    return fs


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("rdna1-kmgr: error: ")
    return lines[0]
