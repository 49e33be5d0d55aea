"""The series checks itself before it is written: every name its added code uses must exist in the tree.

A variant whose facts let it through on a tree it does not fit (say `kdev->kgd` on a driver that reaches
the device as `kdev->adev`) would apply cleanly and fail ten minutes into the build. Reading the names is
cheap, so the renderer does it first:

- a struct member the added code uses (`p->name`, `s.name`, `.name =`) must be one the tree's own code
  uses as a member, or one declared in the tree's headers or in the series' own files (a name after a type word
  or `*` and before `;`, `,`, `=`, `)`, `[` or `:`, a function pointer `(*name)(`, a function's
  definition or prototype, a macro): members of kernel-wide structs such as pci_dev's are known by their
  use, since their headers are not part of a driver tree;
- any other identifier must occur in the tree's code (comments and strings left out) or be declared by
  the series' own files (amdgpu_rdna1.{c,h}); names in the series' own name space (amdgpu_rdna1_*,
  AMDGPU_RDNA1_*, rdna1_*, RDNA1_*: its tables, struct tags, module parameters) are its own;
- names the quirk core declares it takes from the kernel's own headers (common.toml `kernel_names`, e.g.
  FIELD_PREP from <linux/bitfield.h>, PCI_VENDOR_ID_ATI from <linux/pci_ids.h>) are taken on trust: a driver
  tree does not carry those headers, and many never spell them (`build` confirms them with a compile probe);
- the paths of `#include <...>` lines are not names;
- a use of one of the series' own token-pasting macros (`#define RDNA1_KFD(flag) KFD_IOC_ALLOC_MEM_FLAGS_##flag`,
  one line) is expanded first, and the names it makes are checked like any other: `RDNA1_KFD(UNCACHED)` on a
  tree that never names KFD_IOC_ALLOC_MEM_FLAGS_UNCACHED (5.10) is refused;
- in a hook placed inside a function, a lower-case name that is neither called nor a member must occur
  in that very function (it is one of its locals or parameters).

The tree is the amdgpu, amdkfd and include folders of drivers/gpu/drm/amd (asic_reg left out: register
headers only), which is what the added code can reach. Declarations are matched by shape, not parsed:
this catches names a tree does not have at all, not every type error; the compiler still has the last
word.
"""

import re
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core.errors import SourceError

AMD = "drivers/gpu/drm/amd"
OWN = re.compile(r"^(amdgpu_rdna1_|AMDGPU_RDNA1_|rdna1_|RDNA1_)")
SCANNED = ("amdgpu", "amdkfd", "include")
KEYWORDS = frozenset(
    """
    auto break case char const continue default defined do double else enum extern float for goto if
    inline int long register return short signed sizeof static struct switch typedef typeof union unsigned
    void volatile while include define undef ifdef ifndef endif elif pragma error warning
""".split()
)

_LITERALS = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)
# a declarator: after a type word or '*', before ';' ',' '=' ')' (arrays and bit-fields allowed), or a
# function pointer's name
_DECLARED = re.compile(
    r"(?:\b([A-Za-z_]\w*)[ \t]+|\*[ \t]*)([A-Za-z_]\w*)[ \t]*(?:\[[^\]\n]*\][ \t]*)*"
    r"(?::[ \t]*\w+[ \t]*)?[;,=)]|\(\s*\*\s*([A-Za-z_]\w*)\s*\)\s*\("
)
_FUNCTION = re.compile(r"(?:\b([A-Za-z_]\w*)[ \t]+|\*[ \t]*)([A-Za-z_]\w*)[ \t]*\([^;{}()]*\)\s*[{;]")
_NOT_TYPES = frozenset({"return", "case", "goto", "else", "sizeof", "typeof"})
_MEMBER = re.compile(r"(?:->|\.)[ \t]*([A-Za-z_]\w*)")
_WORD = re.compile(r"(->|\.)?[ \t]*\b([A-Za-z_]\w*)")
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)", re.M)
# A name pasted onto another (`FLAGS_##flag`) is a prefix, not a name of its own.
_TOKEN = re.compile(r"(?<![\w#])(?<!# )([A-Za-z_]\w*)(?!\w)(?!\s*##)(\s*\()?")


# `#include <linux/bitfield.h>`: a header's path, not names (a driver tree need not spell "bitfield")
_SYSTEM_INCLUDE = re.compile(r"^([ \t]*#[ \t]*include[ \t]*)<[^>\n]*>", re.M)


def code_of(text: str) -> str:
    """C text without comments, string and character literals and <header> paths (each replaced by a space)."""
    return _SYSTEM_INCLUDE.sub(r"\1 ", _LITERALS.sub(" ", text))


def declared(code: str) -> set[str]:
    """Names the code declares: declarators, function pointers, functions and macros."""
    names = {name or pointer for word, name, pointer in _DECLARED.findall(code) if word not in _NOT_TYPES}
    names |= {name for word, name in _FUNCTION.findall(code) if word not in _NOT_TYPES}
    return (names | set(_DEFINE.findall(code))) - KEYWORDS


@dataclass(frozen=True)
class Added:
    """A piece of code the series adds: where it goes, and the function it sits in (if any)."""

    file: str
    code: str
    function_text: str | None = None  # the whole definition of the function the hook sits in


