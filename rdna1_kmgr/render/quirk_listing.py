"""The quirk catalog as `rdna1-kmgr quirks` shows it: each quirk with its bits, what it changes, where it matters,
the evidence that owners need it, when it is left out, and the facts of the source that choose each variant.

quirk_catalog.py loads the catalog; this is its read-only view for people and scripts (`quirks --json`: these
fields, facts as the one-line text they print as).
"""

from __future__ import annotations

from dataclasses import dataclass

from rdna1_kmgr.host.rdna1_boards import format_id
from rdna1_kmgr.render import quirk_catalog


@dataclass(frozen=True)
class NeededWhen:
    fact: str  # what the kernel has that the quirk fixes
    otherwise: str  # what leaving it out means where the fact fails


@dataclass(frozen=True)
class FixedWhen:
    fact: str  # upstream's own fix, as recognised
    because: str


@dataclass(frozen=True)
class BitEntry:
    bit: int
    id: str
    mask: str  # the bit as an rdna1_quirks mask, 0x0002 style
    title: str
    default: bool  # on when rdna1_quirks is not given
    risk: str


@dataclass(frozen=True)
class VariantEntry:
    id: str
    kernels: str  # the releases it was written for
    facts: tuple[str, ...]  # what the tree must show for this variant to be chosen


@dataclass(frozen=True)
class QuirkEntry:
    id: str
    summary: str
    changes: str
    scope: str
    evidence: tuple[str, ...]
    needed_when: tuple[NeededWhen, ...]
    fixed_when: tuple[FixedWhen, ...]
    bits: tuple[BitEntry, ...]
    variants: tuple[VariantEntry, ...]


@dataclass(frozen=True)
class QuirkListing:
    """The whole catalog, in bit order."""

    quirks: tuple[QuirkEntry, ...]


def _entry(q: quirk_catalog.Quirk) -> QuirkEntry:
    return QuirkEntry(
        id=q.id,
        summary=q.summary,
        changes=q.changes,
        scope=q.scope,
        evidence=tuple(q.evidence),
        needed_when=tuple(NeededWhen(str(n.fact), n.otherwise) for n in q.needed_when),
        fixed_when=tuple(FixedWhen(str(f.fact), f.because) for f in q.fixed_when),
        bits=tuple(BitEntry(b.bit, b.id, format_id(1 << b.bit), b.title, b.default, b.risk) for b in q.bits),
        variants=tuple(VariantEntry(v.id, v.kernels, tuple(str(f) for f in v.facts)) for v in q.variants),
    )


def listing() -> QuirkListing:
    """The catalog kmod/quirks holds, each quirk in the order of its lowest bit."""
    found = sorted(quirk_catalog.load_quirks().values(), key=lambda q: q.bit)
    return QuirkListing(tuple(_entry(q) for q in found))


def text_lines(catalog: QuirkListing) -> list[str]:
    """The listing as `rdna1-kmgr quirks` prints it: a quirk's line, then its details indented."""
    lines = []
    for q in catalog.quirks:
        lines.append(f"{q.id}: {q.summary}")
        lines += [f"    bit {b.bit} {b.id} ({'on' if b.default else 'off'} by default): {b.title}" for b in q.bits]
        lines.append(f"    changes: {q.changes}")
        if q.scope:
            lines.append(f"    matters: {q.scope}")
        lines.append("    evidence owners need it: " + ("; ".join(q.evidence) if q.evidence else "none (opt-in)"))
        lines += [f"    needed only where {n.fact} (else left out: {n.otherwise})" for n in q.needed_when]
        lines += [f"    left out where {f.fact}: {f.because}" for f in q.fixed_when]
        for v in q.variants:
            lines.append(f"    {v.id} (first seen in Linux {v.kernels}) when:")
            lines += [f"        {fact}" for fact in v.facts]
    return lines
