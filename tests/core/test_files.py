"""core/files.py: the records the tool writes keep their bytes."""

from rdna1_kmgr.core.files import write_json


def test_write_json_lays_a_record_out_as_its_readers_expect(tmp_path):
    path = tmp_path / "record.json"
    write_json(path, {"state": "done", "kernel": "6.1.0-13-amd64", "cells": [1]}, indent=2, sort_keys=True)
    assert path.read_bytes() == b'{\n  "cells": [\n    1\n  ],\n  "kernel": "6.1.0-13-amd64",\n  "state": "done"\n}\n'
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]  # no temporary left beside it


def test_write_json_without_layout_is_one_line_in_the_callers_key_order(tmp_path):
    path = tmp_path / "current.json"
    write_json(path, {"folder": "/var/lib/x", "a": None})
    assert path.read_text() == '{"folder": "/var/lib/x", "a": null}\n'
