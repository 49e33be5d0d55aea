"""Render the quirk catalog into a quilt-style patch series for one kernel source.

OUT/series                  patch names in the order `patch -p1` applies them from the source root
OUT/NNNN-<name>.patch       a header saying what the patch changes and why, then unified diffs
OUT/manifest.json           kernel version, quirks with their variants and the facts that chose them, their
                            rdna1_quirks bits (all, and the default mask the module applies when the
                            parameter is not given), devices, the kernel-header macros `build` must
                            confirm, sha256 of every patch, its schema (render/manifest.py)

Each quirk's variant is the one whose facts hold on this very tree (source_facts.py); the version number
is only reported. Files are read and patched as bytes (decoded with surrogateescape, no newline
translation): CRLF, tabs, trailing spaces and a missing final newline survive, added lines take the
file's own line ending, and the diffs apply with `patch -p1` and `git apply` alike.

Deterministic: the same source and options give the same bytes. Nothing is written unless the whole
series renders; OUT is then replaced in one rename.
"""

import difflib
import hashlib
import re
import shutil
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jinja2

from rdna1_kmgr import __version__
from rdna1_kmgr.core.errors import SourceError, UsageError
from rdna1_kmgr.core.files import publish_tree, write_json
from rdna1_kmgr.host.rdna1_boards import DEFAULT_TARGET, RDNA1_IDS, format_id
from rdna1_kmgr.render import name_check, quirk_catalog
from rdna1_kmgr.render.manifest import LeftOut, Manifest, QuirkBit, RenderedQuirk
from rdna1_kmgr.render.quirk_mask import QuirkMask
from rdna1_kmgr.source import c_anchors
from rdna1_kmgr.source.kernel_source import kernel_version

AMDGPU = "drivers/gpu/drm/amd/amdgpu"
INCLUDE_LINE = '#include "amdgpu_rdna1.h"\n'


@dataclass(frozen=True)
class Patch:
    name: str
    text: str

    @property
    def data(self) -> bytes:
        return self.text.encode(errors="surrogateescape")

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


class SourceTree:
    """The files of a kernel source as the series changes them, read lazily and never written."""

    def __init__(self, root: Path):
        self.root = root
        self.original: dict[str, str | None] = {}
        self.current: dict[str, str] = {}

    def read(self, rel: str) -> str | None:
        """The file's text as the series has changed it so far, or None if the tree has no such file."""
        if rel not in self.current:
            path = self.root / rel
            if not path.is_file():
                return None
            self.original[rel] = self.current[rel] = path.read_bytes().decode(errors="surrogateescape")
        return self.current[rel]

    def text(self, rel: str) -> str:
        text = self.read(rel)
        if text is None:
            raise SourceError(
                f"{rel}: file not found in {self.root}", "is this a kernel source with drivers/gpu/drm/amd?"
            )
        return text

    def write(self, rel: str, text: str) -> None:
        if rel not in self.current:
            if (self.root / rel).exists():
                self.text(rel)
            else:
                self.original[rel] = None
        self.current[rel] = text


def _place(text: str, rel: str, edit: quirk_catalog.Edit) -> tuple[int, int]:
    """The span an edit replaces (empty for insertions)."""
    if edit.function and edit.statement:
        span = c_anchors.statement(text, rel, edit.function, edit.statement)
        if edit.follows:
            c_anchors.check_follows(text, rel, edit.function, span, edit.statement, edit.follows)
    elif edit.function and edit.at == "end":
        span = c_anchors.body(text, rel, edit.function)
        return span.end, span.end
    elif edit.function:
        span = c_anchors.definition(text, rel, edit.function)
        end = text.find("\n", span.end)
        span = c_anchors.Span(span.start, len(text) if end < 0 else end + 1)
    else:
        assert edit.line is not None, "quirk_catalog lets no edit with neither a function nor a line through"
        span = c_anchors.top_line(text, rel, edit.line)
    if edit.at == "before":
        start = c_anchors.comment_above(text, span.start)
        return start, start
    if edit.at == "after":
        return span.end, span.end
    return span.start, span.end


def _line_ending(text: str) -> str:
    """The file's line ending, as its first line has it."""
    first = text.find("\n")
    return "\r\n" if first > 0 and text[first - 1] == "\r" else "\n"


