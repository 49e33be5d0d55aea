"""core/trust.py: a path is trusted only when it and every folder up to / can be changed by the trusted alone."""

import os
import tempfile
from pathlib import Path

import pytest

from rdna1_kmgr.core.trust import untrusted

ROOT = frozenset({0})


@pytest.fixture
def tree(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("chowns to another user")
    tmp_path.chmod(0o755)
    return tmp_path


def test_a_root_owned_path_is_trusted_and_tmps_sticky_bit_is_no_hold(tree):
    (tree / "bin").mkdir()
    (tree / "bin/tool").write_text("x")
    assert untrusted(tree / "bin/tool", ROOT) is None
    sticky = Path(tempfile.mkdtemp(dir="/tmp"))  # /tmp: 1777, root's
    try:
        assert untrusted(sticky, ROOT) is None
    finally:
        sticky.rmdir()


def test_a_folder_others_can_write_on_the_way_is_named(tree):
    (tree / "shared/bin").mkdir(parents=True)
    (tree / "shared/bin/tool").write_text("x")
    (tree / "shared").chmod(0o775)
    assert untrusted(tree / "shared/bin/tool", ROOT) == f"{tree / 'shared'} is writable by its group (mode 0775)"
    (tree / "shared").chmod(0o757)
    assert "writable by all users" in untrusted(tree / "shared/bin/tool", ROOT)
    # A sticky folder that is not root's is no exception: its owner may still replace what is in it.
    (tree / "shared").chmod(0o1777)
    os.chown(tree / "shared", 65534, 65534)
    assert "is owned by" in untrusted(tree / "shared/bin/tool", ROOT)


def test_a_link_is_checked_where_it_leads(tree):
    (tree / "theirs").mkdir()
    (tree / "theirs/tool").write_text("x")
    os.chown(tree / "theirs", 65534, 65534)
    (tree / "link").symlink_to(tree / "theirs/tool")
    assert untrusted(tree / "link", ROOT) == f"{tree / 'theirs'} is owned by nobody"
    assert untrusted(tree / "link", frozenset({0, 65534})) is None


def test_the_walk_roots_are_checked_by_refuses_links_passes_what_is_missing_and_wants_a_folder(tree):
    """The same walk checks the roots the tool writes under (core/paths.py): there a link is refused where it is,
    a part not made yet passes, and the path must be a folder."""
    (tree / "real").mkdir()
    (tree / "link").symlink_to(tree / "real")
    (tree / "a-file").write_text("x")
    assert untrusted(tree / "link/state", ROOT) == f"{tree / 'link/state'}: No such file or directory"
    assert untrusted(tree / "link/state", ROOT, links=False, missing_ok=True) == f"{tree / 'link'} is a symbolic link"
    assert untrusted(tree / "real/state/sub", ROOT, links=False, missing_ok=True) is None
    assert untrusted(tree / "a-file", ROOT, folder=True) == f"{tree / 'a-file'} is not a folder"
    assert untrusted(tree / "a-file/state", ROOT, missing_ok=True) == f"{tree / 'a-file'} is not a folder"
    # The path itself gets no sticky exception: anyone may add entries to it.
    (tree / "real").chmod(0o1777)
    assert untrusted(tree / "real", ROOT) == f"{tree / 'real'} is writable by all users (mode 1777)"
    assert untrusted(tree / "real/state", ROOT, missing_ok=True) is None
