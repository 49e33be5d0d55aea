"""The command line's own answers: a misspelled command, and the hint a refused user gets (issue 50)."""

import pytest
from click.testing import CliRunner

from rdna1_kmgr import cli
from rdna1_kmgr.commands import rollback


@pytest.mark.parametrize(
    ("typed", "said"),
    [
        (
            "instal",
            "rdna1-kmgr: error: no command 'instal': did you mean `install`? `rdna1-kmgr --help` lists the commands",
        ),
        (
            "rolback",
            "rdna1-kmgr: error: no command 'rolback': did you mean `rollback`? `rdna1-kmgr --help` lists the commands",
        ),
        ("xyzzy", "rdna1-kmgr: error: no command 'xyzzy': `rdna1-kmgr --help` lists the commands"),
    ],
)
def test_a_misspelled_command_gets_one_line_and_the_closest_name(typed, said):
    result = CliRunner().invoke(cli.main, [typed, "--dry-run"])
    assert result.exit_code == 2 and result.stderr.splitlines() == [said] and result.stdout == ""


def test_the_sudo_hint_repeats_the_command_line_flags_included(monkeypatch):
    """`rollback --dry-run` refused for want of root must not send the owner to `sudo rdna1-kmgr rollback`."""

    def denied(*_, **__):
        raise PermissionError(13, "Permission denied", "/var/lib/rdna1-kmgr/journal")

    monkeypatch.setattr(rollback, "run", denied)
    result = CliRunner().invoke(cli.main, ["rollback", "--dry-run", "--kernel", "6.1.0-9-amd64"])
    assert result.exit_code == 4
    assert result.stderr.splitlines() == [
        "rdna1-kmgr: error: permission denied: /var/lib/rdna1-kmgr/journal: rdna1-kmgr keeps its state and logs "
        "root's alone: run `sudo rdna1-kmgr rollback --dry-run --kernel 6.1.0-9-amd64`"
    ]
