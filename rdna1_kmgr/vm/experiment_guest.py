"""The VMs of the experiment: each batch of cells is one boot of the module's kernel running
qemu/guest/matrix.py, emulated (tests: the CPU against the CPU) or with the board passed through.

A VM's hard limit is a boot allowance plus every cell's limit and its load/unload: the guest enforces each
cell's own limit, and the VM's is the backstop for a guest that stops answering altogether.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.core.paths import log_dir
from rdna1_kmgr.modbuild import module_elf
from rdna1_kmgr.vm import engine, experiment, guest, guest_kernel, guest_registry, guest_view, verdict

BOOT_ALLOWANCE = 240  # seconds: a TCG boot under load, the dependencies' modprobe
CELL_OVERHEAD = 120  # seconds per cell beyond its workload limit: insmod and rmmod of a 17-350 MB module
QUIRKS_PARAM = "rdna1_quirks"


def batch_runner(
    release: str,
    module: Path | None,
    workload: dict | None,
    cell_timeout: float,
    accel: str = "auto",
    fetch: bool = False,
    base_env: dict[str, str] | None = None,
    devices: tuple[str, ...] = (),
    show: tuple[Path, ...] = (),
) -> experiment.BatchRunner:
    """A function that runs a list of cells in one fresh VM of `release` and returns the guest's result.

    `module`: the amdgpu.ko each cell loads with its mask (None: cells run the workload alone).
    `workload`: changes to engine.workload_plan("conv2d")'s dict: `args` for the script (the sweep),
    `device`, `pythons` (guest paths; the default is rdna1-kmgr's own venv, mapped into the guest).
    `base_env`: the user's ROCm settings as installed, the "as installed" profile's environment.
    `devices`: PCI addresses on vfio-pci the guest gets (the board); `show`: host folders the guest must see,
    read-only at their own paths.
    """
    vm = guest_registry.find(engine.PASSTHROUGH_GUEST)  # the cells run with the board passed, udev and all
    kernel = guest_kernel.locate(release, fetch=fetch)
    facts = module_elf.read(module, verdict.INIT_MESSAGES) if module is not None else None
    logs = log_dir() / "vm-test"
    try:
        logs.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise HostError(
            f"cannot write the console logs under {logs}: {err.strerror}",
            "run as root, or point RDNA1_KMGR_LOG at a writable folder",
        ) from None
    chosen: list[engine.Accel] = []

    def run_batch(cells: list[experiment.Cell], attempt: int) -> experiment.Batch:
        with tempfile.TemporaryDirectory(prefix="rdna1-kmgr-matrix-") as tmp:
            rundir = Path(tmp)
            plan: dict[str, Any] = {
                "name": facts.name if facts else "amdgpu",
                "module": None,
                "depends": [],
                "cells": [c.plan() for c in cells],
                "workload": workload,
                "base_env": dict(base_env or {}),
                "cell_timeout": cell_timeout,
                "quirks_param": bool(facts and QUIRKS_PARAM in facts.parameters),
            }
            view = guest_view.prepare(rundir, with_venv=True)
            for folder in show:
                view.show(folder)
            plan["workload"] = {**engine.workload_plan("conv2d", view), **(workload or {})}
            if facts is not None:
                copy = rundir / facts.path.name
                shutil.copyfile(facts.path, copy)
                plan.update(module=view.guest_path(copy), depends=list(facts.depends))
            (rundir / "plan.json").write_text(json.dumps(plan, indent=1))
            if not chosen:
                chosen.append(engine.choose_accel(accel, kernel, vm.qemu, rundir))
            limit = BOOT_ALLOWANCE + len(cells) * (cell_timeout + CELL_OVERHEAD)
            console = logs / f"{time.strftime('%Y%m%dT%H%M%S')}-matrix-vm{attempt}.log"
            command = engine.guest_command(view, "matrix.py")
            request = guest.GuestRequest(kernel, rundir, console, chosen[0].name, limit, devices, command, view)
            run = vm.boot(request)
            if run.outcome.timed_out:
                ended = "timeout"
            elif run.result is not None and run.result.get("finished"):
                ended = None
            else:
                ended = f"the VM ended (exit {run.outcome.returncode}): {run.console_tail(3)}"
            return experiment.Batch(run.result, ended)

    return run_batch
