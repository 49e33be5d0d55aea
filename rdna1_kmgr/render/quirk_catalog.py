"""The kernel-side catalog in kmod/: quirks, the quirk core and the out-of-tree build fix, as data.

kmod/quirks/<id>/quirk.toml   one quirk: its bit (or one bit per class: [[classes]]), why, edits (hooks) and
                              variants chosen by facts
kmod/common/common.toml       the quirk core's edits; amdgpu_rdna1.{c,h}.j2 beside it
kmod/build-fixes/*.toml       edits an out-of-tree build of amdgpu needs

The schema (kmod/README.md says the same with an example):

[[edits]]     id, file (relative to the source root), at = "end" | "before" | "after" | "replace", code
              (a Jinja template), and where: `function` alone (its end, or the whole definition for
              before/after/replace), `function` + `statement` (a statement in its body), or `line` (a
              whole top-level line, e.g. in a Makefile). `statement` is the LIST of the forms that
              statement has had across the supported kernels (a lone string is one form); the earliest
              form found in the body is the anchor. `follows` (with `function` + `statement`, optional): the
              list of forms of a statement the hook reads the result of (say, a size computed just before);
              the anchor must come after every occurrence of it in the function, else render refuses in one
              line (the anchor found is not the statement the hook was written for).
needed_when   (quirk.toml only) facts that say the kernel has the code the quirk fixes (written against whole
              files, so that a renamed function does not read as an old kernel); where one fails the quirk is
              left out with one line, never refused: "nothing to fix on this kernel", or the fact's own
              `otherwise`.
fixed_when    (quirk.toml only) facts that recognise upstream's own fix, each with `because` ("the kernel
              already prints ..."); where one holds the quirk is left out with that line. Only a recognised
              form counts: code in a form neither list knows keeps the quirk, whose variant facts then
              decide (a refusal naming the fact when none fits, never a silent leaving out). evidence: links;
              changes: one line; scope: one line, where the quirk matters (on by default or not).
[[variants]]  (quirk.toml only) id, edits (ids of [[edits]]), vars (for the templates), facts (a list of
              source facts, see source_facts.py: {file, function, contains|lacks|parameters}), kernels
              (a hint for messages only: the releases the variant was written for; it decides nothing).
              Render takes the one variant whose facts all hold on the tree; none or several: refusal.
"""

import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from packaging.version import Version

from rdna1_kmgr.core.errors import SourceError, UsageError
from rdna1_kmgr.render.source_facts import Fact, first_failure

OLDEST_KERNEL = Version("5.10")
PLACES = ("end", "before", "after", "replace")
NOT_NEEDED = "nothing to fix on this kernel"


@dataclass(frozen=True)
class Need:
    """A fact saying the kernel has what a quirk fixes; where it fails, `otherwise` says why the quirk is left out."""

    fact: Fact
    otherwise: str = NOT_NEEDED

    @classmethod
    def parse(cls, raw: dict, origin: str) -> "Need":
        raw = dict(raw)
        otherwise = raw.pop("otherwise", NOT_NEEDED)
        return cls(Fact.parse(raw, origin), otherwise)


@dataclass(frozen=True)
class Fixed:
    """A fact that recognises upstream's own fix for what a quirk fixes; where it holds, `because` says so."""

    fact: Fact
    because: str

    @classmethod
    def parse(cls, raw: dict, origin: str) -> "Fixed":
        raw = dict(raw)
        because = raw.pop("because", None)
        if not because:
            raise ValueError(f"{origin}: fact {raw}: a fixed_when fact says `because`")
        return cls(Fact.parse(raw, origin), because)


@dataclass(frozen=True)
class Edit:
    id: str
    file: str
    at: str
    code: str
    function: str | None = None
    statement: tuple[str, ...] = ()  # the accepted forms of one statement
    line: str | None = None
    follows: tuple[str, ...] = ()  # the accepted forms of a statement the anchor must come after


@dataclass(frozen=True)
class Variant:
    id: str
    kernels: str  # a hint for messages: the releases it was written for
    edits: tuple[str, ...]
    facts: tuple[Fact, ...]
    vars: dict = field(default_factory=dict)

    def mismatch(self, read) -> str | None:
        """Why this variant does not fit the tree `read` reads (its first fact that fails), or None."""
        return first_failure(self.facts, read)