def _apply(tree: SourceTree, edit: quirk_catalog.Edit, code: str) -> name_check.Added:
    """Apply one edit; what it added, for the name check."""
    text = tree.text(edit.file)
    newline = _line_ending(text)
    try:
        start, end = _place(text, edit.file, edit)
    except c_anchors.AnchorNotFound as err:
        raise SourceError(
            f"cannot render: {err.path}: {err.what}",
            "this kernel's driver differs from what the quirk templates know; report it with the kernel version",
        ) from None
    inside = None
    if edit.function and (edit.statement or edit.at == "end"):
        whole = c_anchors.definition(text, edit.file, edit.function)
        inside = text[whole.start : whole.end]
    if start == len(text) and text and not text.endswith("\n") and code.endswith("\n"):
        code = "\n" + code[:-1]  # after a last line without newline: the file still ends without one
    text = text[:start] + code.replace("\n", newline) + text[end:]
    include = INCLUDE_LINE.replace("\n", newline)
    if edit.file.endswith(".c") and include not in text:
        at = c_anchors.after_includes(text, edit.file)
        text = text[:at] + include + text[at:]
    tree.write(edit.file, text)
    return name_check.Added(edit.file, code, inside)


def _diff(rel: str, before: str | None, after: str) -> str:
    """A unified diff of one file; lines keep their own endings ('\r' included), and a last line without
    one is followed by the marker patch and git apply expect."""
    lines = difflib.unified_diff(
        (before or "").splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile="/dev/null" if before is None else f"a/{rel}",
        tofile=f"b/{rel}",
        n=3,
    )
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def _header(number: int, total: int, edit_set: quirk_catalog.EditSet, note: str) -> str:
    """The mail-style header upstream's checkpatch.pl reads: a description of at most 75 columns, then `---`
    between it and the diffs."""
    return (
        f"From: rdna1-kmgr {__version__}\n"
        f"Subject: [PATCH {number}/{total}] drm/amdgpu: {edit_set.title}\n\n"
        f"{edit_set.why}\n\n{note}\n---\n"
    )


def count_selftest_cases(c_text: str) -> int:
    """Rows of the self-test's case tables (`amdgpu_rdna1_*_cases[] = { ... };`), one check each."""
    total = 0
    for table in re.finditer(r"amdgpu_rdna1_\w+_cases\[\](?: __initconst)? = \{\n(.*?)\n\};", c_text, re.S):
        total += sum(1 for line in table.group(1).splitlines() if line.startswith("\t{ "))
    return total


def check_devices(devices: list[int] | None) -> list[int]:
    devices = sorted(set(devices or [DEFAULT_TARGET]))
    for device in devices:
        if device not in RDNA1_IDS:
            raise UsageError(
                f"device {format_id(device)} is not a first-generation RDNA board",
                f"accepted ids: {' '.join(format_id(i) for i in RDNA1_IDS)}",
            )
    return devices


# Linux 7.0's typed allocators (kzalloc_obj(*p) for kzalloc(sizeof(*p), GFP_KERNEL)): that kernel's checkpatch
# asks for them (ALLOC_WITH_SIZEOF), so the code follows the tree: where amdgpu itself allocates with them, so
# does ours; older trees get the classic calls, their rendering unchanged.
_ALLOC_OBJ = re.compile(rb"\bkzalloc_obj\(")


def has_alloc_obj(source_root: Path) -> bool:
    """Whether the tree's amdgpu allocates with kzalloc_obj() (the helpers are the kernel's then)."""
    folder = source_root / AMDGPU
    return any(_ALLOC_OBJ.search(path.read_bytes()) for path in sorted(folder.glob("*.c")))


def allocators(alloc_obj: bool) -> dict[str, Callable[[str], str]]:
    """The templates' zalloc("p") and kvzalloc("p"): a zeroed *p from the slab, or from kvmalloc."""
    if alloc_obj:
        return {"zalloc": lambda lval: f"kzalloc_obj(*{lval})", "kvzalloc": lambda lval: f"kvzalloc_obj(*{lval})"}
    return {
        "zalloc": lambda lval: f"kzalloc(sizeof(*{lval}), GFP_KERNEL)",
        "kvzalloc": lambda lval: f"kvmalloc(sizeof(*{lval}), GFP_KERNEL | __GFP_ZERO)",
    }


