"""The module-signing key pair: which one DKMS uses, making one, and whether the firmware trusts it.

The distribution's convention (what its DKMS signs with when told nothing) comes from its Platform record
(host/platforms.toml's key pairs: Debian's and DKMS's own /var/lib/dkms/mok.key + mok.pub, Ubuntu's
shim-signed MOK.priv + MOK.der, Fedora's akmods pair),
or a pair the user names with --key/--cert. The private key stays where it is: DKMS reads it in
place (we pass its path), it is never copied into the DKMS tree, and a key others can read is
refused.
"""

from __future__ import annotations

import os
import re
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core import runner, trust
from rdna1_kmgr.core.errors import HostError, UsageError
from rdna1_kmgr.core.files import move_into_place
from rdna1_kmgr.host import system_identity
from rdna1_kmgr.host.platform import Platform


@dataclass(frozen=True)
class KeyPair:
    key: Path
    cert: Path
    convention: str  # the distribution's convention (debian, ubuntu, fedora), or given
    enroll: str = "mokutil"  # the program that queues the certificate (see enroll_command)

    def to_json(self) -> dict:
        return {"key": str(self.key), "cert": str(self.cert), "convention": self.convention}


# What a MOK for kernel modules should say: not a CA, for signatures, and the OID that shim and the
# kernel read as "module signing only" (the same extensions Ubuntu's update-secureboot-policy uses).
_MOK_EXTENSIONS = (
    "basicConstraints=critical,CA:FALSE",
    "keyUsage=digitalSignature",
    "extendedKeyUsage=codeSigning,1.3.6.1.4.1.2312.16.1.2",
    "subjectKeyIdentifier=hash",
)
DEFAULT_SUBJECT = "rdna1-kmgr module signing key"


def convention(platform: Platform | None = None) -> KeyPair:
    """The pair the distribution's DKMS signs with (this system's by default)."""
    pair = (platform or system_identity.read().platform).key_pair
    return KeyPair(pair.key, pair.cert, pair.name, pair.enroll)


def resolve(key: str | Path | None = None, cert: str | Path | None = None, platform: Platform | None = None) -> KeyPair:
    """--key/--cert when given (both or neither), else the convention of the distro (this one's by default)."""
    if (key is None) != (cert is None):
        raise UsageError("--key and --cert go together", "give both, or neither to use the distro's DKMS key")
    if key is None or cert is None:
        return convention(platform)
    return KeyPair(Path(key).absolute(), Path(cert).absolute(), "given")


def check_usable(pair: KeyPair) -> None:
    """The pair exists and the private key is its user's alone: owned by the user running the tool (root),
    not readable by anyone else, in folders only that user (or root) can change (issue 40, M5: a key another
    user owns or can swap signs whatever that user wants)."""
    for path, what in ((pair.key, "signing key"), (pair.cert, "certificate")):
        if not path.is_file():
            hint = "run `rdna1-kmgr keys generate`" if pair.convention != "given" else "check the path"
            raise HostError(f"{what} {path} does not exist", hint)
    if pair.key.is_symlink():
        raise HostError(f"signing key {pair.key} is a symbolic link", "give the key file itself")
    info = pair.key.stat()
    mode = info.st_mode & 0o777
    if mode & 0o077:
        raise HostError(
            f"signing key {pair.key} is readable by others (mode {mode:04o})", f"run `chmod 600 {pair.key}`"
        )
    if info.st_uid != os.geteuid():
        raise HostError(
            f"signing key {pair.key} is owned by uid {info.st_uid}, not by uid {os.geteuid()} which signs with it",
            f"run `chown root:root {pair.key}` if the key is yours, else make a new one",
        )
    problem = trust.root_problem(pair.key.parent.absolute())
    if problem:
        raise HostError(f"signing key {pair.key} is in an unsafe folder: {problem}", "keep it in root's folders")


def ensure(pair: KeyPair) -> bool:
    """Make the distro's pair when neither half exists yet (as DKMS itself would); True if made."""
    if pair.convention != "given" and not pair.key.exists() and not pair.cert.exists():
        generate(pair)
        return True
    check_usable(pair)
    return False


def generate(pair: KeyPair, subject: str = DEFAULT_SUBJECT, days: int = 36500, force: bool = False) -> None:
    """A new RSA key (mode 0600, in a folder no one else can enter if we create it) and its DER certificate."""
    if not force and (pair.key.exists() or pair.cert.exists()):
        raise UsageError(
            f"{pair.key if pair.key.exists() else pair.cert} already exists",
            "keep it (a new key must be enrolled again), or pass --force to replace it",
        )
    for folder in {pair.key.parent, pair.cert.parent}:
        if not folder.exists():
            folder.mkdir(parents=True, mode=0o700)
    # Written under temporary names in the same folders, then renamed, so a failure leaves no half pair;
    # the umask makes the key 0600 from its first byte.
    key_tmp = pair.key.with_name(f".{pair.key.name}.new-{os.getpid()}")
    cert_tmp = pair.cert.with_name(f".{pair.cert.name}.new-{os.getpid()}")
    old_umask = os.umask(0o077)
    try:
        command = [
            "openssl",
            "req",
            "-new",
            "-x509",
            "-nodes",
            "-utf8",
            "-sha256",
            "-days",
            str(days),
            "-subj",
            f"/CN={subject}",
            "-newkey",
            "rsa:2048",
            "-keyout",
            str(key_tmp),
            "-outform",
            "DER",
            "-out",
            str(cert_tmp),
        ]
        for ext in _MOK_EXTENSIONS:
            command += ["-addext", ext]
        runner.run(command, doing="openssl making a key pair")
        os.chmod(key_tmp, 0o600)
        os.chmod(cert_tmp, 0o644)
        move_into_place(key_tmp, pair.key)
        move_into_place(cert_tmp, pair.cert)
    finally:
        os.umask(old_umask)
        key_tmp.unlink(missing_ok=True)
        cert_tmp.unlink(missing_ok=True)


