"""What one cell of the experiment can end as, and the backend settings it runs with: shared by the host
experiment (rdna1_kmgr/experiment/) and the VFIO matrix (experiment.py here), which run the same workload
(qemu/guest/conv2d.py --sweep experiment) and print the same table.

An outcome is read from what happened, not only pass or crash: the text of the failure names the kind
(HIP's and ROCr's own messages), the kernel log says whether the GPU hung, the time limit whether the
workload did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Outcome:
    name: str
    meaning: str
    colour: str  # for the HTML grid


# In the order the table's legend lists them; the first is the only one that passes.
OUTCOMES = (
    Outcome("pass", "every case within the dtype's tolerance of the CPU", "#4caf50"),
    Outcome("wrong", "it ran, and numbers differ from the CPU beyond the dtype's tolerance", "#ff9800"),
    Outcome(
        "not-applicable", 'MIOpen has no solver for a case with these settings ("No suitable algorithm")', "#bdbdbd"
    ),
    Outcome("invalid-device-function", "HIP found no code for the board's processor in a library", "#e57373"),
    Outcome(
        "kernel-image-invalid",
        '"device kernel image is invalid": a code object missing or not loadable ' "(TheRock: the device wheel)",
        "#e57373",
    ),
    Outcome(
        "queue-failed",
        "KFD refused the compute queue (HSA_STATUS_ERROR_OUT_OF_RESOURCES): on kernels >= 6.12 its control-stack "
        "or CWSR size check; `rdna1-kmgr doctor`'s queue finding says which",
        "#d32f2f",
    ),
    Outcome("memory-fault", 'the GPU faulted on an address ("Memory access fault by GPU")', "#b71c1c"),
    Outcome("hang", "a case made no progress within its limit and the cell was killed", "#7b1fa2"),
    Outcome("ring-timeout", "amdgpu logged a ring timeout during the cell", "#4a148c"),
    Outcome("gpu-reset", "amdgpu reset the GPU during the cell", "#311b92"),
    Outcome("crash", "the workload died another way (a signal, another error)", "#c62828"),
    Outcome("not-run", "the workload could not run (no torch with a GPU): no verdict on the board", "#eeeeee"),
)
NAMES = tuple(o.name for o in OUTCOMES)
BY_NAME = {o.name: o for o in OUTCOMES}

# Error text -> outcome, the most specific first (a fault's abort message may follow a HIP error).
_TEXT = (
    ("memory-fault", re.compile(r"Memory access fault by GPU|memory access fault", re.I)),
    # ROCr's KfdDriver::CreateQueue turns any AMDKFD_IOC_CREATE_QUEUE failure into OUT_OF_RESOURCES; CLR logs
    # "Device::acquireQueue: hsa_queue_create failed!" (rocdevice.cpp) when a stream's queue cannot be made
    ("queue-failed", re.compile(r"HSA_STATUS_ERROR_OUT_OF_RESOURCES|hsa_queue_create failed")),
    (
        "kernel-image-invalid",
        re.compile(r"device kernel image is invalid|kpack_load_code_object|hipErrorInvalidImage", re.I),
    ),
    ("invalid-device-function", re.compile(r"invalid device function|hipErrorInvalidDeviceFunction", re.I)),
    ("not-applicable", re.compile(r"No suitable algorithm|miopenStatusUnsupportedOp|not applicable", re.I)),
)


def from_text(text: str) -> str | None:
    """The outcome a failure's text names, or None when it names none of them."""
    for name, pattern in _TEXT:
        if pattern.search(text or ""):
            return name
    return None


def from_cases(cases: list[dict]) -> tuple[str, dict] | None:
    """(outcome, first bad case) from the workload's report: an error case by its text, else a case off (wrong);
    None when every case passed (skipped ones included)."""
    errors = [c for c in cases if c.get("outcome") == "error"]
    if errors:
        return from_text(errors[0].get("error", "")) or "crash", errors[0]
    wrong = [c for c in cases if not c.get("ok")]
    return ("wrong", wrong[0]) if wrong else None


@dataclass(frozen=True)
class Backend:
    name: str
    cudnn: bool  # torch.backends.cudnn.enabled: MIOpen on ROCm; off, PyTorch's own convolutions
    benchmark: bool  # torch.backends.cudnn.benchmark: MIOpen benchmarks its solvers per shape
    code: str  # what the owner's program says to get it ("" for PyTorch's default)

    def workload_args(self) -> list[str]:
        return ["--cudnn", "on" if self.cudnn else "off", "--benchmark", "on" if self.benchmark else "off"]


# PyTorch's default first: it changes nothing in the owner's code.
BACKENDS = {
    "miopen": Backend("miopen", True, False, ""),
    "miopen-benchmark": Backend("miopen-benchmark", True, True, "torch.backends.cudnn.benchmark = True"),
    "no-miopen": Backend("no-miopen", False, False, "torch.backends.cudnn.enabled = False"),
}
DEFAULT_BACKEND = "miopen"
