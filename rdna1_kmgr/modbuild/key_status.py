"""`keys status`: Secure Boot's state, the signing key pair, and whether its certificate is enrolled. Reads only."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.host import system_identity
from rdna1_kmgr.host.host_facts import detect
from rdna1_kmgr.modbuild import signing


@dataclass(frozen=True)
class KeyStatus:
    secure_boot_enabled: bool
    secure_boot_state: str
    pair: signing.KeyPair
    key_exists: bool
    key_private: bool  # readable by root only
    cert_exists: bool
    certificate: signing.CertificateInfo | None
    enrollment: str  # mokutil's answer, "no certificate", or "not asked (sysroot)"
    enroll_command: list[str]

    def to_json(self) -> dict:
        """The pair's fields sit beside the others (as `keys status --json` always had them)."""
        return {
            "secure_boot": {"enabled": self.secure_boot_enabled, "state": self.secure_boot_state},
            **self.pair.to_json(),
            "key_exists": self.key_exists,
            "key_private": self.key_private,
            "cert_exists": self.cert_exists,
            "certificate": self.certificate.to_json() if self.certificate is not None else None,
            "enrollment": self.enrollment,
            "enroll_command": self.enroll_command,
        }


def read(key: str | None, cert: str | None, root: Path) -> KeyStatus:
    """`key`, `cert`: the pair given (else the distribution's, under `root`)."""
    system = system_identity.read(root)
    pair = signing.resolve(key, cert, system.platform)
    facts = detect(root)
    key_file, cert_file = (pair.key, pair.cert) if key else (system.path(pair.key), system.path(pair.cert))
    return KeyStatus(
        secure_boot_enabled=facts.secure_boot_enabled,
        secure_boot_state=facts.secure_boot_state,
        pair=pair,
        key_exists=key_file.is_file(),
        key_private=key_file.is_file() and not key_file.stat().st_mode & 0o077,
        cert_exists=cert_file.is_file(),
        certificate=signing.certificate_info(cert_file) if cert_file.is_file() else None,
        # mokutil asks this machine's firmware: only meaningful for the running system.
        enrollment=(
            "no certificate"
            if not cert_file.is_file()
            else signing.enrollment(cert_file)
            if system.on_host
            else "not asked (sysroot)"
        ),
        enroll_command=signing.enroll_command(pair.cert, pair, root),
    )
