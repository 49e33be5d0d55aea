"""`rdna1-kmgr follow removed KREL`: a removed kernel's rdna1-kmgr state goes with it.

Run by /etc/kernel/postrm.d/rdna1-kmgr after the kernel package removed /lib/modules/KREL's own files and
initramfs-tools removed /boot/initrd.img-KREL. A rollback would be wrong here: it would put the kernel's old
module index and initramfs back for a kernel that is gone. Instead, each of these goes:

    dkms       every rdna1-amdgpu version built or installed for KREL (`dkms remove -k KREL`; a version's
               source under /usr/src goes when no other kernel uses it); DKMS's own prerm hook may have
               removed an installed one already
    files      what the journal's install created below /lib/modules/KREL and /boot that is still there
    shared     the files every kernel's install shares (the boot guard's, the stock loader's) that it wrote:
               its backup of each goes to the next later install that wrote it again, or the file is put
               back as the install found it when none did (install/shared_files.py)
    modprobe.d /etc/modprobe.d/rdna1-kmgr.conf rewritten for the kernels still installed (removed after the last)
    journal    closed with a `kernel-removed` record and moved to the history; its backups are dropped
    kbuild     the kernel's persistent kbuild tree under /var/cache/rdna1-kmgr/kbuild/
    guest      the kernel's image and modules vm-test unpacked under /var/cache/rdna1-kmgr/kernels/
    source     the kernel's source unpacked under /var/cache/rdna1-kmgr/src/, unless a package left is built
               from the same Linux version (one source serves every ABI of a point release: it stays while
               one of them has a build)
    records    follow/<KREL>.json, its pending marker, and the VM verdicts recorded for KREL
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from rdna1_kmgr.core import progress, user_input
from rdna1_kmgr.core.errors import KmgrError
from rdna1_kmgr.core.paths import cache_dir
from rdna1_kmgr.follow import follow_record
from rdna1_kmgr.install import modprobe_conf, shared_files
from rdna1_kmgr.install.journal import Journal, locked, remove_created_dirs
from rdna1_kmgr.install.journal_records import KernelRemoved, WasAbsent
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.source import kernel_source
from rdna1_kmgr.vm import guest_kernel, verdict


def _dkms_entries(kernel: str, trees: dkms.Trees) -> list:
    if not shutil.which("dkms"):
        return []
    return [e for e in dkms.status(dkms.PACKAGE_NAME, trees) if e.kernel == kernel]


def _verdicts_for(kernel: str) -> list[Path]:
    found = []
    folder = verdict.validations_dir()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = verdict.read(path.stem)
        except (ValueError, OSError):
            continue
        if record is not None and record.kernel == kernel:
            found.append(path)
    return found


def _kernels_own(kernel: str, root: TargetRoot) -> Callable[[Path], bool]:
    """Whether a path is the kernel's own: under /lib/modules/KREL or below /boot (its initramfs; GRUB's
    environment and folders are the boot's, not the kernel's, unless the name says the kernel)."""
    return lambda path: path.is_relative_to(root.modules_dir(kernel)) or (
        path.is_relative_to(root.boot_dir) and (path.parent != root.boot_dir or kernel in path.name)
    )


def _journal_files(journal: Journal, root: TargetRoot) -> tuple[list[Path], list[str]]:
    """Files the install created (absent before it) under the kernel's own folders, and the folders it made."""
    if not journal.exists():
        return [], []
    own = _kernels_own(journal.kernel, root)
    files: list[Path] = []
    dirs: list[str] = []
    for step in journal.state().steps:
        for entry in step.intent.backups:
            path = Path(entry.path)
            if isinstance(entry, WasAbsent) and own(path) and path.exists():
                files.append(path)
        dirs += step.intent.dirs
    return files, dirs


def _packages(kernel: str, journal: Journal, trees: dkms.Trees) -> list[tuple[dkms.Package, dkms.Trees]]:
    """The rdna1-amdgpu versions DKMS has for the kernel, and the one its journal installed."""
    found = {e.version: trees for e in _dkms_entries(kernel, trees)}
    try:
        installed = journal.state().install if journal.exists() else None
    except KmgrError:
        installed = None
    if installed and installed.package and installed.package.name == dkms.PACKAGE_NAME and shutil.which("dkms"):
        found.setdefault(installed.package.version, installed.trees or trees)
    return [(dkms.Package(dkms.PACKAGE_NAME, version), where) for version, where in sorted(found.items())]


