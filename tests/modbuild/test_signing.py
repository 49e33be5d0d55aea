"""Signing keys, MOK enrollment, and the module checks (vermagic, openssl signature, parameters, aliases).

The module checks run on a real module: the tiny test module built with kbuild against the installed
headers and signed with the kernel's own sign-file, so what openssl verifies is what DKMS produces.
"""

import hashlib
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import hellomod
import pytest
from click.testing import CliRunner
from dkms_helpers import installed_release, kbuild, make_keys, sign_file_for

from rdna1_kmgr.cli import main
from rdna1_kmgr.core.errors import BuildError, HostError, UsageError
from rdna1_kmgr.host import host_facts, platform
from rdna1_kmgr.modbuild import module_checks, signing


@pytest.fixture(scope="module")
def signed_module(tmp_path_factory):
    """(module path, key pair, kernel release): the test module built and signed for the installed headers."""
    kernel = installed_release()
    root = tmp_path_factory.mktemp("signed")
    hellomod.write_tree(root / "tree")
    tree = root / "tree"
    module = kbuild(tree, kernel, hellomod.LOCATION, {"RDNA1HELLO_ROOT": str(tree / "drivers/misc")})
    keys = make_keys(root)
    unsigned = root / "unsigned.ko"
    shutil.copy(module, unsigned)
    subprocess.run([sign_file_for(kernel), "sha256", str(keys.key), str(keys.cert), str(module)], check=True)
    return module, keys, kernel, unsigned


# --- keys -------------------------------------------------------------------------------------------


