"""The reference that cannot drift: docs/reference.md's generated parts and the man page rdna1-kmgr(8), written
from click's own definitions of the commands, core/errors.py's Exit, the quirk catalog (kmod/quirks/*/quirk.toml) and
TheRock's package indexes (doctor/therock_indexes.py).

Regenerate after changing a command, an exit code or a quirk (tests/commands/test_reference.py fails until then):

    python -m rdna1_kmgr.commands.reference docs

docs/reference.md keeps its hand-written parts (the introduction, files and paths); only the text between a
`<!-- generated: NAME -->` line and its `<!-- end generated: NAME -->` line is replaced. The man page is generated
whole; its FILES section is the reference's hand-written files table, so each path is written down once.
"""

import inspect
import re
import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import click

from rdna1_kmgr import __version__, conformance
from rdna1_kmgr.cli import main
from rdna1_kmgr.core import files, progress
from rdna1_kmgr.core.errors import Exit
from rdna1_kmgr.doctor import therock_indexes
from rdna1_kmgr.host.rdna1_boards import format_id
from rdna1_kmgr.render import quirk_catalog

PROG = "rdna1-kmgr"
WIDTH = 78  # click's layout in any terminal of 80 columns or more (its 80, less 2): the same on every machine
REGENERATE = "python -m rdna1_kmgr.commands.reference docs"
REFERENCE = "reference.md"
MAN_PAGE = "rdna1-kmgr.8"
# The man page's date is the release's, not the day it was generated: the same release gives the same page.
MAN_DATE = date(2026, 11, 26)


@dataclass(frozen=True)
class CommandHelp:
    """One visible command of the tree, as click lays out its help."""

    path: str  # "rdna1-kmgr vm-test gpu"
    usage: str  # the arguments after the path, as click's usage line has them
    text: str  # the command's own help text, paragraphs kept
    options: tuple[tuple[str, str], ...]  # (the option's spellings, its help)
    help: str  # click's whole --help output


def commands() -> list[CommandHelp]:
    """Every command a user can type, the root first, each group before its subcommands, hidden ones left out."""
    found: list[CommandHelp] = []

    def visit(command: click.Command, ctx: click.Context) -> None:
        found.append(
            CommandHelp(
                path=ctx.command_path,
                usage=" ".join(command.collect_usage_pieces(ctx)),
                text=inspect.cleandoc(command.help or ""),
                options=tuple(r for p in command.get_params(ctx) if (r := p.get_help_record(ctx))),
                help=command.get_help(ctx),
            )
        )
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    visit(sub, click.Context(sub, info_name=name, parent=ctx))

    visit(main, click.Context(main, info_name=PROG, terminal_width=WIDTH, **main.context_settings))
    return found


EXIT_LINE = re.compile(r"    (?P<name>[A-Z_]+) = (?P<code>\d+)  # (?P<meaning>.+)")


def exit_codes() -> list[tuple[int, str, str]]:
    """(code, name, meaning) of every Exit member, aliases included, with the comment errors.py gives it."""
    meanings = {}
    for line in inspect.getsource(Exit).splitlines():
        if match := EXIT_LINE.fullmatch(line):
            meanings[match.group("name")] = match.group("meaning")
    missing = sorted(set(Exit.__members__) - set(meanings))
    if missing:
        raise ValueError(f"core/errors.py: Exit members without a `# meaning` comment on their line: {missing}")
    return [(int(member), name, meanings[name]) for name, member in Exit.__members__.items()]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def commands_markdown() -> str:
    parts = []
    for command in commands():
        depth = command.path.count(" ")
        heading = "### " if depth <= 1 else "#### "
        parts.append(f"{heading}`{command.path}`\n\n```text\n{command.help.rstrip()}\n```\n")
    return "\n".join(parts)


def exit_codes_markdown() -> str:
    rows = [f"| {code} | `{name}` | {_cell(meaning)} |" for code, name, meaning in exit_codes()]
    return "\n".join(["| code | name | meaning |", "|---|---|---|", *rows]) + "\n"


def quirks_markdown() -> str:
    catalog = sorted(quirk_catalog.load_quirks().values(), key=lambda q: min(b.bit for b in q.bits))
    bits = sorted(((b, q) for q in catalog for b in q.bits), key=lambda pair: pair[0].bit)
    lines = [
        "| bit | name | quirk | on by default | what it does | known risk |",
        "|---|---|---|---|---|---|",
        *(
            f"| {format_id(1 << b.bit)} | `{b.id}` | `{q.id}` | {'yes' if b.default else 'no'} | {_cell(b.title)} "
            f"| {_cell(b.risk)} |"
            for b, q in bits
        ),
        "",
    ]
    for q in catalog:
        lines += [f"### `{q.id}`", "", _cell(q.summary) + ".", ""]
        if q.changes:
            lines.append(f"- changes: {_cell(q.changes)}")
        if q.scope:
            lines.append(f"- matters: {_cell(q.scope)}")
        lines.append("- evidence owners need it: " + ("; ".join(_cell(e) for e in q.evidence) or "none (opt-in)"))
        for need in q.needed_when:
            lines.append(f"- needed only where {_cell(str(need.fact))} (else left out: {_cell(need.otherwise)})")
        for fixed in q.fixed_when:
            lines.append(f"- left out where {_cell(str(fixed.fact))}: {_cell(fixed.because)}")
        lines += ["", "| variant | first seen | chosen when the tree's... |", "|---|---|---|"]
        lines += [
            f"| `{v.id}` | {_cell(v.kernels)} | {'; '.join(_cell(str(f)) for f in v.facts)} |" for v in q.variants
        ]
        lines.append("")
    return "\n".join(lines)


