"""follow/<KREL>.json as a FollowRecord: the file keeps the keys the release before it wrote (scripts and `status`
read them), a file of an older or later release is still read, and a file that is no record says why."""

import dataclasses
import json
import re

import pytest

from rdna1_kmgr.follow import follow_record
from rdna1_kmgr.follow.follow_record import FollowRecord

KREL = "6.1.0-56-amd64"
SHA = "ab" * 32
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}"  # time.strftime("%Y-%m-%dT%H:%M:%S%z")


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path / "state"))
    return tmp_path / "state"


def record_file(state):
    return state / "follow" / f"{KREL}.json"


def test_an_older_file_with_a_key_it_does_not_know_and_no_optional_ones_is_read(state):
    record_file(state).parent.mkdir(parents=True)
    record_file(state).write_text(
        json.dumps(
            {"kernel": KREL, "state": "stock", "updated": "2026-01-02T03:04:05+0000", "retries": 2, "reason": "no"}
        )
    )
    record = follow_record.read(KREL)
    assert record == FollowRecord(KREL, "stock", "2026-01-02T03:04:05+0000", reason="no")
    assert (record.stage, record.log, record.pid, record.package, record.quirks) == (None, None, None, None, None)
    assert follow_record.describe(record) == "keeps the stock amdgpu: no (at None; log None)"


def test_write_then_read_gives_back_every_field_and_the_file_has_the_keys_written_before(state):
    given = FollowRecord(
        KREL,
        "patched",
        reason="r",
        stage="s",
        log="/var/log/rdna1-kmgr/follow.log",
        pid=4242,
        package="rdna1-amdgpu",
        package_version="6.1.192+p0123456789ab",
        module_sha256=SHA,
        verdict="pass",
        verdict_record="/var/lib/rdna1-kmgr/verdicts/x.json",
        quirks=("cwsr-size", "gfxoff"),
    )
    written = follow_record.write(given)
    assert follow_record.read(KREL) == written
    assert written.updated is not None and dataclasses.replace(written, updated=None) == given
    on_disk = json.loads(record_file(state).read_text())
    assert re.fullmatch(STAMP, on_disk.pop("updated")), written.updated
    assert on_disk == {
        "kernel": KREL,
        "state": "patched",
        "reason": "r",
        "stage": "s",
        "log": "/var/log/rdna1-kmgr/follow.log",
        "pid": 4242,
        "package": "rdna1-amdgpu",
        "package_version": "6.1.192+p0123456789ab",
        "module_sha256": SHA,
        "verdict": "pass",
        "verdict_record": "/var/lib/rdna1-kmgr/verdicts/x.json",
        "quirks": ["cwsr-size", "gfxoff"],
    }
    # indent 2, sorted keys: the layout write_json gave the dict before
    assert record_file(state).read_text().startswith('{\n  "kernel": ')


@pytest.mark.parametrize(
    "state_name, fields, keys",
    [
        ("pending", {}, {"kernel", "state", "updated"}),
        ("running", {"pid": 7, "log": "l"}, {"kernel", "state", "updated", "pid", "log"}),
        (
            "stock",
            {"stage": "build", "reason": "r", "log": "l"},
            {"kernel", "state", "updated", "stage", "reason", "log"},
        ),
        # a kernel installed already without a VM verdict (--skip-vm-check): its patched keys stay, as nulls
        (
            "patched",
            {"package": "rdna1-amdgpu", "package_version": "1", "reason": "installed already"},
            {"kernel", "state", "updated", "package", "package_version", "module_sha256", "verdict", "reason"},
        ),
    ],
)
def test_each_outcome_writes_only_its_keys(state, state_name, fields, keys):
    follow_record.write(FollowRecord(KREL, state_name, **fields))
    on_disk = json.loads(record_file(state).read_text())
    assert set(on_disk) == keys
    assert follow_record.read(KREL).to_json() == on_disk
    assert (state / "follow" / "pending" / KREL).exists() == (state_name in ("pending", "running"))


@pytest.mark.parametrize(
    "text, reason",
    [
        ("{not json", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        ("[1, 2]", "not an object"),
        ('{"kernel": "6.1.0-56-amd64"}', "it has no 'state'"),
        (
            '{"kernel": "6.1.0-56-amd64", "state": "done"}',
            "its state 'done' is none of pending, running, patched, stock",
        ),
        ('{"kernel": "6.1.0-56-amd64", "state": "running", "pid": "12"}', "its 'pid' is not a whole number: '12'"),
        ('{"kernel": "6.1.0-56-amd64", "state": "patched", "quirks": [1]}', "its 'quirks' is not a list of names: [1]"),
    ],
)
def test_a_file_that_is_no_record_reads_as_unreadable_with_the_reason(state, text, reason):
    record_file(state).parent.mkdir(parents=True)
    record_file(state).write_text(text)
    record = follow_record.read(KREL)
    assert record == FollowRecord(KREL, "unreadable", None, reason=reason)
    assert record.to_json() == {"kernel": KREL, "state": "unreadable", "reason": reason}
    assert follow_record.describe(record) == f"unreadable: {reason}"


def test_a_state_outside_the_states_is_a_bug(state):
    with pytest.raises(AssertionError):
        follow_record.write(FollowRecord(KREL, "unreadable"))  # read's word, never written
    with pytest.raises(AssertionError):
        FollowRecord(KREL, "done", None)
    assert not state.exists()


def test_no_record_is_none():
    assert follow_record.describe(None) is None


def test_the_lines_status_and_the_hook_print(state):
    running = follow_record.write(FollowRecord(KREL, "running", pid=4242, log="f.log"))
    assert follow_record.describe(running) == f"running since {running.updated} (pid 4242), log f.log"
    patched = follow_record.write(
        FollowRecord(KREL, "patched", package="rdna1-amdgpu", package_version="1", verdict="pass")
    )
    assert follow_record.describe(patched) == f"patched: rdna1-amdgpu/1 installed, VM verdict pass ({patched.updated})"
