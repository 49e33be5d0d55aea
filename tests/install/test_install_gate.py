"""The install gate's VM verdict check, on records written by hand under the state directory: install refuses a
module whose record under its hash does not vouch for it, in one line saying why (issue 41)."""

import json

import pytest
from install_checks import verdict_record

from rdna1_kmgr.install.install_gate import Candidate, InstallRefused, _vm_check
from rdna1_kmgr.modbuild import dkms_package as dkms

SHA256 = "ab" * 32
KERNEL = "6.1.0-28-amd64"


@pytest.fixture
def candidate(tmp_path, monkeypatch) -> Candidate:
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path / "state"))
    (tmp_path / "state" / "validations").mkdir(parents=True)
    return Candidate(dkms.Package("rdna1-amdgpu", "1.0"), KERNEL, tmp_path / "amdgpu.ko", SHA256, None)


def write_record(tmp_path, data: dict) -> None:
    (tmp_path / "state" / "validations" / f"{SHA256}.json").write_text(json.dumps(data))


def test_a_passing_record_for_this_module_and_kernel_lets_it_through(tmp_path, candidate):
    write_record(tmp_path, verdict_record(SHA256, KERNEL).to_json())
    check = _vm_check(candidate, skip=False)
    assert check == {
        "verdict": "pass",
        "mode": "emulated",
        "record": str(tmp_path / "state" / "validations" / f"{SHA256}.json"),
    }


def test_a_record_under_its_hash_that_names_no_module_is_no_verdict_for_it(tmp_path, candidate):
    # A module-less run (plumbing) writes module_sha256 null; a record like that under this module's name
    # vouches for nothing: refused with the reason, where the check used to fail on slicing None.
    write_record(tmp_path, {**verdict_record(SHA256, KERNEL).to_json(), "module_sha256": None})
    with pytest.raises(InstallRefused) as refused:
        _vm_check(candidate, skip=False)
    assert f"{SHA256}.json names no module" in refused.value.what
    assert _vm_check(candidate, skip=True) == {"skipped": True, "why": refused.value.what.split(": ", 1)[1]}
