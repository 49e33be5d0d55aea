"""The experiment's kernel axis on a whole Debian 12 system in QEMU (tests/wholesystem.py): GRUB, real reboots
under TCG, systemd's unit at each boot, and the real workload with a real PyTorch (the CPU build) whose
stand-in device (standin/sitecustomize.py) reads this boot's /proc/cmdline to decide the outcome:

    amdgpu.cwsr_enable=0     pass
    amdgpu.vis_vramlimit=256 (its boot is killed once amdgpu has loaded: a hang)
    amdgpu.vm_update_mode=0  wrong numbers at conv2d k=3
    (no cell's word)         invalid device function at the smoke stage

One system, driven through its boots in order, each test the next chapter:

    1. start (after a dry run that changes nothing), status, stop: nothing of it in /etc, /boot, grubenv;
       start again; all in a chroot of the powered-off system (`System.chroot`), not a boot
    2. cell 1's boot: its word on the command line, the unit ran the cell and armed cell 2
    3. cell 2's boot, killed mid-boot
    4. a normal boot by itself: the unit records cell 2 as a hang and arms cell 3
    5. cell 3's boot: the last cell ran; the boot files are gone, the table has all three
    6. a normal boot: nothing of the experiment in /etc, /boot, grubenv or grub.cfg; the answer is cwsr-off;
       then, powered off, `experiment apply` puts it on GRUB's kernel lines and `rollback` takes it away (chroot)

Chapter 1, and apply and rollback in chapter 6, run natively in a chroot: they write files and run update-grub,
nothing about a boot; under TCG chapter 1 cost a boot of its own, the owner's PyTorch imported at TCG speed and
a minute of update-grub. What they read of the running system is the same in the chroot: no
amdgpu with rdna1_quirks (the guest's is stock, this machine has none), no boot guard, the sysroot and Python
given on the command line; rollback without --kernel does not ask which kernel runs. The cells' boots prove what
`start` armed; grub.cfg, read in the chroot, what apply and rollback did. update-grub in the chroot is told the
root device (tests/wholesystem.py): grub.cfg's linux lines say root=/dev/vda1.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from sysfs_fixtures import rx5600xt
from wholesystem import STEP_DIR, copy_into, facts, install_tool, new_system

pytestmark = [pytest.mark.vm, pytest.mark.second_lane]  # its own image copy: nothing shared on the host

STANDIN = Path(__file__).parent / "standin"
HOME = f"/{STEP_DIR}"
CELLS = ["cwsr-off", "small-bar", "vm-update-sdma"]
BY_CMDLINE = {
    "amdgpu.cwsr_enable=0": {"do": "pass"},
    "amdgpu.vm_update_mode=0": {"do": "wrong", "at": "conv2d k=3"},
}
AMDGPU_LOADED = "amdgpu kernel modesetting enabled"

FACTS = f"""
echo "FACT cmdline=$(cat /proc/cmdline)"
echo "FACT grubenv=$(grub-editenv /boot/grub/grubenv list | tr '\\n' ' ')"
echo "FACT etc_boot=$(find /etc /boot -iname '*rdna1*' | tr '\\n' ' ')"
echo "FACT grubcfg=$(grep -c rdna1 /boot/grub/grub.cfg)"
echo "FACT unit=$(journalctl -b --no-pager -o cat -u rdna1-kmgr-experiment.service | tr '\\n' '|')"
export PYTHONPATH={HOME}/standin STANDIN_SCRIPT={HOME}/standin.json
"""


class Bench:
    def __init__(self, system, python: str):
        self.system = system
        self.args = (
            f"--python {python} --sysroot {HOME}/sysroot --cells as-installed/miopen --quick "
            f"--case-timeout 300 --cell-timeout 1200 " + " ".join(f"--kernel-cell {c}" for c in CELLS)
        )

    def step(self, body: str, timeout: float = 1200, wait_for_unit: bool = True):
        # The unit runs after the multi-user target, as this step does: wait for it (a oneshot that stays
        # active: `start` returns at once once it has run).
        wait = "systemctl start rdna1-kmgr-experiment.service || true\n" if wait_for_unit else ""
        boot = self.system.boot(wait + FACTS + "set -e\n" + body, timeout=timeout)
        assert not boot.timed_out, f"the boot did not finish in {timeout} s:\n{boot.tail()}"
        assert boot.step_rc == 0, f"the step failed ({boot.step_rc}):\n{boot.step_out[-4000:]}\n{boot.tail(30)}"
        return boot, facts(boot.step_out)


@pytest.fixture(scope="module")
def bench(wholesystem_image_61, torch_python, tmp_path_factory) -> Bench:
    tmp = tmp_path_factory.mktemp("kernel-cells")
    system = new_system(wholesystem_image_61, tmp)
    board = rx5600xt(tmp / "sysroot").kmsg("amdgpu 0000:0a:00.0: amdgpu: SMU is initialized successfully!")
    venv = Path(torch_python).parent.parent
    with system.files() as root:
        install_tool(root)
        copy_into(root, venv)  # the owner's PyTorch, at the same path
        home = root / STEP_DIR
        shutil.copytree(STANDIN, home / "standin", dirs_exist_ok=True)
        shutil.copytree(board.root, home / "sysroot", symlinks=True, dirs_exist_ok=True)
        (home / "standin.json").write_text(
            json.dumps(
                {
                    "kmsg": f"{HOME}/sysroot/dev/kmsg",
                    "log": f"{HOME}/standin.log",
                    "cells": {
                        "as-installed/miopen": {
                            "do": "raise",
                            "at": "smoke",
                            "message": "HIP error: invalid device " "function",
                        }
                    },
                    "by_cmdline": BY_CMDLINE,
                }
            )
        )
    return Bench(system, torch_python)


def test_kernel_cells_start_stop_and_start_change_only_what_they_say(bench):
    ran = bench.system.chroot(
        [
            "sh",
            "-xc",
            f"""