# --- the certificate ---------------------------------------------------------------------------


def certificate_pem(cert: Path) -> str:
    """The certificate as PEM whichever way it is stored (DKMS and shim keep DER)."""
    data = cert.read_bytes()
    if b"-----BEGIN CERTIFICATE-----" in data:
        return data.decode()
    return ssl.DER_cert_to_PEM_cert(data)


@dataclass(frozen=True)
class CertificateInfo:
    subject: str  # the CN: what modinfo shows as `signer`
    sha1_fingerprint: str  # what mokutil lists
    not_after: str

    def to_json(self) -> dict:
        return {"subject": self.subject, "sha1_fingerprint": self.sha1_fingerprint, "not_after": self.not_after}


def certificate_info(cert: Path) -> CertificateInfo:
    with tempfile.NamedTemporaryFile("w", suffix=".pem") as pem:
        pem.write(certificate_pem(cert))
        pem.flush()
        result = runner.run(
            [
                "openssl",
                "x509",
                "-in",
                pem.name,
                "-noout",
                "-subject",
                "-nameopt",
                "multiline",
                "-fingerprint",
                "-sha1",
                "-enddate",
            ],
            check=False,
        )
    if result.returncode != 0:
        raise HostError(f"{cert} is not a certificate openssl can read", _first_line(result.stderr))
    cn = re.search(r"^\s*commonName\s*=\s*(.+)$", result.stdout, re.MULTILINE)
    fp = re.search(r"Fingerprint=([0-9A-F:]+)", result.stdout)
    end = re.search(r"notAfter=(.+)$", result.stdout, re.MULTILINE)
    return CertificateInfo(
        subject=cn.group(1).strip() if cn else "",
        sha1_fingerprint=fp.group(1) if fp else "",
        not_after=end.group(1).strip() if end else "",
    )


# --- the firmware's side: MOK enrollment --------------------------------------------------------


def enrollment(cert: Path) -> str:
    """enrolled, pending (imported, waiting for the reboot), not enrolled, or unknown (why)."""
    with tempfile.NamedTemporaryFile(suffix=".der") as der:
        # mokutil compares DER bytes.
        der.write(ssl.PEM_cert_to_DER_cert(certificate_pem(cert)))
        der.flush()
        if runner.which("mokutil") is None:
            return "unknown (mokutil is not installed)"
        result = runner.run(["mokutil", "--test-key", der.name], check=False, timeout=30)
    text = (result.stdout + result.stderr).strip()
    if "already enrolled" in text:
        return "enrolled"
    if "enrollment request" in text:
        return "pending"
    if "is not enrolled" in text:
        return "not enrolled"
    return f"unknown ({_first_line(text) or 'mokutil said nothing'})"


def enroll_command(cert: Path, pair: KeyPair | None = None, root: Path = Path("/")) -> list[str]:
    """How `cert` is queued: the pair's own enroll program for the pair's own certificate when `root` has it
    (Ubuntu's update-secureboot-policy, from shim-signed, runs mokutil --import on
    /var/lib/shim-signed/mok/MOK.der and asks for the one-time password through debconf); everywhere else, and
    for any other certificate, mokutil --import itself."""
    wrapper = _ENROLL_WRAPPERS.get(pair.enroll) if pair else None
    if wrapper and pair and Path(cert) == pair.cert and _program_in(root, pair.enroll):
        return wrapper
    return ["mokutil", "--import", str(cert)]


# Enroll programs other than mokutil, by name, and how they queue the distribution's own certificate.
_ENROLL_WRAPPERS = {"update-secureboot-policy": ["update-secureboot-policy", "--enroll-key"]}


def _program_in(root: Path, name: str) -> bool:
    return any((root / folder / name).is_file() for folder in ("usr/sbin", "usr/bin", "sbin", "bin"))


REBOOT_STEPS = (
    "mokutil has queued the certificate; the firmware asks for it at the next boot:",
    "  1. reboot; a blue MOK Manager screen appears (press a key within 10 seconds),",
    "  2. choose 'Enroll MOK', then 'Continue', then 'Yes',",
    "  3. type the one-time password you just chose, then choose 'Reboot'.",
    "Afterwards `rdna1-kmgr keys status` shows the certificate as enrolled.",
)


def enroll(cert: Path, pair: KeyPair | None = None) -> None:
    """Queue the certificate (enroll_command: it asks for a one-time password on the terminal)."""
    if not cert.is_file():
        raise HostError(f"certificate {cert} does not exist", "run `rdna1-kmgr keys generate` first")
    if runner.which("mokutil") is None:
        raise HostError("mokutil is not installed", "install it (apt install mokutil)")
    command = enroll_command(cert, pair)
    # On the terminal: mokutil (or debconf, for update-secureboot-policy) prompts for the password.
    code = runner.interactive(command)
    if code != 0:
        raise HostError(
            f"{' '.join(command)} failed (exit status {code})", "is this an EFI system with shim? see its message above"
        )


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