def distributions_markdown() -> str:
    return "\n".join(conformance.markdown_table()) + "\n"


def therock_indexes_markdown() -> str:
    return "\n".join(therock_indexes.markdown_table()) + "\n"


GENERATED = {
    "commands": commands_markdown,
    "exit-codes": exit_codes_markdown,
    "quirks": quirks_markdown,
    "therock-indexes": therock_indexes_markdown,
    "distributions": distributions_markdown,
}


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- generated: {name} -->\n)(.*?)(<!-- end generated: {name} -->\n)", re.S)


def reference_text(current: str) -> str:
    """docs/reference.md with every generated part written anew, the rest as it is."""
    text = current
    for name, make in GENERATED.items():
        block = _block(name)
        if len(block.findall(text)) != 1:
            raise ValueError(f"{REFERENCE}: needs exactly one `<!-- generated: {name} -->` ... `end generated` block")
        body = make()

        def filled(match: re.Match[str], body: str = body) -> str:
            return match[1] + "\n" + body + "\n" + match[3]

        text = block.sub(filled, text)
    return text


FILES_ROW = re.compile(r"\| `(?P<path>[^`]+)` \| (?P<what>.+) \|")


def files_table(reference: str) -> list[tuple[str, str]]:
    """The hand-written "Files and paths" table of docs/reference.md: (path, what it is)."""
    section = reference.split("\n## Files and paths\n", 1)[1].split("\n## ", 1)[0]
    return [(m.group("path"), m.group("what")) for line in section.splitlines() if (m := FILES_ROW.fullmatch(line))]


def _roff(text: str) -> str:
    """Text as roff reads it literally: backslashes escaped, no line starting a request, dashes as minus signs."""
    out = []
    for line in text.replace("\\", "\\e").replace("-", "\\-").splitlines():
        out.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(out)


def _paragraphs(text: str) -> str:
    """click's help text as roff paragraphs; a `\\b` paragraph keeps its lines as they are."""
    out = []
    for para in re.split(r"\n\s*\n", text.strip()):
        lines = para.splitlines()
        if lines and lines[0].strip() == "\b":
            out.append(".PP\n.nf\n" + _roff("\n".join(lines[1:])) + "\n.fi")
        else:
            out.append(".PP\n" + _roff(" ".join(line.strip() for line in lines)))
    return "\n".join(out)


def _markdown_to_plain(text: str) -> str:
    return text.replace("`", "").replace("**", "")


def man_page(reference: str) -> str:
    tree = commands()
    root = tree[0]
    lines = [
        f'.\\" Generated by {REGENERATE}: do not edit.',
        f'.TH RDNA1\\-KMGR 8 "{MAN_DATE.isoformat()}" "rdna1\\-kmgr {__version__}" "System Administration"',
        ".SH NAME",
        "rdna1\\-kmgr \\- " + _roff(root.text.split("\n\n")[0].rstrip(".").strip()),
        ".SH SYNOPSIS",
        f".B {PROG.replace('-', chr(92) + '-')}",
        _roff(root.usage),
        ".SH DESCRIPTION",
        _paragraphs(root.text),
        ".PP",
        "Start with",
        ".B rdna1\\-kmgr doctor",
        "(it reads, changes nothing, and says whether a kernel change is needed at all). Every command that changes",
        "the system is journaled and undone by",
        '.BR "rdna1\\-kmgr rollback" .',
        "The kernel command line word",
        ".B amdgpu.rdna1_quirks=0",
        "gives the stock driver's behaviour back.",
        ".SH OPTIONS",
    ]
    for spellings, meaning in root.options:
        lines += [".TP", f".B {_roff(spellings)}", _roff(meaning)]
    lines.append(".SH COMMANDS")
    for command in tree[1:]:
        lines += [f'.SS "{_roff(command.path)}"', f".B {_roff(command.path)}", _roff(command.usage)]
        lines.append(_paragraphs(command.text))
        for spellings, meaning in command.options:
            lines += [".TP", f".B {_roff(spellings)}", _roff(meaning)]
    lines += [".SH EXIT STATUS", "Errors are one line on standard error, what is wrong and what to do."]
    for code, name, meaning in exit_codes():
        lines += [".TP", f".B {code}", _roff(f"{name}: {meaning}")]
    lines.append(".SH FILES")
    for path, what in files_table(reference):
        lines += [".TP", f".I {_roff(path)}", _roff(_markdown_to_plain(what))]
    lines += [
        ".SH SEE ALSO",
        ".BR dkms (8),",
        ".BR mokutil (1),",
        ".BR grub\\-editenv (1),",
        ".BR modprobe.d (5).",
        "The guide, the reference with the quirk table and the design notes are in the project's",
        ".I docs/",
        "folder.",
        "",
    ]
    return "\n".join(lines)


def generated(docs: Path) -> dict[Path, str]:
    """What the two files in `docs` should hold, from the code as it is now."""
    reference = reference_text((docs / REFERENCE).read_text())
    return {docs / REFERENCE: reference, docs / MAN_PAGE: man_page(reference)}


def write(docs: Path) -> list[Path]:
    """Write the generated files; return those that changed."""
    changed = []
    for path, text in generated(docs).items():
        if not path.is_file() or path.read_text() != text:
            files.write_atomic(path, text.encode())
            changed.append(path)
    return changed


if __name__ == "__main__":
    for path in write(Path(sys.argv[1] if len(sys.argv) > 1 else "docs")):
        progress.say(f"rewrote {path}")
