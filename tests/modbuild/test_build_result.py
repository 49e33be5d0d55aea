"""The build's result: `build --json` prints today's shape, and what it prints reads back as the same result."""

import json

import pytest

from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.modbuild.build_result import BuildResult

# `build --json` of a real 6.1 build as the command printed it before the result was typed (trimmed paths).
PRINTED = {
    "certificate": "/var/lib/dkms/mok.pub",
    "certificate_sha1": "3F:2A:11:90:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89",
    "compiled_objects": 412,
    "devices": ["0x731F"],
    "kept_installed_versions": [],
    "kernel": "6.1.0-56-amd64",
    "kernel_package_version": "6.1.192-2",
    "kernel_version": "6.1.192",
    "log": "/var/log/rdna1-kmgr/build-rdna1-amdgpu-6.1.192+p0123456789ab-6.1.0-56-amd64.log",
    "module": "/var/lib/dkms/rdna1-amdgpu/6.1.192+p0123456789ab/6.1.0-56-amd64/x86_64/module/amdgpu.ko.xz",
    "note": None,
    "package": "rdna1-amdgpu",
    "package_source": "/usr/src/rdna1-amdgpu-6.1.192+p0123456789ab",
    "package_version": "6.1.192+p0123456789ab",
    "parameters": ["rdna1_quirks", "rdna1_selftest"],
    "patchset_sha256": "0123456789ab" + "0" * 52,
    "quirks": ["crat-mem", "gfxoff-off"],
    "removed_versions": ["6.1.192+pold"],
    "reused": False,
    "seconds": 301.4,
    "signer": "DKMS module signing key",
    "signing_key": "/var/lib/dkms/mok.key",
    "sha256": "ab" * 32,
    "source": "/root/.cache/rdna1-kmgr/src/linux-6.1.192",
    "source_package": {"distro": "debian", "package": "linux-source-6.1", "version": "6.1.192-2"},
    "vermagic": "6.1.0-56-amd64 SMP preempt mod_unload modversions",
}


# Since issue 37 it also says which bits are on by default for the kernel and which are only compiled in.
PRINTED_NOW = {**PRINTED, "quirks_on": [], "quirks_off": ["crat-mem", "gfxoff-off"]}


def test_a_printed_result_reads_back_and_prints_byte_for_byte_the_same():
    result = BuildResult.from_json(json.loads(json.dumps(PRINTED_NOW)))
    assert result.quirks == ("crat-mem", "gfxoff-off") and result.reused is False
    assert result.source_package["package"] == "linux-source-6.1"
    printed = json.dumps(PRINTED_NOW, indent=2, sort_keys=True)
    assert json.dumps(result.to_json(), indent=2, sort_keys=True) == printed


def test_a_result_printed_before_it_named_the_bits_on_reads_as_naming_none():
    result = BuildResult.from_json(json.loads(json.dumps(PRINTED)))
    assert result.quirks_on == () and result.quirks_off == ()


def test_the_result_cannot_be_changed_after_the_build():
    result = BuildResult.from_json(PRINTED)
    with pytest.raises(AttributeError):
        result.sha256 = "00" * 32
    with pytest.raises(TypeError):
        result.source_package["version"] = "other"


def test_a_file_that_is_no_build_result_is_one_line_naming_what_it_lacks():
    with pytest.raises(UsageError) as err:
        BuildResult.from_json({k: v for k, v in PRINTED.items() if k != "sha256"})
    assert "sha256" in err.value.line() and "build --json" in err.value.line() and "\n" not in err.value.line()
    with pytest.raises(UsageError):
        BuildResult.from_json(["not", "a", "mapping"])
