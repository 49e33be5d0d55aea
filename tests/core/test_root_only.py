"""A change of the system asked for by a user is refused in one line before anything is said, with the command
line to type, flags included (issue 50: `install` once said "installing for ..." first)."""

from click.testing import CliRunner

from rdna1_kmgr import cli
from rdna1_kmgr.core import root_only


def test_install_as_a_user_is_refused_first_with_the_whole_command_line(monkeypatch):
    monkeypatch.setattr(root_only.os, "geteuid", lambda: 1000)
    result = CliRunner().invoke(cli.main, ["install", "--kernel", "6.1.0-9-amd64", "--yes"])
    assert result.exit_code == 4 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "rdna1-kmgr: error: install changes the system and needs root: run "
        "`sudo rdna1-kmgr install --kernel 6.1.0-9-amd64 --yes`"
    ]