def test_generate_makes_a_root_only_key_and_a_der_certificate(tmp_path):
    pair = signing.KeyPair(tmp_path / "new/mok.key", tmp_path / "new/mok.pub", "given")
    signing.generate(pair, subject="unit test key", days=1)
    assert stat.S_IMODE(pair.key.stat().st_mode) == 0o600
    assert stat.S_IMODE(pair.key.parent.stat().st_mode) == 0o700  # a folder we made: no one else enters
    assert pair.cert.read_bytes()[:1] == b"\x30"  # DER, as DKMS and shim keep it
    info = signing.certificate_info(pair.cert)
    assert info.subject == "unit test key"
    assert len(info.sha1_fingerprint.split(":")) == 20
    text = subprocess.run(
        ["openssl", "x509", "-inform", "DER", "-in", str(pair.cert), "-noout", "-text"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Code Signing" in text and "1.3.6.1.4.1.2312.16.1.2" in text and "CA:FALSE" in text
    signing.check_usable(pair)
    assert sorted(p.name for p in pair.key.parent.iterdir()) == ["mok.key", "mok.pub"]  # no temporary left


def test_generate_never_overwrites_without_force(tmp_path):
    pair = make_keys(tmp_path)
    before = pair.key.read_bytes()
    with pytest.raises(UsageError, match="already exists"):
        signing.generate(pair)
    assert pair.key.read_bytes() == before
    signing.generate(pair, force=True)
    assert pair.key.read_bytes() != before
    assert stat.S_IMODE(pair.key.stat().st_mode) == 0o600


def test_a_key_others_can_read_is_refused(tmp_path):
    pair = make_keys(tmp_path)
    pair.key.chmod(0o644)
    with pytest.raises(HostError, match=r"readable by others \(mode 0644\)"):
        signing.check_usable(pair)


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a key away: root only")
def test_a_key_another_user_owns_or_can_swap_is_refused(tmp_path):
    """Issue 40, M5: only the key's mode was checked; a 0600 key owned by another user (who can rewrite it)
    or in a folder others can write (where it can be swapped) signed modules all the same."""
    pair = make_keys(tmp_path)
    signing.check_usable(pair)
    os.chown(pair.key, 65534, 65534)
    with pytest.raises(HostError, match="is owned by uid 65534, not by uid 0"):
        signing.check_usable(pair)
    os.chown(pair.key, 0, 0)
    pair.key.parent.chmod(0o777)
    with pytest.raises(HostError, match=r"unsafe folder: .* is writable by all users \(mode 0777\)"):
        signing.check_usable(pair)
    pair.key.parent.chmod(0o755)
    signing.check_usable(pair)
    moved = tmp_path / "elsewhere.key"
    pair.key.rename(moved)
    pair.key.symlink_to(moved)
    with pytest.raises(HostError, match="is a symbolic link"):
        signing.check_usable(pair)


def test_key_and_cert_go_together_and_conventions_follow_the_distro(tmp_path):
    with pytest.raises(UsageError, match="--key and --cert go together"):
        signing.resolve(key=tmp_path / "k")
    # The paths each distribution's DKMS (or shim-signed, or akmods) documents for its MOK.
    debian = (Path("/var/lib/dkms/mok.key"), Path("/var/lib/dkms/mok.pub"), "debian")
    expected = {
        "debian": debian,
        "ubuntu": (Path("/var/lib/shim-signed/mok/MOK.priv"), Path("/var/lib/shim-signed/mok/MOK.der"), "ubuntu"),
        "fedora": (  # akmods' key (written, not proven)
            Path("/etc/pki/akmods/private/private_key.priv"),
            Path("/etc/pki/akmods/certs/public_key.der"),
            "fedora",
        ),
        "arch": debian,  # DKMS's own default
    }
    for name, (key, cert, convention) in expected.items():
        pair = signing.resolve(platform=platform.named(name))
        assert (pair.key, pair.cert, pair.convention) == (key, cert, convention), name
    unknown = signing.convention(platform.for_identity("gentoo", ""))  # DKMS's own default, no error
    assert (unknown.key, unknown.cert, unknown.convention) == debian
    given = signing.resolve(tmp_path / "k", tmp_path / "c", platform.named("ubuntu"))
    assert (given.key, given.cert, given.convention) == (tmp_path / "k", tmp_path / "c", "given")


def test_ubuntus_own_certificate_is_enrolled_with_its_wrapper_when_the_root_has_it(tmp_path):
    ubuntu = signing.convention(platform.named("ubuntu"))
    assert signing.enroll_command(ubuntu.cert, ubuntu, tmp_path) == ["mokutil", "--import", str(ubuntu.cert)]
    (tmp_path / "usr/sbin").mkdir(parents=True)
    (tmp_path / "usr/sbin/update-secureboot-policy").write_text("#!/bin/sh\n")
    assert signing.enroll_command(ubuntu.cert, ubuntu, tmp_path) == ["update-secureboot-policy", "--enroll-key"]
    other = tmp_path / "other.der"
    assert signing.enroll_command(other, ubuntu, tmp_path) == ["mokutil", "--import", str(other)]
    debian = signing.convention(platform.named("debian"))
    assert signing.enroll_command(debian.cert, debian, tmp_path) == ["mokutil", "--import", str(debian.cert)]


def test_ensure_makes_the_convention_pair_only_when_both_halves_are_missing(tmp_path):
    pair = signing.KeyPair(tmp_path / "mok.key", tmp_path / "mok.pub", "debian")
    assert signing.ensure(pair) is True
    assert signing.ensure(pair) is False
    pair.key.unlink()
    with pytest.raises(HostError, match="signing key .* does not exist"):
        signing.ensure(pair)  # half a pair is not replaced behind the user's back


def test_enrollment_state_comes_from_mokutil(tmp_path):
    pair = make_keys(tmp_path)
    state = signing.enrollment(pair.cert)
    # This machine boots without EFI; on an EFI machine the answer is one of the first three.
    assert state in ("enrolled", "pending", "not enrolled") or state.startswith("unknown (")
    if not Path("/sys/firmware/efi").exists():
        assert state == "unknown (EFI variables are not supported on this system)"


# --- module checks ----------------------------------------------------------------------------------


def test_split_signature_follows_the_module_signature_trailer():
    content, sig = b"\x7fELF-module-bytes", b"0\x82PKCS7-DER"
    info = module_checks.SIG_INFO.pack(0, 0, module_checks.PKEY_ID_PKCS7, 0, 0, len(sig))
    signed = module_checks.split_signature(content + sig + info + module_checks.MAGIC)
    assert (signed.content, signed.signature) == (content, sig)
    with pytest.raises(BuildError, match="not signed"):
        module_checks.split_signature(content)
    too_long = module_checks.SIG_INFO.pack(0, 0, module_checks.PKEY_ID_PKCS7, 0, 0, 1000)
    with pytest.raises(BuildError, match="runs past its start"):
        module_checks.split_signature(content + sig + too_long + module_checks.MAGIC)


def test_a_signed_module_passes_every_check(signed_module):
    module, keys, kernel, _ = signed_module
    report = module_checks.verify(module, kernel, keys.cert, [0x731F], parameters=["rdna1_hello_enable"])
    assert report.vermagic.split()[0] == kernel
    assert report.signer == "rdna1-kmgr test key"
    assert report.parameters == ("rdna1_hello_enable",)
    assert module_checks.pci_alias(0x731F) == "pci:v00001002d0000731Fsv*sd*bc*sc*i*"
    assert module_checks.pci_alias(0x731F) in report.aliases
    assert report.sha256 == hashlib.sha256(module.read_bytes()).hexdigest()


def test_one_flipped_byte_fails_the_signature(signed_module, tmp_path):
    module, keys, kernel, _ = signed_module
    data = bytearray(module.read_bytes())
    data[len(data) // 3] ^= 0x01  # inside the signed content
    tampered = tmp_path / "tampered.ko"
    tampered.write_bytes(bytes(data))
    with pytest.raises(BuildError, match="does not verify against"):
        module_checks.verify_signature(tampered, keys.cert)


def test_another_certificate_fails_the_signature(signed_module, tmp_path):
    module, _, _, _ = signed_module
    other = make_keys(tmp_path, subject="rdna1-kmgr test key")  # same name, different key
    with pytest.raises(BuildError, match="does not verify against"):
        module_checks.verify_signature(module, other.cert)


def test_a_pem_certificate_works_too(signed_module, tmp_path):
    module, keys, _, _ = signed_module
    pem = tmp_path / "cert.pem"
    pem.write_text(signing.certificate_pem(keys.cert))
    module_checks.verify_signature(module, pem)


def test_compressed_modules_are_checked_after_decompression(signed_module, tmp_path):
    module, keys, kernel, _ = signed_module
    packed = tmp_path / "rdna1hello.ko.xz"
    subprocess.run(["xz", "-c", str(module)], stdout=packed.open("wb"), check=True)
    module_checks.verify_signature(packed, keys.cert)


def test_unsigned_wrong_kernel_missing_alias_and_parameter_each_fail(signed_module):
    module, keys, kernel, unsigned = signed_module
    with pytest.raises(BuildError, match="not signed"):
        module_checks.verify(unsigned, kernel, keys.cert, [0x731F])
    with pytest.raises(BuildError, match=r"vermagic is .*not '6\.99\.0-1-amd64'"):
        module_checks.verify(module, "6.99.0-1-amd64", keys.cert, [0x731F])
    with pytest.raises(BuildError, match="no alias for 1002:7310"):
        module_checks.verify(module, kernel, keys.cert, [0x731F, 0x7310])
    with pytest.raises(BuildError, match="lacks the parameter.*rdna1_quirks"):
        module_checks.verify(module, kernel, keys.cert, [0x731F], parameters=["rdna1_quirks"])
    with pytest.raises(BuildError, match=r"no amdgpu_\* parameter"):
        module_checks.verify(module, kernel, keys.cert, [0x731F], parameter_prefix="amdgpu_")


# --- the keys command --------------------------------------------------------------------------------


def test_keys_status_reports_the_pair_and_secure_boot(tmp_path):
    pair = make_keys(tmp_path / "k")
    sysroot = tmp_path / "sysroot"
    var = sysroot / host_facts.SECURE_BOOT_VAR
    var.parent.mkdir(parents=True)
    var.write_bytes(b"\x06\x00\x00\x00\x01")  # attributes, then 1: Secure Boot on
    (sysroot / "proc/sys/kernel").mkdir(parents=True)
    (sysroot / "proc/sys/kernel/osrelease").write_text("6.1.0-56-amd64\n")
    result = CliRunner().invoke(
        main, ["keys", "status", "--key", str(pair.key), "--cert", str(pair.cert), "--sysroot", str(sysroot), "--json"]
    )
    assert result.exit_code == 0, result.output
    state = json.loads(result.output)
    assert state["secure_boot"] == {"enabled": True, "state": "enabled"}
    assert state["key_exists"] and state["key_private"] and state["cert_exists"]
    assert state["certificate"]["subject"] == "rdna1-kmgr test key"
    assert state["convention"] == "given"

    text = (
        CliRunner()
        .invoke(main, ["keys", "status", "--key", str(pair.key), "--cert", str(pair.cert), "--sysroot", str(sysroot)])
        .output
    )
    assert "secure boot  enabled" in text
    assert "will not load until the certificate is enrolled" in text


def test_keys_generate_dry_run_changes_nothing(tmp_path):
    key, cert = tmp_path / "a.key", tmp_path / "a.der"
    result = CliRunner().invoke(main, ["keys", "generate", "--key", str(key), "--cert", str(cert), "--dry-run"])
    assert result.exit_code == 0
    assert f"write {key} (mode 0600)" in result.output
    assert list(tmp_path.iterdir()) == []
    result = CliRunner().invoke(main, ["keys", "generate", "--key", str(key), "--cert", str(cert)])
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_keys_generate_refuses_to_overwrite_with_one_line(tmp_path):
    pair = make_keys(tmp_path)
    result = subprocess.run(
        ["rdna1-kmgr", "keys", "generate", "--key", str(pair.key), "--cert", str(pair.cert)],
        capture_output=True,
        text=True,
        env=_cli_env(),
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "already exists" in result.stderr


def test_keys_enroll_dry_run_prints_the_command_and_the_reboot_steps(tmp_path):
    pair = make_keys(tmp_path)
    result = CliRunner().invoke(main, ["keys", "enroll", "--cert", str(pair.cert), "--dry-run"])
    assert result.exit_code == 0
    assert result.output.splitlines()[0] == f"mokutil --import {pair.cert}"
    assert "Enroll MOK" in result.output and "reboot" in result.output


@pytest.mark.skipif(Path("/sys/firmware/efi").exists(), reason="would queue a real MOK enrollment")
def test_keys_enroll_on_a_machine_without_efi_fails_with_one_line(tmp_path):
    pair = make_keys(tmp_path)
    result = subprocess.run(
        ["rdna1-kmgr", "keys", "enroll", "--cert", str(pair.cert)],
        capture_output=True,
        text=True,
        env=_cli_env(),
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 4
    assert result.stderr.strip().splitlines()[-1].startswith("rdna1-kmgr: error: mokutil --import")


def _cli_env() -> dict:
    import os
    import sys

    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
