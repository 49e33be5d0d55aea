"""tests/second_lane.py's hand-over: what the second lane's tests receive is the first session's result and a
copy of its files at their own paths, and a lane whose build never comes fails instead of waiting for ever."""

import threading
import time
from pathlib import Path

import pytest
import second_lane


def lane_with_handoff(tmp_path: Path, wanted: frozenset[str]) -> second_lane.Lane:
    handoff = tmp_path / "handoff"
    handoff.mkdir()
    return second_lane.Lane(process=None, log=tmp_path / "lane.log", tests=1, handoff=handoff, wanted=wanted)  # type: ignore[arg-type]


def test_the_lane_receives_the_result_and_the_files_at_their_paths(tmp_path, monkeypatch):
    host = tmp_path / "host"
    (host / "usr/src/pkg-1").mkdir(parents=True)
    (host / "usr/src/pkg-1/manifest.json").write_text('{"mask": 4}')
    (host / "var/lib").mkdir(parents=True)
    (host / "var/lib/key.pub").write_text("KEY")
    lane = lane_with_handoff(tmp_path, frozenset({"built"}))
    monkeypatch.setenv(second_lane.HANDOFF_ENV, str(lane.handoff))

    second_lane.hand_over(
        lane, "built", {"kernel": "6.1.0-1-amd64"}, [host / "usr/src/pkg-1", host / "var/lib/key.pub"]
    )
    got = second_lane.receive("built")

    root = Path(got["files_root"])
    assert got["kernel"] == "6.1.0-1-amd64"
    # at the same absolute paths under the copy's root (the host paths here live under tmp_path)
    assert (root / str(host / "usr/src/pkg-1/manifest.json").lstrip("/")).read_text() == '{"mask": 4}'
    assert (root / str(host / "var/lib/key.pub").lstrip("/")).read_text() == "KEY"
    assert not list(lane.handoff.glob(".*.json")), "the JSON arrives by a rename: no partial file stays"


def test_the_lane_waits_until_the_hand_over(tmp_path, monkeypatch):
    lane = lane_with_handoff(tmp_path, frozenset({"built"}))
    monkeypatch.setenv(second_lane.HANDOFF_ENV, str(lane.handoff))
    later = threading.Timer(0.5, second_lane.hand_over, (lane, "built", {"kernel": "k"}, []))
    later.start()
    started = time.monotonic()
    try:
        assert second_lane.receive("built")["kernel"] == "k"
    finally:
        later.join()
    assert time.monotonic() - started >= 0.5


def test_the_lane_fails_when_the_first_session_ended_without_it(tmp_path, monkeypatch):
    lane = lane_with_handoff(tmp_path, frozenset({"built"}))
    monkeypatch.setenv(second_lane.HANDOFF_ENV, str(lane.handoff))
    second_lane.close_handoff(lane)
    with pytest.raises(pytest.fail.Exception, match="handed no built over"):
        second_lane.receive("built")