@dataclass(frozen=True)
class QuirkBit:
    """One bit of the module's rdna1_quirks mask: a quirk, or one class of what a quirk changes."""

    bit: int
    id: str
    title: str
    default: bool  # on when rdna1_quirks is not given: only for bits with no known harm
    risk: str

    @property
    def macro(self) -> str:
        return self.id.upper().replace("-", "_")


@dataclass(frozen=True)
class EditSet:
    """Edits that travel as one patch of the series."""

    name: str
    title: str  # the patch's subject line, after "drm/amdgpu: "
    summary: str
    why: str
    edits: tuple[Edit, ...]
    kernel_names: dict = field(default_factory=dict)  # macro -> the kernel header it comes from (name_check.py)


@dataclass(frozen=True)
class Quirk:
    id: str
    title: str
    summary: str
    why: str
    folder: Path
    driver_code: str
    selftest_code: str
    declarations: str
    includes: tuple[str, ...]
    edits: dict[str, Edit]
    variants: tuple[Variant, ...]
    bits: tuple[QuirkBit, ...]
    needed_when: tuple[Need, ...] = ()  # the kernel has what this quirk fixes
    fixed_when: tuple[Fixed, ...] = ()  # upstream's own fix, recognised
    evidence: tuple[str, ...] = ()  # public sources showing owners need it (links)
    changes: str = ""  # what it changes, in one line
    scope: str = ""  # where it matters, in one line

    @property
    def default_on(self) -> bool:
        return any(b.default for b in self.bits)

    def not_needed(self, read) -> str | None:
        """Why this kernel has nothing for the quirk to fix (its first needed_when fact that fails, after what
        that means, or its first fixed_when fact that holds), or None."""
        for need in self.needed_when:
            why = need.fact.check(read)
            if why:
                return f"{need.otherwise}: {why}"
        for fixed in self.fixed_when:
            if fixed.fact.check(read) is None:
                return f"{fixed.because}: {fixed.fact}"
        return None

    @property
    def bit(self) -> int:
        """The lowest of its bits (the catalog's order)."""
        return min(b.bit for b in self.bits)

    @property
    def macro(self) -> str:
        return self.id.upper().replace("-", "_")

    @property
    def symbol(self) -> str:
        return self.id.replace("-", "_")

    def variant_for(self, read) -> Variant:
        """The one variant whose facts all hold on the tree whose files `read(rel)` returns (None if
        missing). None fits, or several do: SourceError in one line naming the facts."""
        misses = {v.id: v.mismatch(read) for v in self.variants}
        fitting = [v for v in self.variants if misses[v.id] is None]
        if len(fitting) == 1:
            return fitting[0]
        if not fitting:
            raise SourceError(
                f"cannot render quirk {self.id}: no variant fits this source: "
                + "; ".join(f"{v.id} (first seen in Linux {v.kernels}): {misses[v.id]}" for v in self.variants),
                "this driver differs from every shape the quirk knows; report it with the kernel's source package",
            )
        raise SourceError(
            f"cannot render quirk {self.id}: the facts of several variants hold: "
            + "; ".join(f"{v.id} ({', '.join(map(str, v.facts))})" for v in fitting),
            "the quirk's facts do not tell these apart; report it with the kernel's source package",
        )

    def edit_set(self, variant: Variant) -> EditSet:
        return EditSet(self.id, self.title, self.summary, self.why, tuple(self.edits[e] for e in variant.edits))


def kmod_root() -> Path:
    return Path(str(resources.files("rdna1_kmgr.kmod")))


def _forms(raw: dict, key: str) -> tuple[str, ...]:
    forms = raw.get(key, ())
    return (forms,) if isinstance(forms, str) else tuple(forms)


def _edit(raw: dict, origin: Path) -> Edit:
    edit = Edit(**{**raw, "statement": _forms(raw, "statement"), "follows": _forms(raw, "follows")})
    if edit.at not in PLACES or not (edit.function or edit.line):
        raise ValueError(f"{origin}: edit {edit.id}: `at` must be one of {PLACES} with a function or a line")
    if edit.follows and not edit.statement:
        raise ValueError(f"{origin}: edit {edit.id}: `follows` needs a `function` and a `statement` to anchor on")
    return edit


