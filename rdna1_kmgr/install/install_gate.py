"""The install gate: what must hold before `install` changes anything, each refusal one line saying what to do.

A module build made for the kernel and validly signed (openssl, against the certificate), a passing VM
verdict for exactly its sha256 and kernel (or --skip-vm-check, loudly), with Secure Boot on that
certificate enrolled, the kernel installed (its modules, or its headers at least), no foreign amdgpu where
ours goes, and a modprobe.d file of ours or none.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core.errors import BuildError, Exit, KmgrError
from rdna1_kmgr.host import host_facts
from rdna1_kmgr.install import modprobe_conf
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.modbuild import module_checks, signing
from rdna1_kmgr.render.manifest import Manifest
from rdna1_kmgr.render.quirk_mask import PARAMETER, QuirkMask
from rdna1_kmgr.vm import verdict


class InstallRefused(KmgrError):
    """The gate said no: no build, no passing verdict, a bad signature, Secure Boot without enrollment."""

    exit_code = Exit.REFUSED


# --- what is installed -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """The built module to install."""

    package: dkms.Package
    kernel: str
    module: Path  # in the DKMS tree
    sha256: str
    quirks: QuirkMask | None  # rdna1_quirks for /etc/modprobe.d or GRUB (None: a build without the parameter)
    manifest: Manifest | None = None  # the render's manifest: which quirks the build carries, which it left out

    @property
    def module_name(self) -> str:
        return self.package.module.name

    @property
    def parameters(self) -> dict[str, str]:
        """The module's parameters as the journal and modprobe.d take them."""
        return {PARAMETER: str(self.quirks)} if self.quirks is not None else {}


@dataclass
class Gate:
    certificate: Path
    signer: str
    vm_check: dict  # {"verdict": "pass", "record": ..., "mode": ...} or {"skipped": True, ...}
    secure_boot: str

    @property
    def vm_skipped(self) -> bool:
        return bool(self.vm_check.get("skipped"))


def check_gate(candidate: Candidate, cert: Path, skip_vm_check: bool, root: TargetRoot) -> Gate:
    if not cert.is_file():
        raise InstallRefused(
            f"the signing certificate {cert} does not exist",
            "give the one the build used with --cert; nothing was changed",
        )
    try:
        module_checks.verify_signature(candidate.module, cert)
    except BuildError as err:
        raise InstallRefused(
            f"the built module {candidate.module} is not validly signed: {err.what}",
            f"rebuild it with `rdna1-kmgr build --kernel {candidate.kernel}`, or give the "
            "certificate it was signed with as --cert; nothing was changed",
        ) from None
    signer = " ".join(module_checks.modinfo_field(candidate.module, "signer"))
    vm_check = _vm_check(candidate, skip_vm_check)
    facts = host_facts.detect(root.path)
    if facts.secure_boot_enabled:
        enrolled = signing.enrollment(cert)
        if enrolled != "enrolled":
            raise InstallRefused(
                f"Secure Boot is on and the signing certificate {cert} is {enrolled}: the firmware would "
                "refuse the module",
                f"run `rdna1-kmgr keys enroll --cert {cert}` as root, choose a one-time password, reboot, pick "
                "'Enroll MOK' in the blue MOK Manager screen and type that password, then install again; "
                "nothing was changed",
            )
    return Gate(cert, signer, vm_check, facts.secure_boot_state)


