"""Every exit code comes from core/errors.py's Exit, and the README's Errors paragraph names each one a user can
meet from an error class."""

import ast
import re
from pathlib import Path

from layout_facts import PACKAGE, modules

from rdna1_kmgr.core.errors import Exit

README = Path(__file__).resolve().parents[2] / "README.md"  # the checkout's: the tests run on the installed package


def assigned_exit_codes() -> list[tuple[str, ast.expr]]:
    found = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name | ast.Attribute) and getattr(t, "id", getattr(t, "attr", "")) == "exit_code"
                for t in node.targets
            ):
                found.append((f"{path.relative_to(PACKAGE)}:{node.lineno}", node.value))
    return found


def test_no_exit_code_is_a_bare_number():
    found = assigned_exit_codes()
    assert len(found) >= 9  # the check sees the error classes
    assert [where for where, value in found if isinstance(value, ast.Constant)] == []


def test_the_readme_says_what_each_error_code_means():
    paragraph = README.read_text().split("with an exit code by kind:", 1)[1].split("\n\n", 1)[0]
    said = {int(n) for n in re.findall(r"(?<![\w.])(\d+) [a-z]", paragraph)}
    assert {int(code) for code in Exit if code != Exit.FAILED} <= said


def test_each_kind_has_its_own_code():
    # An IntEnum member with another's value is an alias of it: a script could not tell the two kinds apart.
    aliases = [name for name, code in Exit.__members__.items() if code.name != name]
    assert aliases == []


def test_the_codes_a_user_may_already_script_against_stay():
    # The README's Errors paragraph as it stood before GPU_LOST got its own code: these meanings do not move.
    assert (Exit.USAGE, Exit.SOURCE, Exit.HOST, Exit.BUILD, Exit.JOURNAL, Exit.BUSY, Exit.REFUSED) == (
        2,
        3,
        4,
        5,
        6,
        7,
        8,
    )
    assert Exit.INTERRUPTED == 130 and Exit.GPU_LOST == 9