def _jinja() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(quirk_catalog.kmod_root())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _core_files(env, quirks, variants, context) -> dict[str, str]:
    """amdgpu_rdna1.c and .h, each quirk's code rendered with its variant's vars."""

    def part(quirk, template_text):
        return env.from_string(template_text).render(**context, **variants[quirk.id].vars)

    def file_part(quirk, name):
        rel = (quirk.folder / name).relative_to(quirk_catalog.kmod_root()).as_posix()
        return env.get_template(rel).render(**context, **variants[quirk.id].vars)

    rendered = [
        dict(
            id=q.id,
            bits=q.bits,
            macro=q.macro,
            symbol=q.symbol,
            declarations=part(q, q.declarations).strip("\n"),
            # each piece after exactly one blank line, whatever its template starts with
            driver_code="\n" + file_part(q, q.driver_code).strip("\n"),
            selftest_code="\n" + file_part(q, q.selftest_code).strip("\n"),
        )
        for q in quirks
    ]
    includes = sorted({i for q in quirks for i in q.includes})
    files = {}
    for name in ("amdgpu_rdna1.c", "amdgpu_rdna1.h"):
        files[f"{AMDGPU}/{name}"] = env.get_template(f"common/{name}.j2").render(
            **context,
            quirks=rendered,
            includes=includes,
            bits=sorted((b for q in quirks for b in q.bits), key=lambda b: b.bit),
        )
    return files


def render_series(
    source_root: Path,
    quirk_ids: list[str] | None = None,
    devices: list[int] | None = None,
    without: list[str] | None = None,
) -> tuple[list[Patch], Manifest]:
    """The series for a source, in memory: (patches, manifest). `quirk_ids`: only these (and the default-on
    quirks this kernel needs); `without`: never these (--no-quirk)."""
    version = kernel_version(source_root)
    if version < quirk_catalog.OLDEST_KERNEL:
        raise SourceError(
            f"Linux {version} is older than the oldest supported kernel", f"use {quirk_catalog.OLDEST_KERNEL} or newer"
        )
    devices = check_devices(devices)
    tree = SourceTree(source_root)
    quirks, variants, left_out, kept = _quirks_for(tree, quirk_ids, without)
    bits = sorted((b for q in quirks for b in q.bits), key=lambda b: b.bit)
    context = dict(
        renderer_version=__version__,
        kernel_version=str(version),
        devices=devices,
        all_bits=sum(1 << b.bit for b in bits),
        default_bits=sum(1 << b.bit for b in bits if b.default),
        **allocators(has_alloc_obj(source_root)),
    )
    env = _jinja()

    steps = [(fix, "rdna1-kmgr: needed to build amdgpu outside the kernel tree") for fix in quirk_catalog.build_fixes()]
    core = quirk_catalog.core()
    listed = f"rdna1-kmgr: quirks {' '.join(q.id for q in quirks)}; devices {' '.join(format_id(d) for d in devices)}"
    steps.append((core, textwrap.fill(listed, 75, break_on_hyphens=False, break_long_words=False)))
    steps += [(q.edit_set(variants[q.id]), _variant_note(q, variants[q.id], version)) for q in quirks]

    patches = []
    added = []
    core_files = _core_files(env, quirks, variants, context)
    for number, (edit_set, note) in enumerate(steps, 1):
        before = dict(tree.current)
        for edit in edit_set.edits:
            code = env.from_string(edit.code).render(**context, **_vars_of(edit_set, variants))
            added.append(_apply(tree, edit, code))
        if edit_set.name == "rdna1-core":
            for rel, text in core_files.items():
                tree.write(rel, text)
        changed = sorted(rel for rel in tree.current if tree.current[rel] != before.get(rel, tree.original.get(rel)))
        body = "".join(_diff(rel, before.get(rel, tree.original.get(rel)), tree.current[rel]) for rel in changed)
        name = f"{number:04d}-{edit_set.name}.patch"
        patches.append(Patch(name, _header(number, len(steps), edit_set, note) + body))

    added += [name_check.Added(rel, text) for rel, text in core_files.items()]
    name_check.check(name_check.TreeNames.scan(source_root), added, core_files, core.kernel_names)

    manifest = Manifest(
        kernel_version=str(version),
        renderer_version=__version__,
        devices=tuple(format_id(d) for d in devices),
        quirks=tuple(
            RenderedQuirk(
                q.id,
                tuple(b.id for b in q.bits),
                variants[q.id].id,
                tuple(str(f) for f in variants[q.id].facts),
            )
            for q in quirks
        ),
        left_out=tuple(LeftOut(q.id, why) for q, why in left_out),
        asked_quirks=tuple(quirk_ids) if quirk_ids else None,
        kept_quirks=tuple(kept),
        declined_quirks=tuple(without or ()),
        bits=tuple(QuirkBit(b.bit, b.id, b.title, b.default) for b in bits),
        quirks_mask=QuirkMask(context["default_bits"]),
        active_by_default=tuple(b.id for b in bits if b.default),
        all_bits_mask=QuirkMask(context["all_bits"]),
        kernel_names=core.kernel_names,
        selftest_cases=count_selftest_cases(core_files[f"{AMDGPU}/amdgpu_rdna1.c"]),
        series=tuple(p.name for p in patches),
        patches={p.name: p.sha256 for p in patches},
        patchset_sha256=hashlib.sha256("".join(p.sha256 for p in patches).encode()).hexdigest(),
    )
    return patches, manifest


