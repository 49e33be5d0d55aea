"""The variables that choose which GPUs ROCm shows a program, wherever they are set: a common cause of "torch sees
no GPU" (torch.cuda.is_available() False, device_count() 0).

ROCr (ROCR_VISIBLE_DEVICES) picks, by index among the machine's GPUs in KFD's node order or by `GPU-<uuid>`, the
GPU agents the runtime enumerates; HIP then picks among those with HIP_VISIBLE_DEVICES, else
CUDA_VISIBLE_DEVICES, which HIP honours too (HIP's docs, "HIP environment variables"); GPU_DEVICE_ORDINAL is
OpenCL's and HIP's older name. An empty value hides every GPU; an index past the GPUs there are, or a list that
leaves out the board's index, hides the board.
"""

from __future__ import annotations

from rdna1_kmgr.doctor.finding import Finding
from rdna1_kmgr.doctor.gfx_override import effective
from rdna1_kmgr.userspace import environment_files

ROCR = "ROCR_VISIBLE_DEVICES"
HIP_NAMES = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")  # HIP's order of preference
NAMES = (ROCR, *HIP_NAMES)


def wanted(name: str) -> bool:
    return name in NAMES


def in_force(found: list[environment_files.Assignment], name: str) -> environment_files.Assignment | None:
    """The assignment of `name` in force, as for every other variable doctor reads (gfx_override.effective)."""
    return effective([a for a in found if a.name == name])


def chosen(value: str, among: list[int]) -> list[int] | None:
    """The GPUs (indexes into the machine's) a value leaves visible out of `among`; None when it names a UUID,
    which only the runtime can match."""
    picked = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        if not item.isdigit():
            return None
        if int(item) >= len(among):
            break  # ROCr and HIP stop at the first index past the end
        picked.append(among[int(item)])
    return picked


def findings(
    found: list[environment_files.Assignment], gpus: int, board_index: int | None, checked: str
) -> list[Finding]:
    """`gpus`: the machine's GPU nodes in KFD's order; `board_index`: the RDNA1 board's place among them."""
    rocr = in_force(found, ROCR)
    hip = next((a for a in (in_force(found, n) for n in HIP_NAMES) if a is not None), None)
    settings = [a for a in (rocr, hip) if a is not None]
    if not settings:
        return [Finding("visible-devices", "ok", f"none of {', '.join(NAMES)} is set ({checked})", "", "", {})]
    where = "; ".join(f"{a.name}={a.value!r} in {a.where()}" for a in settings)
    facts = {"assignments": [a.to_json() for a in settings], "gpus": gpus, "board_index": board_index}
    visible: list[int] | None = list(range(gpus))
    for setting in settings:
        if visible is not None and setting.value is not None:
            visible = chosen(setting.value, visible)
    if board_index is None:
        return [Finding("visible-devices", "info", f"{where} (no RDNA1 board here to check it against)", "", "", facts)]
    fix = "; ".join(_remedy(a) for a in settings)
    if visible is None:
        return [
            Finding(
                "visible-devices",
                "warn",
                f"{where}: names a GPU by UUID, which doctor cannot match to the board",
                "a UUID of another GPU hides the board from ROCm and PyTorch",
                f"if torch sees no GPU: {fix}",
                facts,
            )
        ]
    if board_index not in visible:
        return [
            Finding(
                "visible-devices",
                "problem",
                f"{where}: hides the board (GPU {board_index} of {gpus}; visible: {visible or 'none'})",
                "ROCm shows programs only the GPUs these name: torch.cuda.is_available() is False, or torch "
                "runs on another GPU",
                fix,
                facts,
            )
        ]
    return [
        Finding(
            "visible-devices",
            "info",
            f"{where}: the board (GPU {board_index} of {gpus}) stays visible",
            "",
            "",
            facts,
        )
    ]


def _remedy(assignment: environment_files.Assignment) -> str:
    if assignment.scope == "process":
        return f"`unset {assignment.name}` in that shell, and remove the line that set it"
    return f"edit {assignment.path} and delete (or correct) line {assignment.line}"