echo "FACT etc_boot=$(find /etc /boot -iname '*rdna1*' | tr '\\n' ' ')"
set -e
rdna1-kmgr experiment kernel {bench.args} --dry-run
echo "FACT dry_etc_boot=$(find /etc /boot -iname '*rdna1*' | tr '\\n' ' ')"
rdna1-kmgr experiment kernel {bench.args}
rdna1-kmgr experiment status
echo "FACT started_grubenv=$(grub-editenv /boot/grub/grubenv list | tr '\\n' ' ')"
echo "FACT linux_lines=$(grep -cE '^[[:space:]]*linux[[:space:]]' /boot/grub/grub.cfg)"
echo "FACT linux_lines_cells=$(grep -E '^[[:space:]]*linux[[:space:]]' /boot/grub/grub.cfg | grep -c 'rdna1_kmgr_cell_args')"
rdna1-kmgr experiment stop
echo "FACT stopped_etc_boot=$(find /etc /boot -iname '*rdna1*' | tr '\\n' ' ')"
echo "FACT stopped_grubenv=$(grub-editenv /boot/grub/grubenv list | tr '\\n' ' ')"
echo "FACT stopped_grubcfg=$(grep -c rdna1 /boot/grub/grub.cfg || true)"
rdna1-kmgr experiment status
rdna1-kmgr experiment kernel {bench.args}
""",
        ],
        env={"PYTHONPATH": f"{HOME}/standin", "STANDIN_SCRIPT": f"{HOME}/standin.json"},
    )
    out = ran.stdout + ran.stderr
    assert ran.returncode == 0, f"the chroot's commands failed ({ran.returncode}):\n{out[-4000:]}"
    found = facts(ran.stdout)
    assert found["etc_boot"] == "" and found["dry_etc_boot"] == "", found  # the dry run wrote nothing
    for n, cell in enumerate(CELLS, 1):
        assert f"{n}. {cell}:" in out
    assert (
        "rdna1_kmgr_cell=armed" in found["started_grubenv"]
        and "rdna1_kmgr_cell_name=cwsr-off" in found["started_grubenv"]
        and "rdna1_kmgr_cell_parameter=amdgpu.cwsr_enable=0" in found["started_grubenv"]
    )
    assert int(found["linux_lines"]) >= 2 and found["linux_lines_cells"] == found["linux_lines"], found
    # stop: nothing of the experiment in /etc, /boot, grubenv or grub.cfg
    assert found["stopped_etc_boot"] == "", found
    assert "rdna1" not in found["stopped_grubenv"] and found["stopped_grubcfg"] == "0", found


def test_kernel_cells_first_boot_runs_its_cell_and_arms_the_next(bench):
    boot, found = bench.step("rdna1-kmgr experiment status\n")
    words = found["cmdline"].split()
    assert "amdgpu.cwsr_enable=0" in words and "rdna1_kmgr.cell=cwsr-off" in words, found
    assert "as-installed/miopen: pass" in found["unit"], found["unit"]
    assert "rdna1_kmgr_cell=armed" in found["grubenv"] and "rdna1_kmgr_cell_name=small-bar" in found["grubenv"]
    assert "1. cwsr-off" in boot.step_out and "done: pass" in boot.step_out


def test_kernel_cells_second_boot_is_killed(bench):
    killed = bench.system.boot(None, timeout=900, kill_on=AMDGPU_LOADED)
    assert killed.killed, f"amdgpu never loaded in the cell's boot:\n{killed.tail()}"
    assert "rdna1_kmgr.cell=small-bar" in killed.console and "amdgpu.vis_vramlimit=256" in killed.console


def test_kernel_cells_boot_after_a_hang_is_normal_and_records_it(bench):
    boot, found = bench.step("rdna1-kmgr experiment status\n")
    assert "rdna1_kmgr.cell" not in found["cmdline"] and "amdgpu.vis_vramlimit" not in found["cmdline"], found
    assert "recorded as a hang" in found["unit"], found["unit"]
    assert "rdna1_kmgr_cell_name=vm-update-sdma" in found["grubenv"] and "rdna1_kmgr_cell=armed" in found["grubenv"]
    assert "2. small-bar" in boot.step_out and "done: hang" in boot.step_out


def test_kernel_cells_last_boot_ends_the_experiment(bench):
    boot, found = bench.step("""
