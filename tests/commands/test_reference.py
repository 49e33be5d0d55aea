"""docs/reference.md's generated parts and the man page docs/rdna1-kmgr.8 are what the code says now, and say
what a reader checks them for: every command, every exit code, every quirk bit as quirk.toml writes it."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from rdna1_kmgr.commands import reference
from rdna1_kmgr.core.errors import Exit

REPO = Path(__file__).resolve().parents[2]  # the checkout's docs: the tests run on the installed package
DOCS = REPO / "docs"
QUIRKS = REPO / "kmod" / "quirks"
COMMAND = Path(sys.executable).with_name("rdna1-kmgr")


def test_the_committed_reference_and_man_page_are_what_the_code_generates(tmp_path):
    shutil.copy(DOCS / reference.REFERENCE, tmp_path / reference.REFERENCE)
    reference.write(tmp_path)
    stale = [
        name
        for name in (reference.REFERENCE, reference.MAN_PAGE)
        if (tmp_path / name).read_text() != (DOCS / name).read_text()
    ]
    assert stale == [], f"docs/{' and docs/'.join(stale)} differ from the code: run `{reference.REGENERATE}`"


def _help(*words: str) -> str:
    result = subprocess.run(
        [str(COMMAND), *words, "--help"], capture_output=True, text=True, env={**os.environ, "COLUMNS": "100"}
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _listed_commands(words: tuple[str, ...]) -> list[str]:
    """The subcommands `rdna1-kmgr WORDS --help` lists, as a user reads them."""
    lines = _help(*words).splitlines()
    if "Commands:" not in lines:
        return []
    return [
        line.split()[0] for line in lines[lines.index("Commands:") + 1 :] if line.startswith("  ") and line[2] != " "
    ]


def test_every_command_the_cli_lists_has_its_help_in_the_reference_and_the_man_page():
    text, man = (DOCS / reference.REFERENCE).read_text(), (DOCS / reference.MAN_PAGE).read_text()
    found, todo = [], [()]
    while todo:
        words = todo.pop()
        for name in _listed_commands(words):
            todo.append((*words, name))
            found.append(" ".join(("rdna1-kmgr", *words, name)))
    assert len(found) > 30, "the walk over --help found too few commands"
    assert [c for c in found if f"`{c}`\n\n```text\nUsage: {c} " not in text] == []
    assert [c for c in found if f'.SS "{c.replace("-", chr(92) + "-")}"' not in man] == []
    # a command's whole --help, as the installed command prints it, is in the reference
    assert _help("install").strip() in text


def test_every_exit_code_is_in_the_reference_and_the_man_page():
    text, man = (DOCS / reference.REFERENCE).read_text(), (DOCS / reference.MAN_PAGE).read_text()
    for name, code in Exit.__members__.items():
        assert f"| {int(code)} | `{name}` |" in text
        assert f".B {int(code)}\n{name}:" in man


def test_every_quirk_bit_of_quirk_toml_is_a_row_of_the_quirk_table():
    text = (DOCS / reference.REFERENCE).read_text()
    bits = []
    for path in sorted(QUIRKS.glob("*/quirk.toml")):
        raw = tomllib.loads(path.read_text())
        # a quirk is one bit, or one bit per memory class
        for entry in raw.get("classes", [raw]):
            bits.append((entry["bit"], entry["id"], entry["default"], raw["id"]))
    assert len(bits) >= 4
    for bit, name, default, quirk in bits:
        row = f"| 0x{1 << bit:04x} | `{name}` | `{quirk}` | {'yes' if default else 'no'} |"
        assert row in text, row


@pytest.mark.skipif(shutil.which("groff") is None, reason="no groff here to render the man page")
def test_the_man_page_renders_without_a_warning():
    result = subprocess.run(
        ["groff", "-man", "-ww", "-z", str(DOCS / reference.MAN_PAGE)], capture_output=True, text=True
    )
    assert (result.returncode, result.stderr) == (0, "")
    page = subprocess.run(["groff", "-man", "-Tascii", str(DOCS / reference.MAN_PAGE)], capture_output=True, text=True)
    plain = re.sub(".\b", "", page.stdout)  # the terminal's bold and underline
    assert "rdna1-kmgr rollback" in plain
    assert "/var/lib/rdna1-kmgr" in plain  # the FILES section, from the reference's table


def test_a_changed_help_text_is_caught_and_the_message_names_the_command(tmp_path):
    (tmp_path / reference.REFERENCE).write_text(
        (DOCS / reference.REFERENCE).read_text().replace("Show the version and exit.", "Show it.")
    )
    shutil.copy(DOCS / reference.MAN_PAGE, tmp_path / reference.MAN_PAGE)
    assert reference.write(tmp_path) == [tmp_path / reference.REFERENCE]
    assert "Show the version and exit." in (tmp_path / reference.REFERENCE).read_text()


def test_a_reference_without_its_generated_block_is_refused(tmp_path):
    (tmp_path / reference.REFERENCE).write_text("# reference\n\n## Files and paths\n\n")
    with pytest.raises(ValueError, match="generated: commands"):
        reference.write(tmp_path)