@dataclass
class TreeNames:
    tokens: set[str]
    declared: set[str]  # names in declarations, and names the tree uses as members

    @classmethod
    def scan(cls, root: Path) -> "TreeNames":
        """Names of the tree at root, as it is before the series."""
        tokens: set[str] = set()
        decl: set[str] = set()
        for folder in SCANNED:
            base = root / AMD / folder
            if not base.is_dir():
                continue
            for path in base.rglob("*.[ch]"):
                if "asic_reg" in path.parts:
                    continue
                code = code_of(path.read_bytes().decode(errors="surrogateescape"))
                for arrow, name in _WORD.findall(code):
                    tokens.add(name)
                    if arrow:
                        decl.add(name)  # used as a member
                if path.suffix == ".h":  # struct definitions live in headers
                    decl |= declared(code)
        return cls(tokens, decl)


def check(tree: TreeNames, added: list[Added], series_files: dict[str, str], kernel_names=()) -> None:
    """SourceError naming the first name the added code uses that the tree and series do not have.

    kernel_names: names the series takes from the kernel's own headers (outside a driver tree), taken
    on trust here; the compile settles them."""
    own_decl = set(kernel_names).union(
        *(declared(code_of(t)) | set(_LABEL.findall(code_of(t))) for t in series_files.values())
    )
    pasting = pasting_macros(code_of(t) for t in series_files.values())
    for piece in added:
        if not piece.file.endswith((".c", ".h")):
            continue  # Makefiles and the like: kbuild's names, not C's
        code = expand_pasting(code_of(piece.code), pasting)
        members = set(_MEMBER.findall(code))
        for name in sorted(members):
            if not OWN.match(name) and name not in tree.declared and name not in own_decl:
                _refuse(name, "a struct member", piece.file, "no struct in this tree declares it")
        local = code_of(piece.function_text) if piece.function_text is not None else None
        for match in _TOKEN.finditer(code):
            name, called = match.group(1), bool(match.group(2))
            if name in KEYWORDS or OWN.match(name) or _is_member(code, match.start()):
                continue
            if name not in tree.tokens and name not in own_decl:
                _refuse(name, "a function" if called else "a name", piece.file, "this tree has no such name")
            if (
                local is not None
                and not called
                and name[0].islower()
                and not _is_type(code, match.start(), name)
                and not re.search(rf"\b{name}\b", local)
            ):
                _refuse(name, "a local name", piece.file, "the function the hook sits in has no such name")


_LABEL = re.compile(r"^[ \t]*([A-Za-z_]\w*):(?!:)", re.M)  # goto targets the series defines
# A one-line function-like macro of the series that pastes its arguments into names (`RDNA1_KFD(VRAM)` ->
# KFD_IOC_ALLOC_MEM_FLAGS_VRAM): (name, parameters, body).
_PASTING = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)\(([^)\n]*)\)([^\n]*##[^\n]*)$", re.M)


@dataclass(frozen=True)
class PastingMacro:
    name: str
    parameters: tuple[str, ...]
    body: str

    def expand(self, arguments: list[str]) -> str | None:
        """The body with each parameter replaced by its argument and `##` joined, or None if the count differs."""
        if len(arguments) != len(self.parameters):
            return None
        given = dict(zip(self.parameters, arguments, strict=True))
        body = re.sub(r"[A-Za-z_]\w*", lambda m: given.get(m.group(0), m.group(0)), self.body)
        return re.sub(r"\s*##\s*", "", body).strip()


def pasting_macros(codes) -> dict[str, PastingMacro]:
    """The token-pasting macros the code texts (comments and literals already out) define, by name."""
    return {
        name: PastingMacro(name, tuple(p.strip() for p in parameters.split(",")), body)
        for code in codes
        for name, parameters, body in _PASTING.findall(code)
    }


def expand_pasting(code: str, macros: dict[str, PastingMacro]) -> str:
    """The code with the macros' definitions blanked and each use replaced by what it expands to, so that the
    names it builds are checked; a use whose arguments do not fit is left as it is."""
    code = _PASTING.sub(lambda m: m.group(0) if m.group(1) not in macros else "", code)
    for macro in macros.values():

        def expanded(use: re.Match[str], macro: PastingMacro = macro) -> str:
            return macro.expand([a.strip() for a in use.group(1).split(",")]) or use.group(0)

        code = re.sub(rf"\b{macro.name}\s*\(([^()]*)\)", expanded, code)
    return code


_BASIC_TYPES = frozenset("bool u8 u16 u32 u64 s8 s16 s32 s64 __u8 __u16 __u32 __u64".split())


def _is_type(code: str, at: int, name: str) -> bool:
    """A type name rather than a variable: a struct/union/enum tag, a *_t typedef or a kernel basic type."""
    return name in _BASIC_TYPES or name.endswith("_t") or re.search(r"\b(struct|union|enum)\s*$", code[:at]) is not None


def _is_member(code: str, at: int) -> bool:
    before = code[:at].rstrip()
    return before.endswith("->") or (before.endswith(".") and not before.endswith(".."))


def _refuse(name: str, kind: str, file: str, why: str):
    raise SourceError(
        f"cannot render: the series would use `{name}` ({kind}, in {file}) but {why}",
        "the quirk's variant does not fit this driver; report it with the kernel's source package",
    )
