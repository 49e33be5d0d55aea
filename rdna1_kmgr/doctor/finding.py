"""One finding of `doctor`: what was seen, why it matters for the board, what to do."""

from __future__ import annotations

from dataclasses import dataclass, field

# How a finding weighs, mildest first. `problem`: ROCm compute on the board will fail or is at risk as it
# stands; `warn`: it may, or a check could not be made; `ok`: as it should be; `info`: a fact to know.
LEVELS = ("info", "ok", "warn", "problem")


@dataclass(frozen=True)
class Finding:
    check: str  # a short name: board, kfd, gfx-override, rocblas, torch, ...
    level: str
    seen: str
    why: str = ""
    todo: str = ""
    facts: dict = field(default_factory=dict)  # the raw values behind `seen`, for --json

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"unknown finding level {self.level!r}")

    def to_json(self) -> dict:
        return {
            "check": self.check,
            "level": self.level,
            "seen": self.seen,
            "why": self.why,
            "todo": self.todo,
            "facts": self.facts,
        }


def log_not_read(check: str, what: str) -> Finding:
    """What a kernel-log check says when the log cannot be read: a log an owner may not read
    (kernel.dmesg_restrict=1) must not pass for a clean one."""
    return Finding(
        check,
        "info",
        f"{what} not checked: the kernel log could not be read (kernel.dmesg_restrict=1 keeps it root's)",
        "",
        "run `sudo rdna1-kmgr doctor` to check them",
    )
