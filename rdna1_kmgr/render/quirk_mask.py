"""The module's rdna1_quirks mask, one value from `install --quirks` to modprobe.d and GRUB.

Parsed once where it comes in (the command line's 0x3, 3 or 0b11; a kernel cell's command-line word; GRUB's
environment; a manifest's number) and formatted only where it goes out, each in that place's own form:

    modprobe.d(5)        options amdgpu rdna1_quirks=0x3      (modprobe_options)
    the kernel command   amdgpu.rdna1_quirks=0x3              (kernel_parameter; what GRUB's boot guard and
    line                                                       an experiment's kernel cell put there)
    journals, JSON,      0x3                                  (str)
    the lines a user reads
"""

from __future__ import annotations

from dataclasses import dataclass

from rdna1_kmgr.core.errors import UsageError

MODULE = "amdgpu"
PARAMETER = "rdna1_quirks"
KERNEL_PREFIX = f"{MODULE}.{PARAMETER}="  # the kernel command line's spelling for a module's parameter
LIMIT = 1 << 31  # the module parameter is a C int; the sign bit is no quirk
_HINT = "give a number such as 0x1 (see `rdna1-kmgr quirks`)"


@dataclass(frozen=True)
class QuirkMask:
    bits: int

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not 0 <= self.bits < LIMIT:
            raise UsageError(f"invalid quirk mask {self.bits!r}", _HINT)

    @classmethod
    def parse(cls, text: str) -> QuirkMask:
        """0x3, 3 or 0b11 (what `install --quirks` and the kernel take); anything else is one clear line."""
        try:
            bits = int(text, 0)
        except (TypeError, ValueError):
            bits = -1
        if not 0 <= bits < LIMIT:
            raise UsageError(f"invalid quirk mask {text!r}", _HINT)
        return cls(bits)

    @classmethod
    def from_kernel_parameter(cls, word: str) -> QuirkMask | None:
        """The mask of an `amdgpu.rdna1_quirks=...` word; None for any other word."""
        return cls.parse(word[len(KERNEL_PREFIX) :]) if word.startswith(KERNEL_PREFIX) else None

    def __str__(self) -> str:
        return f"0x{self.bits:x}"

    @property
    def parameter(self) -> str:
        """rdna1_quirks=0x3: the module parameter, as modprobe and modinfo write it."""
        return f"{PARAMETER}={self}"

    @property
    def kernel_parameter(self) -> str:
        """amdgpu.rdna1_quirks=0x3: the kernel command line's word for it."""
        return f"{MODULE}.{self.parameter}"

    @property
    def modprobe_options(self) -> str:
        """The modprobe.d(5) line that gives the module this mask."""
        return f"options {MODULE} {self.parameter}"

    def outside(self, carried: QuirkMask) -> QuirkMask:
        """The bits of this mask that `carried` lacks."""
        return QuirkMask(self.bits & ~carried.bits)
