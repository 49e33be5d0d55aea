"""Checks on a built module before anyone loads it: vermagic, signature, parameters, device aliases.

The signature check is cryptographic, not modinfo's `signer:` text. A signed module is
    content || PKCS#7 (DER) || struct module_signature (12 bytes) || "~Module signature appended~\\n"
(include/linux/module_signature.h); the PKCS#7 is detached and carries no certificate, so it is
verified over the content with openssl against the certificate the build says it used. One flipped
byte in the content makes it fail.
"""

from __future__ import annotations

import gzip
import hashlib
import lzma
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core import runner
from rdna1_kmgr.core.errors import BuildError
from rdna1_kmgr.core.files import sha256_file
from rdna1_kmgr.host.rdna1_boards import AMD_VENDOR, format_id
from rdna1_kmgr.modbuild.signing import certificate_pem

MAGIC = b"~Module signature appended~\n"
# struct module_signature { u8 algo, hash, id_type, signer_len, key_id_len; u8 __pad[3]; __be32 sig_len; }
SIG_INFO = struct.Struct(">BBBBB3xI")
PKEY_ID_PKCS7 = 2


@dataclass(frozen=True)
class SignedModule:
    content: bytes
    signature: bytes  # DER PKCS#7


def read_module(path: Path) -> bytes:
    """The module's ELF bytes, decompressed when DKMS compressed it like the kernel's own modules."""
    data = path.read_bytes()
    if path.suffix == ".xz":
        return lzma.decompress(data)
    if path.suffix == ".gz":
        return gzip.decompress(data)
    if path.suffix == ".zst":
        return runner.run(
            ["zstd", "-dc", str(path)], text=False, error=BuildError, doing=f"decompressing {path}", hint="install zstd"
        ).stdout
    return data


def content_sha256(path: Path) -> str:
    """The sha256 of the module's ELF bytes (read_module): the same for a module and its decompressed copy."""
    return hashlib.sha256(read_module(path)).hexdigest()


def split_signature(data: bytes) -> SignedModule:
    if not data.endswith(MAGIC):
        raise BuildError("the module is not signed (no appended signature)")
    info_end = len(data) - len(MAGIC)
    info_start = info_end - SIG_INFO.size
    if info_start < 0:
        raise BuildError("the module's signature trailer is truncated")
    _algo, _hash, id_type, _signer_len, _key_id_len, sig_len = SIG_INFO.unpack(data[info_start:info_end])
    if id_type != PKEY_ID_PKCS7:
        raise BuildError(f"the module's signature is not PKCS#7 (id type {id_type})")
    sig_start = info_start - sig_len
    if sig_start <= 0:
        raise BuildError("the module's signature length runs past its start")
    return SignedModule(content=data[:sig_start], signature=data[sig_start:info_start])


def verify_signature(module: Path, cert: Path) -> None:
    """Raise BuildError unless the module's appended signature verifies against `cert`."""
    signed = split_signature(read_module(module))
    with tempfile.TemporaryDirectory(prefix="rdna1-kmgr-verify-") as tmp:
        content, signature, pem = Path(tmp, "content"), Path(tmp, "signature.p7"), Path(tmp, "cert.pem")
        content.write_bytes(signed.content)
        signature.write_bytes(signed.signature)
        pem.write_text(certificate_pem(cert))
        # -noverify: the certificate is a self-made MOK, trusted by enrollment, not by a CA chain;
        # what is checked is that its key made this signature over exactly this content.
        result = runner.run(
            [
                "openssl",
                "cms",
                "-verify",
                "-binary",
                "-inform",
                "DER",
                "-in",
                str(signature),
                "-content",
                str(content),
                "-certfile",
                str(pem),
                "-nointern",
                "-noverify",
                "-out",
                "/dev/null",
            ],
            check=False,
            error=BuildError,
        )
    if result.returncode != 0:
        reason = next((ln.strip() for ln in result.stderr.splitlines() if ln.strip()), "openssl refused it")
        raise BuildError(f"the signature of {module} does not verify against {cert}", reason)


def modinfo_field(module: Path, field: str) -> list[str]:
    result = runner.run(["modinfo", "-F", field, str(module)], error=BuildError, doing=f"modinfo of {module}")
    return [line for line in result.stdout.splitlines() if line.strip()]


def pci_alias(device: int, vendor: int = AMD_VENDOR) -> str:
    return f"pci:v{vendor:08X}d{device:08X}sv*sd*bc*sc*i*"


@dataclass(frozen=True)
class ModuleReport:
    module: Path
    sha256: str
    vermagic: str
    signer: str
    parameters: tuple[str, ...]
    aliases: tuple[str, ...]


def verify(
    module: Path,
    kernel: str,
    cert: Path,
    devices: list[int],
    parameter_prefix: str = "rdna1_",
    parameters: list[str] | None = None,
) -> ModuleReport:
    """Every check the build requires; the first that fails raises BuildError naming what is wrong."""
    vermagic = " ".join(modinfo_field(module, "vermagic"))
    if vermagic.split()[:1] != [kernel]:
        raise BuildError(
            f"the module's vermagic is {vermagic.split()[0] if vermagic else 'empty'!r}, not {kernel!r}",
            "it was built against other headers",
        )
    verify_signature(module, cert)
    names = tuple(entry.split(":", 1)[0] for entry in modinfo_field(module, "parm"))
    ours = tuple(n for n in names if n.startswith(parameter_prefix))
    if not ours:
        raise BuildError(f"the module has no {parameter_prefix}* parameter", "the patch series was not applied")
    missing = [p for p in (parameters or []) if p not in names]
    if missing:
        raise BuildError(f"the module lacks the parameter(s) {', '.join(missing)}", "the patch series was not applied")
    aliases = tuple(modinfo_field(module, "alias"))
    for device in devices:
        if pci_alias(device) not in aliases:
            raise BuildError(f"the module has no alias for 1002:{format_id(device)[2:]}", "the device table lacks it")
    signer = " ".join(modinfo_field(module, "signer"))
    return ModuleReport(
        module=module, sha256=sha256_file(module), vermagic=vermagic, signer=signer, parameters=ours, aliases=aliases
    )