def plan(kernel: str) -> list[str]:
    kernel = user_input.kernel_release(kernel)
    root, trees = TargetRoot.from_env(), dkms.Trees.from_env()
    journal = Journal(kernel)
    lines = [f"{kernel} was removed: drop what rdna1-kmgr kept for it"]
    for package, package_trees in _packages(kernel, journal, trees):
        lines.append(
            f"  {' '.join(dkms.command(dkms.remove_args(package, kernel), package_trees))}   (if DKMS "
            f"lists it; {package.source_dir(package_trees)} too when no other kernel uses it)"
        )
    files, dirs = _journal_files(journal, root)
    lines += [f"  remove {path}" for path in files]
    lines += [f"  remove the directory {d} (if empty)" for d in dirs]
    if journal.exists():
        lines += shared_files.plan(journal, shared_files.of_removed(journal, _kernels_own(kernel, root)))
        lines.append(f"  {modprobe_conf.undo_plan(modprobe_conf.path(root), kernel)}")
        lines.append(f"  close the journal {journal.path} and move it to the history")
    kbuild = dkms.kbuild_root(dkms.PACKAGE_NAME) / kernel
    if kbuild.exists():
        lines.append(f"  remove the kbuild tree {kbuild}")
    guest = guest_kernel.cached_root(kernel)
    if guest.exists():
        lines.append(f"  remove the guest kernel {guest}")
    lines.append(f"  remove its kernel source under {cache_dir() / 'src'} unless a package left uses it")
    lines += [f"  remove the VM verdict {path}" for path in _verdicts_for(kernel)]
    if follow_record.read(kernel) is not None or kernel in follow_record.pending():
        lines.append(f"  remove the follow record of {kernel}")
    return lines


def forget(kernel: str) -> list[str]:
    """Drop everything rdna1-kmgr kept for a removed kernel; what it did."""
    kernel = user_input.kernel_release(kernel)
    root, trees = TargetRoot.from_env(), dkms.Trees.from_env()
    said = []
    with locked(f"follow removed {kernel}"):
        journal = Journal(kernel)
        packages = _packages(kernel, journal, trees)
        for package, package_trees in packages:
            # Idempotent: DKMS's own prerm hook may have removed an installed version for this kernel already;
            # the version's source under /usr/src then still goes, unless another kernel uses it.
            dkms.remove(package, package_trees, kernel)
            said.append(f"removed the DKMS package {package.ref} for {kernel}")
        try:
            files, dirs = _journal_files(journal, root)
            shared = shared_files.of_removed(journal, _kernels_own(kernel, root)) if journal.exists() else []
        except KmgrError as err:  # a corrupted journal: nothing of it is trusted, the journal goes below
            files, dirs, shared = [], [], []
            said.append(f"not reading the journal of {kernel}: {err.what}")
        said += shared_files.release(journal, shared)
        for path in files:
            path.unlink(missing_ok=True)
            said.append(f"removed {path}")
        said += [f"removed the directory {d}" for d in remove_created_dirs(dirs)]
        if journal.exists():
            said.append(modprobe_conf.sync(modprobe_conf.path(root), exclude=kernel))
            try:
                journal.append(KernelRemoved())
            except KmgrError:
                pass  # a corrupted journal cannot take a record; it is archived as it is
            said.append(f"journal of {kernel} moved to {journal.archive()}")
        kbuild = dkms.kbuild_root(dkms.PACKAGE_NAME) / kernel
        if kbuild.exists():
            shutil.rmtree(kbuild)
            said.append(f"removed the kbuild tree {kbuild}")
        guest = guest_kernel.cached_root(kernel)
        if guest.exists():
            shutil.rmtree(guest)
            said.append(f"removed the guest kernel {guest}")
        left = {dkms.linux_version_of(p.version) for p in dkms.source_packages(dkms.PACKAGE_NAME, trees)}
        gone = {dkms.linux_version_of(package.version) for package, _ in packages} - left
        for tree in kernel_source.remove_sources_of(gone):
            said.append(f"removed the kernel source {tree}: no package left is built from it")
        for path in _verdicts_for(kernel):
            path.unlink()
            said.append(f"removed the VM verdict {path}")
        if follow_record.forget(kernel):
            said.append(f"removed the follow record of {kernel}")
    for line in said:
        progress.say(f"rdna1-kmgr: {line}")
    return said
