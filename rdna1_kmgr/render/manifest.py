"""The render's manifest: what a rendered series carries, as render hands it to build, install and follow.

Written as OUT/manifest.json by render (and copied into the DKMS package as rdna1-manifest.json, where
install, follow and status read it back). The JSON is formatted only here: to_json writes it, from_json
reads every manifest rdna1-kmgr has written, older ones lacking keys included (a key that is missing, or
of the wrong type, reads as unknown). `schema` says the shape; a file without it is schema 1, the shape
of every manifest before the field was written. A file of another schema is refused in one line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.render.quirk_mask import LIMIT, QuirkMask

SCHEMA = 1


@dataclass(frozen=True)
class RenderedQuirk:
    id: str
    bits: tuple[str, ...] = ()  # the ids of its rdna1_quirks bits
    variant: str | None = None  # None: a manifest from before variants were recorded
    facts: tuple[str, ...] = ()  # the facts of the tree that chose the variant


@dataclass(frozen=True)
class QuirkBit:
    bit: int | None  # the bit number in rdna1_quirks (None: a test's or an old manifest's entry without it)
    id: str
    title: str
    default: bool  # on when rdna1_quirks is not given


@dataclass(frozen=True)
class LeftOut:
    id: str
    why: str


@dataclass(frozen=True)
class Manifest:
    kernel_version: str | None = None
    renderer_version: str | None = None
    devices: tuple[str, ...] = ()  # 0x731F style
    quirks: tuple[RenderedQuirk, ...] = ()
    left_out: tuple[LeftOut, ...] = ()  # quirks of the catalog this kernel does not get, each with why
    # what the owner asked for (None: the default, every quirk that fits), so that `follow` asks a new kernel
    # the same; a manifest from before it was recorded reads as the quirks it carried
    asked_quirks: tuple[str, ...] | None = None
    kept_quirks: tuple[str, ...] = ()  # default-on quirks this kernel needs, kept beside the ones asked for
    declined_quirks: tuple[str, ...] = ()  # what the owner left out (--no-quirk), for `follow` to leave out again
    bits: tuple[QuirkBit, ...] = ()
    quirks_mask: QuirkMask | None = None  # what the module applies on a listed board when rdna1_quirks is not given
    # the bits on by default; a manifest from before it was recorded reads as every quirk it carried
    active_by_default: tuple[str, ...] | None = None
    all_bits_mask: QuirkMask | None = None  # every bit the build carries
    kernel_names: Mapping[str, str] = field(default_factory=dict)  # macros taken on trust; build probes them
    selftest_cases: int | None = None
    series: tuple[str, ...] = ()  # the patch names in the order they apply
    patches: Mapping[str, str] = field(default_factory=dict)  # patch name -> sha256
    patchset_sha256: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kernel_names", MappingProxyType(dict(self.kernel_names)))
        object.__setattr__(self, "patches", MappingProxyType(dict(self.patches)))

    @property
    def quirk_ids(self) -> list[str]:
        return [q.id for q in self.quirks]

    @property
    def carried_mask(self) -> QuirkMask | None:
        """Every rdna1_quirks bit the build carries (on by default or not), or None when the manifest does not
        say: a build rendered before the manifest listed them carried its default mask only."""
        return self.all_bits_mask if self.all_bits_mask is not None else self.quirks_mask

    @property
    def bits_on(self) -> tuple[str, ...]:
        """The bits the module applies on a listed board when rdna1_quirks is not given."""
        return self.active_by_default if self.active_by_default is not None else ()

    @property
    def bits_off(self) -> tuple[QuirkBit, ...]:
        """The bits the build carries that stay off until rdna1_quirks switches them on."""
        return tuple(b for b in self.bits if b.id not in self.bits_on)

    def rendered(self) -> tuple[str, str]:
        """(kernel_version, patchset_sha256) of a rendered series; a manifest without them was not written by a
        render and is refused in one line."""
        if not self.kernel_version or not self.patchset_sha256:
            raise UsageError("the render manifest names no kernel version or patch set", "render the series again")
        return self.kernel_version, self.patchset_sha256

    def nothing_on_note(self) -> str | None:
        """One line when the module, loaded as built, behaves as the stock one (no bit on by default for this
        kernel); None when some bit is on."""
        if self.bits_on or not self.bits:
            return None
        opt_in = ", ".join(f"{b.id} (0x{1 << b.bit:x})" if b.bit is not None else b.id for b in self.bits_off)
        return (
            f"no kernel change needed by default: the patched module changes nothing here until you switch an "
            f"opt-in bit on: {opt_in} (`rdna1-kmgr install --quirks MASK`; `rdna1-kmgr doctor` says what to check)"
        )

    def notes(self) -> list[str]:
        """What the render decided that the owner did not ask for, one line each: quirks left out, default-on
        quirks kept beside the ones asked for, and that nothing is on by default."""
        lines = [f"quirk {q.id} left out: {q.why}" for q in self.left_out]
        lines += [
            f"quirk {q} kept: on by default and needed on this kernel (leave it out with --no-quirk {q})"
            for q in self.kept_quirks
        ]
        note = self.nothing_on_note()
        if self.bits_on:
            note = (
                f"kernel change needed here: {' '.join(self.bits_on)} on by default (mask {self.quirks_mask}), "
                "from this kernel's own source; whether your board and ROCm hit it: `rdna1-kmgr doctor`'s queue finding"
            )
        return lines + ([note] if note else [])

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "kernel_version": self.kernel_version,
            "renderer_version": self.renderer_version,
            "devices": list(self.devices),
            "quirks": [
                {"id": q.id, "bits": list(q.bits), "variant": q.variant, "facts": list(q.facts)} for q in self.quirks
            ],
            "left_out": [{"id": q.id, "why": q.why} for q in self.left_out],
            "asked_quirks": list(self.asked_quirks) if self.asked_quirks is not None else None,
            "kept_quirks": list(self.kept_quirks),
            "declined_quirks": list(self.declined_quirks),
            "bits": [{"bit": b.bit, "id": b.id, "title": b.title, "default": b.default} for b in self.bits],
            "quirks_mask": _bits(self.quirks_mask),
            "active_by_default": list(self.active_by_default) if self.active_by_default is not None else None,
            "all_bits_mask": _bits(self.all_bits_mask),
            "kernel_names": dict(self.kernel_names),
            "selftest_cases": self.selftest_cases,
            "series": list(self.series),
            "patches": dict(self.patches),
            "patchset_sha256": self.patchset_sha256,
        }

    @classmethod
    def from_json(cls, data: object, where: str = "the manifest") -> Manifest:
        if not isinstance(data, Mapping):
            raise UsageError(f"{where} is no render manifest (not a JSON object)", _RENDER_AGAIN)
        schema = data.get("schema", 1)
        if schema != SCHEMA or isinstance(schema, bool):
            raise UsageError(f"{where} is of schema {schema!r}; this rdna1-kmgr reads schema {SCHEMA}", _RENDER_AGAIN)
        quirks = tuple(_quirk(q) for q in _list(data.get("quirks")) if isinstance(q, str | Mapping))
        ids = tuple(q.id for q in quirks)
        asked = data["asked_quirks"] if "asked_quirks" in data else ids
        active = data["active_by_default"] if "active_by_default" in data else (ids if "quirks" in data else None)
        return cls(
            kernel_version=_str(data.get("kernel_version")),
            renderer_version=_str(data.get("renderer_version")),
            devices=_strs(data.get("devices")),
            quirks=quirks,
            left_out=tuple(
                LeftOut(str(q.get("id")), str(q.get("why", "")))
                for q in _list(data.get("left_out"))
                if isinstance(q, Mapping)
            ),
            asked_quirks=None if asked is None else tuple(_quirk(q).id for q in _list(asked)),
            kept_quirks=_strs(data.get("kept_quirks")),
            declined_quirks=_strs(data.get("declined_quirks")),
            bits=tuple(
                QuirkBit(_int(b.get("bit")), str(b.get("id")), str(b.get("title", "")), b.get("default") is True)
                for b in _list(data.get("bits"))
                if isinstance(b, Mapping)
            ),
            quirks_mask=_mask(data.get("quirks_mask")),
            active_by_default=None if active is None else _strs(active),
            all_bits_mask=_mask(data.get("all_bits_mask")),
            kernel_names={str(k): str(v) for k, v in _mapping(data.get("kernel_names")).items()},
            selftest_cases=_int(data.get("selftest_cases")),
            series=_strs(data.get("series")),
            patches={str(k): str(v) for k, v in _mapping(data.get("patches")).items()},
            patchset_sha256=_str(data.get("patchset_sha256")),
        )

    @classmethod
    def read(cls, path: Path) -> Manifest:
        """The manifest in `path`; FileNotFoundError when there is none, any other fault one clear line."""
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise
        except (OSError, ValueError) as err:
            raise UsageError(f"unreadable manifest {path}: {err}", "give the manifest.json of the render") from None
        return cls.from_json(data, f"manifest {path}")


_RENDER_AGAIN = (
    "render it again with this rdna1-kmgr (`rdna1-kmgr build` renders its own; `rdna1-kmgr render --out DIR`)"
)


def _quirk(raw) -> RenderedQuirk:
    if isinstance(raw, str):  # the oldest manifests named the quirks only
        return RenderedQuirk(raw)
    if not isinstance(raw, Mapping):
        return RenderedQuirk(str(raw))
    return RenderedQuirk(str(raw.get("id")), _strs(raw.get("bits")), _str(raw.get("variant")), _strs(raw.get("facts")))


def _list(value) -> list:
    return list(value) if isinstance(value, list | tuple) else []


def _mapping(value) -> Mapping:
    return value if isinstance(value, Mapping) else {}


def _strs(value) -> tuple[str, ...]:
    return tuple(str(v) for v in _list(value))


def _str(value) -> str | None:
    return value if isinstance(value, str) else None


def _mask(value) -> QuirkMask | None:
    bits = _int(value)
    return QuirkMask(bits) if bits is not None and 0 <= bits < LIMIT else None


def _bits(mask: QuirkMask | None) -> int | None:
    return mask.bits if mask is not None else None


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