echo "FACT after_etc_boot=$(find /etc /boot -iname '*rdna1*' | tr '\\n' ' ')"
echo "FACT after_grubenv=$(grub-editenv /boot/grub/grubenv list | tr '\\n' ' ')"
rdna1-kmgr experiment status
""")
    assert "amdgpu.vm_update_mode=0" in found["cmdline"].split(), found
    assert "as-installed/miopen: wrong" in found["unit"], found["unit"]
    assert found["after_etc_boot"] == "" and "rdna1" not in found["after_grubenv"], found


def test_kernel_cells_machine_boots_normally_with_the_table(bench):
    boot, found = bench.step(
        """
rdna1-kmgr experiment status
echo RECORD-BEGIN
cat /var/lib/rdna1-kmgr/experiments/kernel-latest.json
echo RECORD-END
""",
        wait_for_unit=False,
    )
    # apply and rollback write files and run update-grub: in the powered-off system, natively
    ran = bench.system.chroot(
        [
            "sh",
            "-xc",
            """
set -e
rdna1-kmgr experiment apply --kernel --dry-run
echo "FACT dry_etc=$(find /etc -iname '*rdna1*' | tr '\n' ' ')"
rdna1-kmgr experiment apply --kernel
echo "FACT applied_grubcfg=$(grep -E '^[[:space:]]*linux[[:space:]]' /boot/grub/grub.cfg | grep -c 'amdgpu.cwsr_enable=0')"
echo "FACT applied_etc=$(find /etc -iname '*rdna1*' | tr '\n' ' ')"
rdna1-kmgr rollback --yes
echo "FACT rolled_back_etc_boot=$(find /etc /boot -iname '*rdna1*' | tr '\n' ' ')"
echo "FACT rolled_back_grubcfg=$(grep -c -e rdna1 -e cwsr_enable /boot/grub/grub.cfg || true)"
rdna1-kmgr rollback --yes
""",
        ]
    )
    assert ran.returncode == 0, f"apply or rollback failed ({ran.returncode}):\n{(ran.stdout + ran.stderr)[-4000:]}"
    found |= facts(ran.stdout)
    assert "rdna1" not in found["cmdline"] and found["etc_boot"] == "" and found["grubcfg"] == "0", found
    assert "rdna1" not in found["grubenv"], found
    out = boot.step_out
    block = out[out.index("\nRECORD-BEGIN\n") : out.index("\nRECORD-END\n")]  # sh -x's trace lines around it
    record = json.loads(block[block.index("\n{") : block.rindex("\n}") + 2])
    table = {(r["kernel"], r["cell"]): r["outcome"] for r in record["rows"]}
    assert table == {
        ("cwsr-off", "as-installed/miopen"): "pass",
        ("small-bar", "as-installed/miopen"): "hang",
        ("vm-update-sdma", "as-installed/miopen"): "wrong",
    }, table
    assert record["answer"][0].startswith("smallest change that passes: kernel cell cwsr-off (amdgpu.cwsr_enable=0)")
    # apply: the answer on every boot's command line through GRUB, journaled; rollback takes it away again
    assert found["dry_etc"] == "", found
    assert found["applied_etc"] == "/etc/default/grub.d/rdna1-kmgr.parameters.cfg", found
    assert int(found["applied_grubcfg"]) >= 2, found  # every kernel line, recovery ones too
    assert found["rolled_back_etc_boot"] == "" and found["rolled_back_grubcfg"] == "0", found
    assert "nothing installed by rdna1-kmgr" in ran.stdout + ran.stderr  # the second rollback: nothing left to undo
