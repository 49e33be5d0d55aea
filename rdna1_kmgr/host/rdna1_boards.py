"""The first-generation RDNA boards this tool knows, as amdgpu's pciidlist has them."""

from dataclasses import dataclass

AMD_VENDOR = 0x1002
DEFAULT_TARGET = 0x731F  # Radeon RX 5600 XT


@dataclass(frozen=True)
class Rdna1Chip:
    name: str
    device_ids: tuple[int, ...]


CHIPS = (
    Rdna1Chip("navi10", (0x7310, 0x7312, 0x7318, 0x7319, 0x731A, 0x731B, 0x731E, 0x731F)),
    Rdna1Chip("navi14", (0x7340, 0x7341, 0x7347, 0x734F)),
    Rdna1Chip("navi12", (0x7360, 0x7362)),
)

RDNA1_IDS = tuple(sorted(i for chip in CHIPS for i in chip.device_ids))


def chip_of(device_id: int) -> str | None:
    for chip in CHIPS:
        if device_id in chip.device_ids:
            return chip.name
    return None


def family_ids(device_ids) -> tuple[int, ...]:
    """Every id of the chips these boards are, sorted: an RX 5500 XT (0x7340) gives navi14's four. amdgpu's
    pciidlist names one chip by several ids (board variants), and an owner's board may be any of them."""
    return tuple(sorted({i for chip in CHIPS if set(chip.device_ids) & set(device_ids) for i in chip.device_ids}))


def is_rdna1(vendor: int, device: int) -> bool:
    return vendor == AMD_VENDOR and device in RDNA1_IDS


def format_id(device_id: int) -> str:
    return f"0x{device_id:04X}"