def _vm_check(candidate: Candidate, skip: bool) -> dict:
    """The passing verdict for exactly this module on this kernel; what stands in for it with --skip-vm-check."""
    short = candidate.sha256[:12]
    problem: str | None
    try:
        record = verdict.read(candidate.sha256)
    except (ValueError, OSError) as err:
        problem = f"its VM verdict record is unreadable ({err})"
        record = None
    else:
        problem = None
        if record is None:
            problem = f"there is no VM verdict for this module (sha256 {short}...)"
        elif record.module_sha256 is None:  # a plumbing run's record: it tested no module
            problem = f"the verdict record {verdict.record_path(candidate.sha256)} names no module"
        elif record.module_sha256 != candidate.sha256:
            problem = (
                f"the verdict record {verdict.record_path(candidate.sha256)} names another module "
                f"(sha256 {record.module_sha256[:12]}...)"
            )
        elif record.kernel != candidate.kernel:
            problem = f"its VM verdict is for kernel {record.kernel}, not {candidate.kernel}"
        elif not record.passed:
            problem = f"its VM verdict is {record.verdict}: {record.reason}"
    if problem is None:
        assert record is not None, "no problem is found only in a record that was read"
        return {"verdict": record.verdict, "mode": record.mode, "record": str(verdict.record_path(candidate.sha256))}
    if skip:
        return {"skipped": True, "why": problem}
    raise InstallRefused(
        f"refusing to install {candidate.package.ref} for {candidate.kernel}: {problem}",
        f"run `rdna1-kmgr vm-test emulated --kernel {candidate.kernel}` first (or, at your own risk, "
        "--skip-vm-check); nothing was changed",
    )


def check_kernel_installed(kernel: str, root: TargetRoot) -> None:
    """Its modules, or its headers at least (a newcomer's distro kernel: the module waits for its image)."""
    modules = root.modules_dir(kernel)
    if not any(p.exists() for p in (modules / "kernel", modules / "modules.order", modules / "build")):
        raise InstallRefused(
            f"kernel {kernel} is not installed here ({modules} holds neither its modules nor " "its headers)",
            f"build for it first (`rdna1-kmgr build --kernel {kernel}`), or install "
            f"its image package (linux-image-{kernel}); nothing was changed",
        )


def installed_path(candidate: Candidate, root: TargetRoot) -> Path:
    """Where `dkms install` puts the module (DKMS keeps the built file's name, compressed or not)."""
    location = candidate.package.module.dest_location.strip("/")
    return root.modules_dir(candidate.kernel) / location / candidate.module.name


def check_no_foreign_module(candidate: Candidate, root: TargetRoot, trees: dkms.Trees) -> None:
    """A module where ours goes that no journal of ours accounts for would be overwritten: refuse."""
    dest = installed_path(candidate, root).parent
    pattern = re.compile(rf"^{re.escape(candidate.module_name)}\.ko(\.xz|\.zst|\.gz)?$")
    found = [p for p in dest.iterdir() if pattern.fullmatch(p.name)] if dest.is_dir() else []
    if not found:
        return
    # DKMS's kernel hook (`dkms autoinstall`, run when a kernel package is installed) may have put one of
    # our own builds there behind the journal's back.
    ours = (
        [
            e
            for e in dkms.status(candidate.package.name, trees)
            if e.kernel == candidate.kernel and e.state == "installed"
        ]
        if shutil.which("dkms")
        else []
    )
    if ours:
        raise InstallRefused(
            f"{candidate.package.name}/{ours[0].version} was installed for {candidate.kernel} outside "
            "rdna1-kmgr (by DKMS's kernel hook?), so there is no journal to roll it back with",
            f"undo it with `dkms uninstall -m {candidate.package.name} -v {ours[0].version} -k "
            f"{candidate.kernel}` and `depmod {candidate.kernel}`, then install again; nothing was changed",
        )
    raise InstallRefused(
        f"{found[0]} is already there, and not from rdna1-kmgr",
        "remove the package that installed it (see `dkms status`); nothing was changed",
    )


def check_conf_is_ours(root: TargetRoot) -> None:
    """The shared modprobe.d file is rewritten for every install: one rdna1-kmgr did not write is refused."""
    conf = modprobe_conf.path(root)
    if not modprobe_conf.is_ours(conf):
        raise InstallRefused(
            f"{conf} is there and was not written by rdna1-kmgr",
            "move it aside (rdna1-kmgr keeps its own parameters in that file); nothing was changed",
        )


def loud_skip(gate: Gate) -> str:
    bar = "!" * 78
    return (
        f"{bar}\nrdna1-kmgr: WARNING: --skip-vm-check: installing WITHOUT a passing VM verdict "
        f"({gate.vm_check['why']}).\nrdna1-kmgr: This module was not proven in a VM; the journal records "
        f"that it was skipped.\n{bar}\n"
    )
