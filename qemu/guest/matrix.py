"""Guest side of `rdna1-kmgr vm-test matrix BDF`: the experiment's cells, one after another, in this VM.

    python3 -I -S matrix.py RUNDIR

RUNDIR/plan.json: the module (or none: the workload alone), its dependencies, the cells (each a quirk
mask and a user-space environment), the workload and the time limit per cell. For each cell: load the
module with rdna1_quirks=MASK, run the workload in the cell's environment, unload. RUNDIR/result.json is
rewritten when a cell starts and when it ends, so the host knows which cell a VM that died or hung was in.

A cell whose workload hung (its time limit) or died of a signal, or after which the module would not
unload, may have left the GPU in a state no later cell should inherit: the batch stops there and the host
starts a fresh VM for the cells left. Facts only; the host classifies them (rdna1_kmgr/vm/experiment.py).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's folder out

from collect import KernelLog, module_state, run, run_workload  # noqa: E402

QUIRKS_PARAM = "rdna1_quirks"


def cell_environment(base: dict, cell: dict) -> dict:
    """This guest's environment, then the user's ROCm settings as installed (`base`), then the cell's."""
    env = {**os.environ, **base}
    for name in cell.get("unset", ()):
        env.pop(name, None)
    env.update(cell.get("set", {}))
    return env


def leaves_gpu_suspect(entry: dict) -> bool:
    """A cell after which the next one deserves a fresh VM."""
    runs = (entry.get("workload") or {}).get("runs") or []
    last = runs[-1] if runs else {}
    if last.get("rc") is None and runs:  # timed out (or could not start at all: then rc None too)
        return "timed out" in (last.get("output") or "")
    if isinstance(last.get("rc"), int) and last["rc"] < 0:  # killed by a signal
        return True
    unload = entry.get("unload")
    return unload is not None and unload.get("rc") != 0


def main(rundir: str) -> int:
    with open(os.path.join(rundir, "plan.json")) as handle:
        plan = json.load(handle)
    name, module, timeout = plan.get("name", "amdgpu"), plan.get("module"), plan["cell_timeout"]
    log = KernelLog()
    result = {"finished": False, "kernel": os.uname().release, "cells": [], "stopped_after": None}

    def save():
        tmp = os.path.join(rundir, "result.json.tmp")
        with open(tmp, "w") as out:
            json.dump(result, out, indent=1)
        os.replace(tmp, os.path.join(rundir, "result.json"))

    save()
    if module and plan.get("depends"):
        log.stage("depends")
        result["depends"] = run(["modprobe", "-a", *plan["depends"]], 300)
    for cell in plan["cells"]:
        entry = {"id": cell["id"], "started": True, "done": False}
        result["cells"].append(entry)
        save()
        log.stage(f"cell {cell['id']}")
        if module:
            params = [f"{QUIRKS_PARAM}={cell['mask']}"] if plan.get("quirks_param", True) else []
            entry["load"] = run(["insmod", module, *params], 300)
            entry["load"]["state"] = module_state(name, [QUIRKS_PARAM])
            save()
        if not module or entry["load"]["rc"] == 0:
            entry["workload"] = run_workload(
                plan["workload"], timeout, cell_environment(plan.get("base_env", {}), cell)
            )
            save()
            if module:
                entry["unload"] = run(["rmmod", name], 120)
        entry["log"] = log.new_lines()[-200:]
        entry["done"] = True
        save()
        if leaves_gpu_suspect(entry):
            result["stopped_after"] = cell["id"]
            break
    result["finished"] = True
    save()
    log.stage("done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
