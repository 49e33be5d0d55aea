"""core/cache_entry.py: an entry is whole or absent, and a second maker waits for the first."""

import threading
import time

import pytest

from rdna1_kmgr.core import cache_entry


def test_a_second_holder_of_an_entry_lock_waits_for_the_first(tmp_path):
    order = []
    first_holds = threading.Event()

    def second():
        first_holds.wait()
        with cache_entry.exclusive(tmp_path, "6.1.0-13"):
            order.append("second")

    thread = threading.Thread(target=second)
    thread.start()
    with cache_entry.exclusive(tmp_path, "6.1.0-13"):
        first_holds.set()
        time.sleep(0.3)  # the second thread is blocked in flock by now
        order.append("first")
    thread.join(10)
    assert order == ["first", "second"]


def test_other_entries_do_not_wait(tmp_path):
    got = []

    def other():
        with cache_entry.exclusive(tmp_path, "b"):
            got.append("b")

    with cache_entry.exclusive(tmp_path, "a"):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(10)
        assert got == ["b"]


def test_an_interrupted_entry_leaves_nothing_and_a_published_one_is_whole(tmp_path):
    with pytest.raises(KeyboardInterrupt), cache_entry.staging(tmp_path, "tree") as tmp:
        (tmp / "half").write_text("x")
        raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    with cache_entry.staging(tmp_path, "tree") as tmp:
        (tmp / "tree").mkdir()
        (tmp / "tree" / "Makefile").write_text("VERSION = 6\n")
        final = cache_entry.publish(tmp / "tree", tmp_path / "6.1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["6.1"]
    assert (final / "Makefile").read_text() == "VERSION = 6\n"