def _quirks_for(tree: SourceTree, quirk_ids: list[str] | None, without: list[str] | None = None):
    """The quirks this tree gets, each one's variant, the ones left out with why, and the default-on ones kept
    beside the quirks asked for.

    A quirk whose `needed_when` facts fail has nothing to fix on this kernel (or upstream already fixed it):
    left out, asked for or not, never a refusal. Otherwise a default-on quirk, or one asked for by id, must fit
    a variant (else the refusal names the failed facts); an opt-in quirk of the default selection that fits
    none is left out. Asking for some quirks never drops a default-on one this kernel needs: it is kept, and
    said so; only `without` (--no-quirk) leaves it out.
    """
    catalog = quirk_catalog.load_quirks()
    declined = {q.id for q in quirk_catalog.select(catalog, without)} if without else set()
    asked = {q.id for q in quirk_catalog.select(catalog, quirk_ids)}
    both = sorted(asked & declined) if quirk_ids else []
    if both:
        raise UsageError(f"quirk {both[0]} is both asked for and left out", "give it to --quirk or --no-quirk")
    extra = {q.id for q in catalog.values() if q.default_on} - asked if quirk_ids else set()
    quirks, variants, left_out, kept = [], {}, [], []
    for quirk in sorted((catalog[i] for i in asked | extra), key=lambda q: q.bit):
        if quirk.id in declined:
            left_out.append((quirk, f"as asked (--no-quirk {quirk.id})"))
            continue
        why = quirk.not_needed(tree.read)
        if why and quirk.id not in extra:  # a default-on quirk not asked for and not needed: nothing to say
            left_out.append((quirk, why))
        if why:
            continue
        try:
            variants[quirk.id] = quirk.variant_for(tree.read)
        except SourceError as err:
            if quirk_ids or quirk.default_on:
                raise
            left_out.append((quirk, f"opt-in and fits no variant of this source ({err.what})"))
            continue
        quirks.append(quirk)
        if quirk.id in extra:
            kept.append(quirk.id)
    if not quirks:
        raise SourceError(
            "no quirk to render for this kernel: " + "; ".join(f"{q.id}: {why}" for q, why in left_out),
            "this kernel needs no patched amdgpu; run `rdna1-kmgr doctor` for what else to check",
        )
    return quirks, variants, left_out, kept


def _variant_note(quirk: quirk_catalog.Quirk, variant: quirk_catalog.Variant, version) -> str:
    """Which facts chose the variant, one to a line (a long one folded) within checkpatch's 75 columns."""
    head = f"rdna1-kmgr: quirk {quirk.id}, variant {variant.id}, Linux {version}; chosen because this tree's"
    facts = "".join(
        "\n"
        + textwrap.fill(
            str(fact), 75, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False, break_long_words=False
        )
        for fact in variant.facts
    )
    return textwrap.fill(head, 75, break_on_hyphens=False) + facts


def _vars_of(edit_set: quirk_catalog.EditSet, variants: dict) -> dict:
    variant = variants.get(edit_set.name)
    return variant.vars if variant else {}


def render(
    source_root: Path,
    out: Path,
    quirk_ids: list[str] | None = None,
    devices: list[int] | None = None,
    without: list[str] | None = None,
) -> Manifest:
    """Render the series for source_root into out (replacing an earlier render there); the manifest."""
    patches, manifest = render_series(source_root, quirk_ids, devices, without)
    out = out.resolve()
    if out.exists() and any(out.iterdir()) and not (out / "manifest.json").is_file():
        raise UsageError(f"{out} exists and is not an earlier render", "give an empty or new directory as --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for patch in patches:
            (staging / patch.name).write_bytes(patch.data)
        (staging / "series").write_text("".join(p.name + "\n" for p in patches))
        write_json(staging / "manifest.json", manifest.to_json(), indent=2, sort_keys=True)
        publish_tree(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest
