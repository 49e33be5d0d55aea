"""`rdna1-kmgr report` on a fixture desktop owned by "alice" on "alice-desktop": the Markdown and JSON hold what
an issue tracker asks for (kernel, ROCm and torch versions, KFD node facts, doctor's findings, the experiment's
table) and none of the owner's names, homes, host name, serials or addresses."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parents[1] / "doctor"))
from doctor_checks import NO_SVM_CAPABILITY  # noqa: E402
from therock_fixtures import therock_venv  # noqa: E402

from rdna1_kmgr.cli import main  # noqa: E402

KERNEL = "6.12.95+deb12-amd64"
ROCM = "7.13.0a20260601"
SERIAL = "PF3KX92A0117"  # a board serial as DMI shows it
PRODUCT_UUID = "4c4c4544-0042-3510-8052-b4c04f4b3132"
MACHINE_ID = "5f1c0d9e2a7b4c3d8e9f0a1b2c3d4e5f"
MAC = "2c:f0:5d:8a:11:7e"
TOKEN = "hf_Qw3rTy8uIoP1aSdFgHjKlZxCvBnM"  # a Hugging Face token as owners paste them into scripts
PIP_PASSWORD = "s3cr3t-pip-pass"  # a private index's credentials in a pip line


@pytest.fixture
def desktop(tmp_path, monkeypatch):
    from sysfs_fixtures import rx5600xt

    tree = rx5600xt(tmp_path / "root").kernel(KERNEL)
    tree.users(("alice", 1000, ["render", "video"]), groups={"render": os.getgid(), "video": 44})
    tree.kfd_node(0).kfd_node(1, 100100, 36, 128, (1,), capability=NO_SVM_CAPABILITY)
    tree.file("dev/kfd", "", 0o660).file("dev/dri/renderD128", "", 0o660)
    tree.file("etc/hostname", "alice-desktop\n").file("etc/machine-id", MACHINE_ID + "\n")
    tree.file("sys/class/dmi/id/board_serial", SERIAL + "\n").file("sys/class/dmi/id/product_uuid", PRODUCT_UUID)
    tree.file("sys/class/dmi/id/chassis_serial", "Default string\n")  # a placeholder: not a secret
    tree.file("sys/class/net/enp5s0/address", MAC + "\n")
    # A home path inside a finding: the override in alice's .bashrc (gfx-override names the file and line).
    tree.file("home/alice/.bashrc", "export HSA_OVERRIDE_GFX_VERSION=10.3.0\n")
    therock_venv(tmp_path / "root/home/alice/venv", rocm=ROCM, torch="2.11.0+rocm" + ROCM)
    state = tmp_path / "state"
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(state))
    monkeypatch.setenv("RDNA1_KMGR_ROOT", str(tmp_path / "target"))
    (tmp_path / "target").mkdir()
    # The last experiment as `experiment` records it (answer.write): one cell, its detail naming alice's venv.
    (state / "experiments").mkdir(parents=True)
    cell = {
        "cell": "as-installed/miopen",
        "profile": "as-installed",
        "backend": "miopen",
        "outcome": "wrong",
        # Owners' logs carry such words (a prompt, dmesg's board line, a network name): the report must not.
        "detail": f"1 of 40 off, first conv2d k=3 12x12 forward (error 1) in {tmp_path}/root/home/alice/venv "
        f"on alice-desktop, board {SERIAL}, link {MAC}; HF_TOKEN={TOKEN}; Looking in indexes: "
        f"https://bob:{PIP_PASSWORD}@pypi.corp.example/simple",
        "stage": "conv2d",
        "case": "conv2d k=3 12x12 forward",
        "max_error": 1.0,
        "seconds": 3.2,
    }
    (state / "experiments/host-latest.json").write_text(
        json.dumps({"cells": [cell], "answer": ["no user-space cell passed"], "python": "/home/alice/venv/bin/python"})
    )
    return tree


def report(desktop, tmp_path, *args) -> tuple[str, dict, str]:
    out = tmp_path / "out"
    out.mkdir()
    result = CliRunner().invoke(
        main, ["report", "--sysroot", str(desktop.root), "--user", "alice", "--output", str(out / "r.md"), *args]
    )
    assert result.exit_code == 0, result.output
    text = (out / "r.md").read_text()
    return text, json.loads((out / "r.json").read_text()), result.stdout


def test_the_report_holds_nothing_private(desktop, tmp_path):
    text, record, _ = report(desktop, tmp_path, "--html")
    page = (tmp_path / "out/r.html").read_text()
    whole = json.dumps(record)
    for private in (
        "alice",
        "/home/alice",
        "alice-desktop",
        SERIAL,
        PRODUCT_UUID,
        MACHINE_ID,
        MAC,
        TOKEN,
        PIP_PASSWORD,
    ):
        assert private not in text and private not in whole and private not in page, private
    # What stood there is said, so the reader knows a value was there.
    assert "<home>/.bashrc" in text and "<home>/venv" in text and "<user>" in whole
    assert "on <host>, board <serial>, link <mac>" in page and "<host>" in whole
    assert "HF_TOKEN=<secret>" in whole and "https://<credentials>@pypi.corp.example/simple" in page


def test_the_report_holds_what_an_issue_tracker_asks_for(desktop, tmp_path):
    text, record, stdout = report(desktop, tmp_path)
    assert f"kernel: `{KERNEL}`" in text
    assert "KFD checks the CWSR size (running kernel): yes" in text  # 6.12 by its version
    assert f"0x{NO_SVM_CAPABILITY:08x}" in text and "SVM API offered to libhsakmt: no" in text
    assert "torch 2.11.0+rocm" + ROCM in text and f"rocm-sdk-core {ROCM}" in text
    assert "| 1 | gfx1010 | 100100 | 36 |" in text  # the board's KFD node
    assert "`gfx-override`" in text and "HSA_OVERRIDE_GFX_VERSION" in text  # doctor's findings
    assert "as-installed/miopen" in text and "wrong" in text  # the last experiment's table
    assert record["system"]["kernel"] == KERNEL and record["kfd_nodes"][1]["processor"] == "gfx1010"
    assert record["kernel_queue_facts"]["svm"]["svm_api"] is False
    assert any(f["check"] == "queue" for f in record["doctor"]["findings"])
    assert str(tmp_path / "out/r.md") in stdout


def test_a_link_at_the_output_is_replaced_not_followed(desktop, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "r.md").symlink_to(victim)
    result = CliRunner().invoke(main, ["report", "--sysroot", str(desktop.root), "--output", str(out / "r.md")])
    assert result.exit_code == 0, result.output
    assert victim.read_text() == "keep\n" and not (out / "r.md").is_symlink()


@pytest.mark.parametrize("given", ["report.txt", "nowhere/r.md"])
def test_an_output_that_is_not_a_markdown_file_in_a_folder_is_refused(desktop, tmp_path, given):
    result = CliRunner().invoke(main, ["report", "--sysroot", str(desktop.root), "--output", str(tmp_path / given)])
    assert result.exit_code == 2 and "invalid --output" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# A gfx10 page fault as Debian's 6.12 prints it (gmc_v10_0_process_interrupt), amid other lines of the log
FAULT = (
    "amdgpu 0000:0a:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32770)",
    "amdgpu 0000:0a:00.0: amdgpu:  in process python3 pid 2512 thread python3 pid 2512",
    "amdgpu 0000:0a:00.0: amdgpu:   in page starting at address 0x00007f0000000000 from client 0x1b (UTCL2)",
)


def test_the_kernel_log_excerpt_carries_the_fault_redacted_and_a_name_inside_a_folder_name_is_gone(desktop, tmp_path):
    desktop.kmsg(
        "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
        "amdgpu 0000:0a:00.0: amdgpu: SMU is initialized successfully!",
        *FAULT,
        "kfd kfd: amdgpu: added device 1002:731f on alice-desktop",
    )
    therock_venv(tmp_path / "root/home/alice/alice_sd/venv", rocm=ROCM, torch="2.11.0+rocm" + ROCM)
    text, record, _ = report(desktop, tmp_path, "--html")
    page = (tmp_path / "out/r.html").read_text()
    whole = json.dumps(record)
    assert FAULT[0] in text and record["kernel_log"][1] == FAULT[0]
    assert "usb 1-1" not in whole  # amdgpu and KFD lines only
    assert "kfd kfd: amdgpu: added device 1002:731f on <host>" in text
    assert "**PROBLEM** `gpu-faults`" in text
    for shown in (text, whole, page):
        assert "alice" not in shown
    assert "<home>/<user>_sd/venv" in text


def test_with_a_sysroot_the_hosts_own_facts_are_marked_as_such(desktop, tmp_path):
    text, record, _ = report(desktop, tmp_path)
    assert record["from_the_host"] == ["installed_build", "experiment"]
    assert "### Installed build (the running host's, not the system read)" in text
    assert "### Last experiment (the running host's, not the system read)" in text
