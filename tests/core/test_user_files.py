"""core/user_files.py: what root reads of a user's files stays inside their home (or venv), is a regular file and
is no bigger than such a file is (issue 40: doctor and discovery followed links and had no size limit)."""

import os
import threading
from pathlib import Path

import pytest

from rdna1_kmgr.core import user_files
from rdna1_kmgr.core.user_files import Refused


@pytest.fixture
def home(tmp_path):
    (tmp_path / "home/owner/dotfiles").mkdir(parents=True)
    (tmp_path / "secret").write_text("root:$y$j9T$hash:19000:0:99999:7:::\n")
    return tmp_path / "home/owner"


def test_a_link_out_of_the_home_is_not_read_and_one_inside_it_is(home, tmp_path):
    (home / ".bashrc").symlink_to("/etc/shadow")
    with pytest.raises(Refused, match=r"\.bashrc leads to /etc/shadow, out of .*home/owner: not read"):
        user_files.read_text(home / ".bashrc", home, user_files.SHELL_FILE)
    (home / ".profile").symlink_to(tmp_path / "secret")  # a readable stand-in: the refusal is the rule's
    with pytest.raises(Refused, match="out of"):
        user_files.read_text(home / ".profile", home, user_files.SHELL_FILE)
    (home / "up").symlink_to("..")
    with pytest.raises(Refused, match="out of"):
        user_files.read_head(home / "up/../secret", home, 10)
    (home / "dotfiles/zshrc").write_text("export A=1\n")
    (home / ".zshrc").symlink_to("dotfiles/zshrc")  # GNU stow's way: a link inside the home
    assert user_files.read_text(home / ".zshrc", home, user_files.SHELL_FILE) == "export A=1\n"


def test_a_file_over_its_cap_is_refused_whole_and_a_head_is_only_the_head(home):
    (home / ".bashrc").write_bytes(b"# x\n" * (user_files.SHELL_FILE // 4) + b"export B=1\n")
    with pytest.raises(Refused, match=r"\.bashrc is over 64 KiB"):
        user_files.read_text(home / ".bashrc", home, user_files.SHELL_FILE)
    (home / ".profile").write_bytes(b"# x\n" * (user_files.SHELL_FILE // 4))
    assert len(user_files.read_text(home / ".profile", home, user_files.SHELL_FILE)) == 64 * 1024
    assert user_files.read_head(home / ".bashrc", home, 8) == b"# x\n# x\n"


def test_a_fifo_or_a_device_is_refused_without_waiting(home):
    os.mkfifo(home / ".bashrc")
    done = []
    reader = threading.Thread(target=lambda: done.append(_refusal(home / ".bashrc", home)), daemon=True)
    reader.start()
    reader.join(10)
    assert done == ["not a regular file"]  # a FIFO nobody writes to would have blocked for ever
    (home / ".zshrc").symlink_to("/dev/zero")
    assert _refusal(home / ".zshrc", None) == "not a regular file"


def _refusal(path: Path, within) -> str:
    try:
        user_files.read_text(path, within, user_files.SHELL_FILE)
    except Refused as err:
        return "not a regular file" if "not a regular file" in str(err) else str(err)
    return "read"
