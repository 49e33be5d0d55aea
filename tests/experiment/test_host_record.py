"""The host experiment's record as its files hold it: record.json in the run's folder and
experiments/host-latest.json, which `experiment apply`, the kernel cells and `report` read back by their keys."""

import json

import pytest

from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.experiment import answer
from rdna1_kmgr.experiment import apply as apply_answer
from rdna1_kmgr.experiment.cell_run import HostResult, Limits
from rdna1_kmgr.experiment.host_cells import HostCell
from rdna1_kmgr.experiment.host_record import HostContext
from rdna1_kmgr.userspace import profiles
from rdna1_kmgr.vm import cell_outcomes

NO_COUNTS = {
    "pass": 0,
    "wrong": 0,
    "not-applicable": 0,
    "invalid-device-function": 0,
    "kernel-image-invalid": 0,
    "queue-failed": 0,
    "memory-fault": 0,
    "hang": 0,
    "ring-timeout": 0,
    "gpu-reset": 0,
    "crash": 0,
    "not-run": 0,
}


def context(dead_end: str | None = None) -> HostContext:
    return HostContext(
        board="0000:0a:00.0",
        python="/home/alice/venv/bin/python",
        owner="alice",
        torch="2.11.0+rocm7.1",
        hip=None,
        kernel_log_readable=False,
        limits=Limits(30.0, 600.0),
        sweep="experiment-quick",
        planned=("as-installed/miopen", "no-override/miopen"),
        stopped=None,
        dead_end=dead_end,
    )


def passed(profile: str) -> HostResult:
    return HostResult(
        HostCell(profiles.get(profile), cell_outcomes.BACKENDS["miopen"]), "pass", "40 cases", None, None, 0.0, 2.5
    )


def cell_json(profile: str) -> dict:
    return {
        "cell": f"{profile}/miopen",
        "profile": profile,
        "backend": "miopen",
        "outcome": "pass",
        "detail": "40 cases",
        "stage": None,
        "case": None,
        "max_error": 0.0,
        "seconds": 2.5,
        "versions": {},
        "kernel_log": [],
        "heartbeats": 0,
        "folder": "",
        "reset_failed": False,
        "caches": "",
    }


def test_a_finished_run_writes_every_key_and_the_same_record_twice(tmp_path, monkeypatch):
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path / "state"))
    folder = answer.new_run_dir()
    best = passed("as-installed")
    record = answer.write(folder, [best, passed("no-override")], best, context())
    written = json.loads((folder / "record.json").read_text())
    assert written == json.loads((tmp_path / "state/experiments/host-latest.json").read_text())
    assert written == record.to_json()
    assert list(written) == [
        "time",
        "kind",
        "board",
        "python",
        "owner",
        "torch",
        "hip",
        "kernel_log_readable",
        "limits",
        "sweep",
        "planned",
        "stopped",
        "dead_end",
        "cells",
        "counts",
        "recommended",
        "answer",
        "folder",
        "html",
    ]
    assert {k: v for k, v in written.items() if k != "time"} == {
        "kind": "host",
        "board": "0000:0a:00.0",
        "python": "/home/alice/venv/bin/python",
        "owner": "alice",
        "torch": "2.11.0+rocm7.1",
        "hip": None,
        "kernel_log_readable": False,
        "limits": {"case": 30.0, "cell": 600.0},
        "sweep": "experiment-quick",
        "planned": ["as-installed/miopen", "no-override/miopen"],
        "stopped": None,  # null, not left out: readers ask record["dead_end"] and the like
        "dead_end": None,
        "cells": [cell_json("as-installed"), cell_json("no-override")],
        "counts": {**NO_COUNTS, "pass": 2},
        "recommended": cell_json("as-installed"),
        "answer": ["nothing to change: as-installed/miopen passes, your system as it is with PyTorch's defaults"],
        "folder": str(folder),
        "html": str(folder / "table.html"),
    }
    assert (folder / "table.html").read_text().startswith("<!doctype html>")


def test_a_dead_end_is_the_answer_and_apply_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path / "state"))
    folder = answer.new_run_dir()
    record = answer.write(folder, [], None, context(dead_end="stopped at the first cell"))
    assert record.answer == ("stopped at the first cell",)
    written = json.loads((tmp_path / "state/experiments/host-latest.json").read_text())
    assert written["dead_end"] == "stopped at the first cell" and written["recommended"] is None
    assert written["cells"] == [] and written["counts"] == NO_COUNTS
    with pytest.raises(UsageError, match="the last experiment tried no setting: stopped at the first cell"):
        apply_answer.apply(dry_run=True)
