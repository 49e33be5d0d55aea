"""A stand-in GPU for the host experiment's tests, on the workload's PYTHONPATH (Python imports
sitecustomize at start-up): a real CPU build of torch plays the board, and STANDIN_SCRIPT (JSON; else a
standin.json beside this folder) says what
each cell does, by the cell id the experiment gives the workload (RDNA1_KMGR_CELL):

    {"kmsg": "<the fake /dev/kmsg>", "log": "<a JSON-lines file of what each cell saw>",
     "cells": {"<profile>/<backend>": {"do": "pass|wrong|raise|abort|hang|compile|ring|reset-failed|no-gpu",
                                        "at": "<case name prefix>", "message": "<error text>",
                                        "triton": true}},
     "by_cmdline": {"<a word of /proc/cmdline>": {the same, for every cell of a boot with that word}}}

Tensors "on the GPU" are CPU tensors; what comes back to the host (Tensor.cpu) is where "wrong" adds 1.
The other behaviours act when the workload moves a tensor to the GPU during the case named by "at".
"triton": a Triton is there in the triton stage (an empty `triton` module) and torch.compile returns the function as it is (the
CPU build has no Triton, and inductor's C++ compilation would take minutes here); without it the workload
finds no Triton, as on a real CPU build.
"""

import importlib.util
import json
import os
import sys
import time

# Else standin.json beside this folder: a kernel cell's boot gets only the variables a cell needs (plan.json).
_BESIDE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "standin.json")
SCRIPT = os.environ.get("STANDIN_SCRIPT") or (_BESIDE if os.path.exists(_BESIDE) else None)

# Only in a Python with torch: the tool itself, started with the same environment, has none.
if SCRIPT and importlib.util.find_spec("torch") is not None:
    import torch

    with open(SCRIPT) as handle:
        PLAN = json.load(handle)
    CELL = os.environ.get("RDNA1_KMGR_CELL", "")
    DOES = PLAN["cells"].get(CELL, {"do": "pass"})
    # The kernel axis: a word of this boot's command line decides, over the cell (the whole-system test).
    with open("/proc/cmdline") as handle:
        WORDS = handle.read().split()
    DOES = next((does for word, does in PLAN.get("by_cmdline", {}).items() if word in WORDS), DOES)
    DONE = set()

    def log(**fields):
        with open(PLAN["log"], "a") as out:
            out.write(json.dumps({"cell": CELL, "pid": os.getpid(), **fields}) + "\n")

    def kmsg(message):
        with open(PLAN["kmsg"], "a") as out:
            seq = int(time.time() * 1000) % 10**9
            out.write(f"3,{seq},{seq},-;amdgpu 0000:0a:00.0: amdgpu: {message}\n")

    def current_case():
        return getattr(sys.modules.get("__main__"), "CURRENT_CASE", None) or ""

    def here():
        return current_case().startswith(DOES.get("at", "smoke"))

    def on_device():
        if "caches" not in DONE:  # what MIOpen would find and write, once per process
            DONE.add("caches")
            db, cache = os.environ.get("MIOPEN_USER_DB_PATH"), os.environ.get("MIOPEN_CUSTOM_CACHE_DIR")
            log(
                event="start",
                db=db,
                cache=cache,
                db_before=sorted(os.listdir(db)),
                cache_before=sorted(os.listdir(cache)),
                cudnn=torch.backends.cudnn.enabled,
                benchmark=torch.backends.cudnn.benchmark,
                env={k: v for k, v in os.environ.items() if k.startswith(("MIOPEN_DEBUG", "HSA_", "ROC_", "AMDGCN_"))},
            )
            with open(os.path.join(db, f"gfx1010_18.{CELL.replace('/', '--')}.udb.txt"), "w") as out:
                out.write(CELL)
        do = DOES["do"]
        if do == "pass" or not here() or do in DONE:
            return
        DONE.add(do)
        if do == "raise":
            raise RuntimeError(DOES["message"])
        if do == "abort":
            for line in DOES.get("kmsg", []):  # what the kernel logged before the runtime gave up
                kmsg(line)
            sys.stderr.write(DOES["message"] + "\n")
            sys.stderr.flush()
            os.abort()
        if do in ("hang", "reset-failed"):
            import subprocess

            child = subprocess.Popen(["sleep", "3600"])  # a child in the cell's process group: killed with it
            log(event="hang", child=child.pid)
            if do == "reset-failed":
                kmsg("ring comp_1.0.0 timeout, signaled seq=1234, emitted seq=1236")
                kmsg("GPU reset begin!")
                kmsg("GPU reset(1) failed")
            time.sleep(3600)
        if do == "compile":  # minutes of MIOpen compiling, shortened: the cache grows, nothing is printed
            cache = os.environ["MIOPEN_CUSTOM_CACHE_DIR"]
            for i in range(int(DOES.get("steps", 12))):
                with open(os.path.join(cache, f"kernel{i}.hsaco"), "wb") as out:
                    out.write(b"\0" * 4096)
                time.sleep(0.5)
        if do == "ring":
            kmsg("ring comp_1.0.0 timeout, signaled seq=1234, emitted seq=1236")

    def is_gpu(value):
        return (isinstance(value, torch.device) and value.type == "cuda") or (
            isinstance(value, str) and value.startswith("cuda")
        )

    _to, _cpu = torch.Tensor.to, torch.Tensor.cpu

    def to(self, *args, **kwargs):
        if any(is_gpu(a) for a in args) or is_gpu(kwargs.get("device")):
            on_device()
            args = tuple("cpu" if is_gpu(a) else a for a in args)
            if is_gpu(kwargs.get("device")):
                kwargs["device"] = "cpu"
        return _to(self, *args, **kwargs)

    def cpu(self, *args, **kwargs):
        out = _cpu(self, *args, **kwargs)
        if DOES["do"] == "wrong" and here():
            out = out + 1.0
        return out

    torch.Tensor.to, torch.Tensor.cpu = to, cpu
    if DOES.get("triton"):
        import importlib.abc
        import importlib.machinery

        class TritonInItsStage(importlib.abc.MetaPathFinder, importlib.abc.Loader):
            """`import triton` finds an empty module during the workload's triton stage only: torch itself looks
            for Triton too (torch.optim does) and would go on into triton.language."""

            def find_spec(self, name, path=None, target=None):
                if name == "triton" and current_case().startswith("triton"):
                    return importlib.machinery.ModuleSpec(name, self)
                return None

            def create_module(self, spec):
                return None

            def exec_module(self, module):
                pass

        sys.meta_path.insert(0, TritonInItsStage())
        torch.compile = lambda fn=None, **options: fn
    torch.Tensor.cuda = lambda self, *a, **k: to(self, "cuda")
    torch.cuda.is_available = lambda: DOES["do"] != "no-gpu"  # "no-gpu": a torch that sees no GPU
    torch.cuda.get_device_name = lambda *a: "AMD Radeon RX 5600 XT (stand-in)"
    torch.version.hip = "7.1.52802-standin"
    torch.backends.cudnn.version = lambda: 3005000
