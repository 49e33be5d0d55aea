"""The kernel axis' decisions and refusals, fast, on scratch trees. The boots themselves, GRUB and systemd and
all, are proven in test_kernel_cells_boots.py on a whole system."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from kernel_plans import kernel_plan
from sysfs_fixtures import no_gpu, rx5600xt

from rdna1_kmgr.cli import main
from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.experiment import boot_cells, kernel_cells, kernel_run
from rdna1_kmgr.experiment.kernel_cells import InstalledBuild
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.render.manifest import Manifest
from rdna1_kmgr.render.quirk_mask import QuirkMask

CLI = Path(sys.executable).parent / "rdna1-kmgr"


def test_stock_cells_are_one_amdgpu_word_each():
    cells = {c.name: c.parameter for c in kernel_cells.stock_cells()}
    # the three stock parameters issue 24 names, in the data file's order
    assert cells == {
        "cwsr-off": "amdgpu.cwsr_enable=0",
        "small-bar": "amdgpu.vis_vramlimit=256",
        "vm-update-sdma": "amdgpu.vm_update_mode=0",
    }


def test_quirk_cells_come_from_the_installed_builds_bits():
    # A 6.12 build: cwsr-size (0x10) on by default; crat-mem (0x2) and coarse-mtype's two classes (0x4, 0x8)
    # carried, opt-in (the quirk table: docs/reference.md).
    cells = {c.name: c.parameter for c in kernel_cells.quirk_cells(InstalledBuild(QuirkMask(0x10), QuirkMask(0x1E)))}
    assert cells == {
        "quirks-off": "amdgpu.rdna1_quirks=0",
        "quirks+crat-mem": "amdgpu.rdna1_quirks=0x12",
        "quirks+coarse-mtype-vram": "amdgpu.rdna1_quirks=0x14",
        "quirks+coarse-mtype-host": "amdgpu.rdna1_quirks=0x18",
    }
    # a 6.1 build carries no default bit: no "off" cell, each opt-in bit alone
    cells = {c.name: c.parameter for c in kernel_cells.quirk_cells(InstalledBuild(QuirkMask(0), QuirkMask(0x2)))}
    assert cells == {"quirks+crat-mem": "amdgpu.rdna1_quirks=0x2"}


def test_unknown_kernel_cell_is_refused_naming_what_there_is():
    with pytest.raises(UsageError) as err:
        kernel_cells.select(("quirks+crat-mem",), None)
    assert "unknown kernel cell 'quirks+crat-mem'" in err.value.line()
    assert "cwsr-off" in err.value.line() and "rdna1-kmgr install" in err.value.line()


def test_a_cell_word_that_is_not_one_amdgpu_parameter_is_rejected():
    for parameter in ("amdgpu.cwsr_enable=0 init=/bin/sh", "quiet", "amdgpu.x=$(reboot)"):
        with pytest.raises(ValueError):
            kernel_cells.KernelCell("bad", parameter, "")


@pytest.mark.parametrize(
    "current, this_cell, state, name, action",
    [
        ("small-bar", "small-bar", "booted", "small-bar", "run"),  # GRUB started the cell's boot: run it
        ("small-bar", None, "booted", "small-bar", "hang"),  # GRUB started it, but this boot is a normal one
        ("small-bar", None, "armed", "small-bar", "wait"),  # the owner has not rebooted yet
        ("small-bar", None, None, None, "rearm"),  # the block lost it: arm again
        ("small-bar", "cwsr-off", "booted", "cwsr-off", "nothing"),  # a cell already recorded
        (None, None, None, None, "nothing"),  # every cell done
    ],
)
def test_boot_step_decides_by_this_boot_and_grubs_block(current, this_cell, state, name, action):
    assert kernel_run.decide(current, this_cell, state, name) == action


def test_best_host_cells_are_those_that_got_furthest():
    record = {
        "cells": [
            {"cell": "as-installed/miopen", "outcome": "invalid-device-function", "stage": "smoke"},
            {"cell": "no-override/miopen", "outcome": "wrong", "stage": "conv2d"},
            {"cell": "conv-gemm/miopen", "outcome": "hang", "stage": "variants"},
            {"cell": "find-fast/miopen", "outcome": "wrong", "stage": "conv2d"},
        ]
    }
    assert kernel_run.best_host_cells(record) == ["conv-gemm/miopen", "no-override/miopen"]
    record["cells"].append({"cell": "no-asm/no-miopen", "outcome": "pass", "stage": None})
    assert kernel_run.best_host_cells(record, 1) == ["no-asm/no-miopen"]
    assert kernel_run.best_host_cells(None) == ["as-installed/miopen"]


def test_grub_script_marks_the_cell_booted_before_the_kernel_line_uses_it(tmp_path):
    script = boot_cells.files(TargetRoot(tmp_path))[tmp_path / boot_cells.GRUB_SCRIPT][0]
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    armed = out.index('= "armed"')
    assert (
        out.index("set rdna1_kmgr_cell=booted", armed)
        < out.index("save_env rdna1_kmgr_cell", armed)
        < out.index("rdna1_kmgr_cell_args=", armed)
    )
    assert 'rdna1_kmgr_cell_args=""' in out[out.index("else", armed) :]  # any other boot: no word at all
    defaults = boot_cells.files(TargetRoot(tmp_path))[tmp_path / boot_cells.GRUB_DEFAULTS][0]
    # sourced by update-grub after the boot guard's rdna1-kmgr.cfg: a cell's rdna1_quirks comes last
    assert sorted(["rdna1-kmgr.cfg", Path(boot_cells.GRUB_DEFAULTS).name]) == [
        "rdna1-kmgr.cfg",
        "rdna1-kmgr.experiment.cfg",
    ]
    assert "\\${rdna1_kmgr_cell_args}" in defaults


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("RDNA1_KMGR_ROOT", str(tmp_path / "root"))
    (tmp_path / "root").mkdir()
    return tmp_path


def test_no_board_is_one_line_and_nothing_changes(state):
    tree = no_gpu(state / "sysroot")
    result = CliRunner().invoke(main, ["experiment", "kernel", "--sysroot", str(tree.root)])
    assert result.exit_code == 4 and "no RDNA1 board" in result.stderr, result.output
    # A --python that is no Python with torch is bad input: said first, before the board is looked for.
    result = CliRunner().invoke(main, ["experiment", "kernel", "--sysroot", str(tree.root), "--python", "/bin/true"])
    assert result.exit_code == 2 and "'/bin/true' is not a Python with torch" in result.stderr, result.output
    assert not (state / "state").exists() and list((state / "root").iterdir()) == []


def test_kernel_cells_need_grub_on_this_machine(state):
    tree = rx5600xt(state / "sysroot")
    result = CliRunner().invoke(
        main,
        ["experiment", "kernel", "--sysroot", str(tree.root), "--kernel-cell", "cwsr-off"],
    )
    assert result.exit_code == 2, result.output
    assert "boots through GRUB" in result.stderr and "not this machine's root" in result.stderr
    assert result.stderr.count("\n") == 1 and not (state / "state").exists()


def test_status_and_stop_without_an_experiment(state):
    result = CliRunner().invoke(main, ["experiment", "status"])
    assert result.exit_code == 0 and "no experiment's kernel cells are under way" in result.stdout
    result = CliRunner().invoke(main, ["experiment", "stop", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["running"] is False


def test_rollback_undoes_the_experiment_before_the_kernels(state):
    from rdna1_kmgr.install import rollback
    from rdna1_kmgr.install.journal_records import ExperimentBegin, ProfileBegin
    from rdna1_kmgr.install.profile_journal import ExperimentJournal, ProfileJournal

    ProfileJournal().begin(ProfileBegin("find-fast", "/"))
    ExperimentJournal().begin(ExperimentBegin("/var/lib/rdna1-kmgr/experiments/x", ("no-cwsr",)))
    assert [j.kernel for j in rollback.kernels_to_roll_back(None)] == ["experiment", "profile"]


def test_apply_kernel_refuses_what_did_not_pass_and_needs_grub(state):
    result = CliRunner().invoke(main, ["experiment", "apply", "--kernel"])
    assert result.exit_code == 2 and "no kernel cells have run" in result.stderr
    # a finished run's record as kernel_run writes it: cwsr-off passed, small-bar hung
    from rdna1_kmgr.experiment import answer
    from rdna1_kmgr.vm.experiment import experiments_dir

    plan = kernel_plan(state / "state/experiments/kernel-x", kernel_cells.stock_cells()[:2], ("as-installed/miopen",))
    events = [
        {
            "cell": "cwsr-off",
            "event": "ran",
            "results": [
                {
                    "cell": "as-installed/miopen",
                    "profile": "as-installed",
                    "backend": "miopen",
                    "outcome": "pass",
                    "stage": None,
                    "case": None,
                    "detail": "",
                }
            ],
        },
        {"cell": "small-bar", "event": "hang"},
    ]
    record = answer.write_kernel_record(plan, events, "")
    assert record["recommended_kernel_cell"] == "cwsr-off"
    assert "sudo rdna1-kmgr experiment apply --kernel-cell cwsr-off" in record["answer"][1]
    (experiments_dir() / "kernel-latest.json").write_text(json.dumps(record))
    result = CliRunner().invoke(main, ["experiment", "apply", "--kernel-cell", "small-bar"])
    assert result.exit_code == 2 and "did not pass" in result.stderr and "passing cells: cwsr-off" in result.stderr
    # this scratch root is no machine GRUB boots: one line, nothing written
    result = CliRunner().invoke(main, ["experiment", "apply", "--kernel", "--dry-run"])
    assert result.exit_code == 2 and "through GRUB" in result.stderr, result.output
    assert list((state / "root").iterdir()) == []
    # The attack: a forged record whose passing cell's word would be shell code in a file update-grub sources as
    # root. Refused in one line before anything, GRUB or not.
    forged = json.loads(json.dumps(record))
    forged["plan"]["kernel_cells"][0]["parameter"] = 'amdgpu.cwsr_enable=0" ; touch /tmp/rdna1-pwned ; "'
    (experiments_dir() / "kernel-latest.json").write_text(json.dumps(forged))
    result = CliRunner().invoke(main, ["experiment", "apply", "--kernel-cell", "cwsr-off"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert "refusing the kernel parameter" in result.stderr and "nothing was changed" in result.stderr
    assert list((state / "root").iterdir()) == []


def test_quirk_cells_read_the_build_the_journal_installed(state, monkeypatch):
    from rdna1_kmgr.follow import status

    root = state / "root"
    params = root / "sys/module/amdgpu/parameters"
    assert kernel_run.installed_build(TargetRoot(root)) is None  # a stock amdgpu: no rdna1_quirks, no mask cells
    params.mkdir(parents=True)
    (params / "rdna1_quirks").write_text("16\n")
    # a 6.12 render manifest's bits (cwsr-size on by default, crat-mem opt-in); two builds, the journal's is the 2nd
    manifest = Manifest.from_json(
        {
            "quirks_mask": 0x10,
            "all_bits_mask": 0x12,
            "bits": [{"id": "cwsr-size", "default": True}, {"id": "crat-mem", "default": False}],
        }
    )
    old = Manifest.from_json({"quirks_mask": 0, "all_bits_mask": 0x2})
    builds = [
        {"version": "6.12.95+pold", "quirks": status.build_quirks(old)},
        {"version": "6.12.95+pnew", "quirks": status.build_quirks(manifest)},
    ]
    kernel = status.KernelStatus(
        kernel="6.12.95+deb12-amd64",
        running=True,
        dkms=[],
        built=builds,
        journal={"version": "6.12.95+pnew"},
        module=None,
        parameters={},
        loaded=None,
        follow=None,
        next_boot="",
    )
    report = status.StatusReport("?", status.Certificate("c", "e"), [kernel], {}, None, None)
    monkeypatch.setattr(status, "run", lambda: report)
    assert kernel_run.installed_build(TargetRoot(root)) == InstalledBuild(QuirkMask(0x10), QuirkMask(0x12))


def test_bad_input_is_said_before_the_machine_is_looked_at(state):
    tree = no_gpu(state / "sysroot")  # no board either: the input's error comes first
    for args, said in (
        (["--kernel-cell", "nosuch"], "unknown kernel cell 'nosuch'"),
        (["--cells", "nothing/*"], "matches no cell"),
    ):
        result = CliRunner().invoke(main, ["experiment", "kernel", "--sysroot", str(tree.root), *args])
        assert result.exit_code == 2 and said in result.stderr and result.stderr.count("\n") == 1, result.output
    assert not (state / "state").exists()


def test_plan_json_keeps_only_what_a_cell_needs_not_roots_secrets():
    """Issue 40: plan.json held root's whole environment (through sudo: tokens, keys). Names from the profiles
    file (read by hand: HSA_OVERRIDE_GFX_VERSION, MIOPEN_DEBUG_CONV_DIRECT) and the allow-list stay."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/owner",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HSA_OVERRIDE_GFX_VERSION": "10.3.0",
        "MIOPEN_DEBUG_CONV_DIRECT": "0",
        "PYTORCH_HIP_ALLOC_CONF": "expandable_segments:True",
        "PYTHONPATH": "/home/owner/src",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG",
        "GITHUB_TOKEN": "ghp_secret",
        "SSH_AUTH_SOCK": "/tmp/ssh-agent.sock",
        "LD_PRELOAD": "/tmp/evil.so",
    }
    kept = kernel_run.owner_environment(env)
    assert "AWS_SECRET_ACCESS_KEY" not in kept and "GITHUB_TOKEN" not in kept
    assert "SSH_AUTH_SOCK" not in kept and "LD_PRELOAD" not in kept
    assert kept == {k: env[k] for k in list(env)[:8]}


def test_a_start_in_the_same_second_as_the_last_gets_a_folder_of_its_own(state, monkeypatch):
    # start, stop, start within one second (a script, a fast machine): the second run's events and record must
    # not land in the stopped run's folder
    monkeypatch.setattr(kernel_run.time, "strftime", lambda fmt, *a: "20261126T192743")
    first = kernel_run.new_run_folder()
    first.mkdir(parents=True)
    second = kernel_run.new_run_folder()
    second.mkdir()
    assert first.name == "kernel-20261126T192743" and second.name == "kernel-20261126T192743-2"
    assert kernel_run.new_run_folder().name == "kernel-20261126T192743-3"
