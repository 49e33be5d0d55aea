"""The gate `install` checks before anything changes: a validly signed build, a passing VM verdict for exactly
its sha256 (or --skip-vm-check, said loudly and recorded), and with Secure Boot on, the certificate enrolled."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rdna1_kmgr.build import module_checks, signing
from rdna1_kmgr.core.errors import BuildError, KmgrError
from rdna1_kmgr.host import host_facts
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.vm import verdict

if TYPE_CHECKING:
    from rdna1_kmgr.install.module_install import Candidate


class InstallRefused(KmgrError):
    """The gate said no: no build, no passing verdict, a bad signature, Secure Boot without enrollment."""

    exit_code = 8


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
        raise InstallRefused(f"the signing certificate {cert} does not exist",
                             "give the one the build used with --cert; nothing was changed")
    try:
        module_checks.verify_signature(candidate.module, cert)
    except BuildError as err:
        raise InstallRefused(f"the built module {candidate.module} is not validly signed: {err.what}",
                             f"rebuild it with `rdna1-kmgr build --kernel {candidate.kernel}`, or give the "
                             "certificate it was signed with as --cert; nothing was changed") from None
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
                "nothing was changed")
    return Gate(cert, signer, vm_check, facts.secure_boot_state)


def _vm_check(candidate: Candidate, skip: bool) -> dict:
    """The passing verdict for exactly this module on this kernel; what stands in for it with --skip-vm-check."""
    short = candidate.sha256[:12]
    try:
        record = verdict.read(candidate.sha256)
    except (ValueError, OSError) as err:
        problem = f"its VM verdict record is unreadable ({err})"
        record = None
    else:
        problem = None
        if record is None:
            problem = f"there is no VM verdict for this module (sha256 {short}...)"
        elif record.module_sha256 != candidate.sha256:
            problem = f"the verdict record {verdict.record_path(candidate.sha256)} names another module " \
                      f"(sha256 {record.module_sha256[:12]}...)"
        elif record.kernel != candidate.kernel:
            problem = f"its VM verdict is for kernel {record.kernel}, not {candidate.kernel}"
        elif not record.passed:
            problem = f"its VM verdict is {record.verdict}: {record.reason}"
    if problem is None:
        return {"verdict": record.verdict, "mode": record.mode, "record": str(verdict.record_path(candidate.sha256))}
    if skip:
        return {"skipped": True, "why": problem}
    raise InstallRefused(f"refusing to install {candidate.package.ref} for {candidate.kernel}: {problem}",
                         f"run `rdna1-kmgr vm-test --kernel {candidate.kernel}` first (or, at your own risk, "
                         "--skip-vm-check); nothing was changed")


def loud_skip(gate: Gate) -> str:
    bar = "!" * 78
    return (f"{bar}\nrdna1-kmgr: WARNING: --skip-vm-check: installing WITHOUT a passing VM verdict "
            f"({gate.vm_check['why']}).\nrdna1-kmgr: This module was not proven in a VM; the journal records "
            f"that it was skipped.\n{bar}\n")
