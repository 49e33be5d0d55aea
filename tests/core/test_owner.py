"""core/owner.py: SUDO_USER is read in one place and trusted only when it names the user sudo says (issue 40:
the experiment's board run and doctor took any SUDO_USER at its word and read that user's home as root)."""

import ast
import os
from pathlib import Path

import pytest

import rdna1_kmgr
from rdna1_kmgr.core import owner
from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.doctor import kfd_access

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="SUDO_USER counts only when running as root")
PACKAGE = Path(rdna1_kmgr.__file__).parent


def test_only_core_owner_reads_sudo_user():
    readers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value == "SUDO_USER":
                readers.append(str(path.relative_to(PACKAGE)))
    assert sorted(set(readers)) == ["core/owner.py"]


@as_root
@pytest.mark.parametrize(
    "name,uid",
    [("nobody", "0"), ("nobody", None), ("nobody\n", "65534"), ("no-such-user-x", "1000"), ("../root", "0")],
)
def test_a_sudo_user_sudo_did_not_vouch_for_is_refused(monkeypatch, name, uid):
    monkeypatch.setenv("SUDO_USER", name)
    if uid is None:
        monkeypatch.delenv("SUDO_UID", raising=False)
    else:
        monkeypatch.setenv("SUDO_UID", uid)
    with pytest.raises(HostError, match="SUDO_USER=") as caught:
        owner.invoking_home()  # the home the board experiment reads the owner's shell files from
    assert "\n" not in caught.value.what  # one line, whatever the variable holds
    with pytest.raises(HostError, match="SUDO_USER="):
        kfd_access.invoking_user(Path("/"))  # doctor, on the host


@as_root
def test_the_user_sudo_names_is_the_one_whose_home_is_read(monkeypatch):
    monkeypatch.setenv("SUDO_USER", "nobody")
    monkeypatch.setenv("SUDO_UID", "65534")
    assert owner.invoking_home() == Path("/nonexistent")  # Debian's passwd entry for nobody
    assert kfd_access.invoking_user(Path("/")).uid == 65534
    monkeypatch.delenv("SUDO_USER")
    assert owner.invoking_home() == Path.home()  # root not through sudo: root's own
    assert kfd_access.invoking_user(Path("/")).name == "root"


@as_root
def test_a_fixture_tree_still_refuses_a_name_no_login_could_have(monkeypatch, tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text("guest:x:1001:1001::/home/guest:/bin/sh\n")
    monkeypatch.setenv("SUDO_USER", "guest")
    assert kfd_access.invoking_user(tmp_path).uid == 1001
    monkeypatch.setenv("SUDO_USER", "guest\n")
    with pytest.raises(HostError, match="does not name a user"):
        kfd_access.invoking_user(tmp_path)
