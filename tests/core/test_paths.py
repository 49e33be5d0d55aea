"""core/paths.py (issue 40, M4): a root the tool writes under that someone else could change is refused in one
line, whether it is the default or an environment override; pytest's own temporary folders pass."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rdna1_kmgr.core import paths, trust
from rdna1_kmgr.core.errors import HostError

CLI = Path(sys.executable).parent / "rdna1-kmgr"
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="gives folders away: root only")


def test_a_tmp_path_root_passes_and_the_sticky_tmp_above_it_is_accepted(tmp_path):
    assert Path("/tmp").stat().st_mode & 0o1777 == 0o1777  # what the rule is about
    assert trust.root_problem(tmp_path / "state") is None
    assert trust.root_problem(Path("/var/lib/rdna1-kmgr")) is None


def test_a_sticky_world_writable_folder_is_refused_as_the_root_itself(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    assert trust.root_problem(shared) == f"{shared} is writable by all users (mode 1777)"
    assert trust.root_problem(shared / "state") is None  # a sticky root-owned ancestor, as /tmp


def test_a_group_writable_ancestor_a_link_and_a_relative_path_are_refused(tmp_path):
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o775)
    assert trust.root_problem(open_folder / "state") == f"{open_folder} is writable by its group (mode 0775)"
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert trust.root_problem(tmp_path / "link" / "state") == f"{tmp_path / 'link'} is a symbolic link"
    assert trust.root_problem(Path("state")) == "not an absolute path"


@as_root
def test_an_override_into_a_folder_another_user_owns_is_refused_in_one_line(tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(theirs / "state"))
    with pytest.raises(HostError, match=f"{theirs} is owned by nobody"):
        paths.state_dir()
    run = subprocess.run([str(CLI), "status"], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[0].startswith(f"rdna1-kmgr: error: refusing {theirs / 'state'}"), run.stderr
    assert not (theirs / "state").exists()


@as_root
def test_the_user_the_tool_runs_as_may_own_its_roots_when_that_is_not_root(tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    os.chown(mine, NOBODY, NOBODY)
    assert trust.root_problem(mine) == f"{mine} is owned by nobody"
    monkeypatch.setattr(os, "geteuid", lambda: NOBODY)  # the user's own run can only harm the user
    assert trust.root_problem(mine) is None
