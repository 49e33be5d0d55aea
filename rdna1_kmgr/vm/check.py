"""One check of the VM verdict (a rule's name, whether it held, what was seen), and the readers of a guest step
that the emulated rules (verdict.py) and the passthrough rules (gpu_checks.py) share."""

from __future__ import annotations

from dataclasses import dataclass

MODULE_NAME = "amdgpu"  # the module under test


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def messages(step) -> list[str]:
    return step.get("log", []) if step else []


def first_line(text: str) -> str:
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "")


def last_line(text: str) -> str:
    kept = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return kept[-1] if kept else "no output"