def _variant(raw: dict, origin: Path) -> Variant:
    facts = tuple(Fact.parse(f, f"{origin}: variant {raw['id']}") for f in raw.get("facts", ()))
    if not facts:
        raise ValueError(f"{origin}: variant {raw['id']} declares no facts (a version range decides nothing)")
    return Variant(raw["id"], raw.get("kernels", "?"), tuple(raw["edits"]), facts, raw.get("vars", {}))


def _load(path: Path) -> dict:
    with path.open("rb") as f:
        return tomllib.load(f)


def load_quirks(root: Path | None = None) -> dict[str, Quirk]:
    root = root or kmod_root()
    quirks = {}
    for meta in sorted((root / "quirks").glob("*/quirk.toml")):
        raw = _load(meta)
        edits = {e["id"]: _edit(e, meta) for e in raw["edits"]}
        variants = tuple(_variant(v, meta) for v in raw["variants"])
        for variant in variants:
            unknown = set(variant.edits) - set(edits)
            if unknown:
                raise ValueError(f"{meta}: variant {variant.id} names unknown edits {sorted(unknown)}")
        quirks[raw["id"]] = Quirk(
            id=raw["id"],
            title=raw["title"],
            summary=raw["summary"],
            why=raw["why"].strip(),
            folder=meta.parent,
            driver_code=raw["driver_code"],
            selftest_code=raw["selftest_code"],
            declarations=raw["declarations"],
            includes=tuple(raw.get("includes", ())),
            edits=edits,
            variants=variants,
            bits=_bits(raw, meta),
            needed_when=tuple(Need.parse(f, f"{meta}: needed_when") for f in raw.get("needed_when", ())),
            fixed_when=tuple(Fixed.parse(f, f"{meta}: fixed_when") for f in raw.get("fixed_when", ())),
            evidence=tuple(raw.get("evidence", ())),
            changes=raw.get("changes", ""),
            scope=raw.get("scope", ""),
        )
    bits = [b.bit for q in quirks.values() for b in q.bits]
    if len(bits) != len(set(bits)):
        raise ValueError(f"{root}: two quirks share a bit: {sorted(bits)}")
    return quirks


def _bits(raw: dict, origin: Path) -> tuple[QuirkBit, ...]:
    """A quirk's bits: its own (`bit`, `default`, `risk` beside its id), or one per `[[classes]]` entry."""
    classes = raw.get("classes") or [
        dict(
            bit=raw["bit"],
            id=raw["id"],
            title=raw["title"],
            default=raw.get("default", False),
            risk=raw.get("risk", ""),
        )
    ]
    if "bit" in raw and "classes" in raw:
        raise ValueError(f"{origin}: give either `bit` or `[[classes]]`, not both")
    return tuple(QuirkBit(c["bit"], c["id"], c["title"], c.get("default", False), c.get("risk", "")) for c in classes)


def load_edit_set(path: Path, name: str) -> EditSet:
    raw = _load(path)
    return EditSet(
        name,
        raw["title"],
        raw["summary"],
        raw["why"].strip(),
        tuple(_edit(e, path) for e in raw["edits"]),
        dict(raw.get("kernel_names", {})),
    )


def build_fixes(root: Path | None = None) -> list[EditSet]:
    root = root or kmod_root()
    return [load_edit_set(p, p.stem) for p in sorted((root / "build-fixes").glob("*.toml"))]


def core(root: Path | None = None) -> EditSet:
    root = root or kmod_root()
    return load_edit_set(root / "common" / "common.toml", "rdna1-core")


def select(catalog: dict[str, Quirk], ids: list[str] | None) -> list[Quirk]:
    """The quirks asked for (all by default), in bit order; unknown ids are refused.
    A quirk is asked for by its id; a class bit's id names the quirk it belongs to."""
    if not ids:
        return sorted(catalog.values(), key=lambda q: q.bit)
    owner = {b.id: q.id for q in catalog.values() for b in q.bits}
    ids = [owner.get(i, i) for i in ids]
    unknown = [i for i in ids if i not in catalog]
    if unknown:
        raise UsageError(f"unknown quirk {unknown[0]!r}", f"choose from: {', '.join(sorted(catalog))}")
    return sorted({i: catalog[i] for i in ids}.values(), key=lambda q: q.bit)
