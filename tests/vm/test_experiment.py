"""The experiment matrix: the driver on canned guest outcomes (pass, wrong, crash, hang in the guest and of
the whole VM), the table, the recommendation and the record; then the cell runner (qemu/guest/matrix.py)
really run in emulated VMs, the stand-in amdgpu loaded with each cell's mask and conv2d comparing the CPU
with itself (marked `vm`; needs a Python with torch, see test_passthrough_verdict.torch_python)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rdna1_kmgr.cli import main
from rdna1_kmgr.experiment import answer
from rdna1_kmgr.render import quirk_catalog
from rdna1_kmgr.userspace import profiles
from rdna1_kmgr.vm import experiment, experiment_guest, guest_view
from rdna1_kmgr.vm.experiment_board import BoardExperiment

CATALOG = quirk_catalog.load_quirks()


def load_guest_script():
    """qemu/guest/matrix.py as the installed package ships it (it imports collect.py beside it)."""
    path = guest_view.guest_scripts_source() / "matrix.py"
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location("rdna1_guest_matrix", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(path.parent))


GUEST = load_guest_script()
ALL = sum(1 << q.bit for q in CATALOG.values())


def report_of(cases: int = 3, off: int = 0, error: float = 1e-6) -> dict:
    return {
        "device": "cuda",
        "tolerance": {"rtol": 1e-3, "atol": 1e-3},
        "cases": [{"case": f"c{i}", "max_abs_err": 0.5 if i < off else error, "ok": i >= off} for i in range(cases)],
        "ok": off == 0,
    }


def entry(cell_id: str, rc=0, report=None, output="", load_rc=0, unload_rc=0, done=True) -> dict:
    run = {"argv": ["python3", "conv2d.py"], "rc": rc, "output": output, "report": report, "seconds": 12.5}
    return {
        "id": cell_id,
        "started": True,
        "done": done,
        "load": {"rc": load_rc, "output": "insmod: ERROR: could not " "insert module" if load_rc else ""},
        "workload": {"name": "conv2d", "runs": [run]},
        "unload": {"rc": unload_rc, "output": ""},
    }


class CannedGuest:
    """Plays the VMs: `script[cell id]` is what the guest wrote for it; a cell in `kills_vm` ends the VM
    (the guest stops there, as matrix.py does after a hang); `vm_dies_in` leaves the cell unfinished."""

    def __init__(self, script: dict, vm_dies_in: dict[str, str] | None = None):
        self.script = script
        self.vm_dies_in = vm_dies_in or {}
        self.batches: list[list[str]] = []

    def __call__(self, cells, attempt):
        self.batches.append([c.id for c in cells])
        done = []
        for cell in cells:
            if cell.id in self.vm_dies_in:
                done.append({"id": cell.id, "started": True, "done": False})
                return experiment.Batch({"cells": done, "finished": False}, self.vm_dies_in[cell.id])
            done.append(self.script.get(cell.id) or entry(cell.id, report=report_of()))
            if GUEST.leaves_gpu_suspect(done[-1]):  # the guest's own rule for ending its VM
                return experiment.Batch({"cells": done, "finished": True, "stopped_after": cell.id}, None)
        return experiment.Batch({"cells": done, "finished": True}, None)


def test_cells_are_every_mask_by_every_profile_from_the_data():
    cells = experiment.cells()
    names = list(profiles.load())
    expected_masks = [0] + [1 << q.bit for q in sorted(CATALOG.values(), key=lambda q: q.bit)]
    if len(CATALOG) > 1:
        expected_masks.append(ALL)
    assert sorted({c.mask for c in cells}) == sorted(expected_masks)
    assert len(cells) == len(expected_masks) * len(names)
    assert {c.profile.name for c in cells} == set(names)
    assert {
        "as-installed",
        "no-override",
        "find-fast",
        "conv-gemm",
        "conv-direct",
        "no-winograd",
        "no-asm",
        "deprecated-solvers",
        "override-1030",
        "small-bar",
    } <= set(names)
    direct = profiles.get("conv-direct").set
    assert direct["MIOPEN_DEBUG_CONV_GEMM"] == "0" and "MIOPEN_DEBUG_CONV_DIRECT" not in direct


def test_the_driver_classifies_every_kind_of_cell_and_starts_fresh_vms_after_hangs_and_crashes():
    cells = experiment.cells()
    gemm0, igemm0 = "0x0/conv-gemm", "0x0/conv-direct"
    stock = "0x0/as-installed"
    wrong = "0x0/no-override"
    crash = "0x0/find-fast"
    script = {
        stock: entry(stock, rc=None, output="timed out after 600 s"),  # hangs inside the guest
        wrong: entry(wrong, report=report_of(cases=4, off=2)),
        crash: entry(crash, rc=-11, output="Segmentation fault"),
        igemm0: entry(igemm0, report=report_of(error=2e-5)),
        f"0x{ALL:x}/as-installed": entry(f"0x{ALL:x}/as-installed", load_rc=1),
    }
    guest = CannedGuest(script, vm_dies_in={gemm0: "timeout"})
    results = {r.cell.id: r for r in experiment.run(cells, guest)}
    assert results[stock].outcome == "hang" and "timed out after 600 s" in results[stock].detail
    assert results[wrong].outcome == "wrong" and results[wrong].max_error == 0.5
    assert "2 of 4 cases off" in results[wrong].detail
    assert results[crash].outcome == "crash" and "Segmentation fault" in results[crash].detail
    assert results[gemm0].outcome == "hang" and "killed" in results[gemm0].detail
    assert results[f"0x{ALL:x}/as-installed"].outcome == "crash"
    assert results[igemm0].outcome == "pass" and results[igemm0].seconds == 12.5
    assert len(results) == len(cells)
    # VM 1 stopped after the in-guest hang, VM 2 after the crash (a signal), VM 3 died in the GEMM cell:
    # a fresh VM took the rest each time, and no cell ran twice.
    assert [b[0] for b in guest.batches] == [stock, wrong, gemm0, igemm0]
    assert [len(b) for b in guest.batches] == [len(cells) - n for n in (0, 1, 3, 4)]
    assert [results[c].attempt for c in (stock, wrong, crash, gemm0, igemm0)] == [1, 2, 2, 3, 4]

    best = experiment.recommend(list(results.values()))
    # Fewest quirks first, then the profile that changes least: the first mask-0 profile that passes.
    assert best.cell.id == igemm0
    lines = [line.strip() for line in experiment.recommendation_lines(best)]
    assert "sudo rdna1-kmgr install --quirks 0x0" in lines and "sudo rdna1-kmgr profile install conv-direct" in lines
    # The host experiment's table (experiment/answer.py): the same columns, the mask in the kernel column.
    table = answer.table([answer.matrix_row(r) for r in results.values()])
    assert table[0].split() == ["cell", "kernel", "result", "stopped", "at", "max", "error", "time"]
    row = next(line for line in table if line.startswith(f"{igemm0} "))
    assert row.split()[1:4] == ["quirks", "0x0", "pass"] and "2.00e-05" in row and "12.5 s" in row
    assert table[-1].startswith("counts: ") and "1 wrong, 2 hang, 2 crash" in table[-1]


def test_a_vm_that_runs_no_cell_ends_the_experiment_instead_of_looping():
    cells = experiment.cells()[:3]
    calls = []

    def never_boots(batch, attempt):
        calls.append(attempt)
        return experiment.Batch(None, "the VM ended (exit 1): qemu: could not open /dev/vfio/14")

    results = experiment.run(cells, never_boots)
    assert calls == [1] and {r.outcome for r in results} == {"not-run"}
    assert "could not open /dev/vfio/14" in results[0].detail
    assert experiment.recommend(results) is None


def test_the_record_holds_the_table_and_the_pick(tmp_path, monkeypatch):
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path))
    cells = experiment.cells()
    guest = CannedGuest({c.id: entry(c.id, report=report_of(off=1)) for c in cells if c.mask == 0})
    results = experiment.run(cells, guest)
    best = experiment.recommend(results)
    assert best.cell.mask != 0 and best.cell.profile.name == "as-installed"
    assert bin(best.cell.mask).count("1") == 1  # one quirk is smaller than all of them
    path = experiment.write_record(results, best, {"board": "0000:0a:00.0"})
    record = json.loads(path.read_text())
    assert record == experiment.read_latest()
    assert record["recommended"]["cell"] == best.cell.id and len(record["cells"]) == len(cells)
    assert record["counts"]["wrong"] == len([c for c in cells if c.mask == 0])
    assert record["commands"] == [f"  sudo rdna1-kmgr install --quirks 0x{best.cell.mask:x}"]


def _matrix_on_a_board_wrong_without_quirks(tmp_path, monkeypatch) -> BoardExperiment:
    """A recorded matrix run whose guest gets Conv2d wrong with every quirk off and right with any on."""
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path))
    cells = experiment.cells()
    guest = CannedGuest({c.id: entry(c.id, report=report_of(off=1)) for c in cells if c.mask == 0})
    results = experiment.run(cells, guest)
    best = experiment.recommend(results)
    return BoardExperiment(experiment.write_record(results, best, {"board": "0000:0a:00.0"}), tuple(results), best)


def test_the_matrix_prints_the_host_experiments_table_and_leaves_its_grid_beside_the_record(tmp_path, monkeypatch):
    from rdna1_kmgr.commands.vmtest import experiment_report

    board = _matrix_on_a_board_wrong_without_quirks(tmp_path, monkeypatch)
    path, best = board.record, board.best
    shown = experiment_report(board)
    assert shown.failure is None
    out = list(shown.text)
    assert out[0].split()[:3] == ["cell", "kernel", "result"]  # the host experiment's header
    wrong = [line for line in out if line.startswith("0x0/")]
    assert len(wrong) == len(profiles.load()) and all(line.split()[1:4] == ["quirks", "0x0", "wrong"] for line in wrong)
    page = tmp_path / "experiments" / f"{path.stem}.html"
    assert out[-1] == f"the grid, to open in a browser: {page}"
    text = page.read_text()
    # A header and a row per profile, a column per mask: the same grid as the host experiment's page.
    assert text.count("<tr><th>") == 1 + len(profiles.load()) and text.count("<th>quirks 0x") == len(
        experiment.masks(quirk_catalog.load_quirks())
    )
    assert f"sudo rdna1-kmgr install --quirks 0x{best.cell.mask:x}" in text


def test_the_matrix_json_names_the_record_its_page_every_cell_and_the_pick(tmp_path, monkeypatch):
    """`vm-test matrix --json`'s keys, as scripts read them (written from main's output before issue 41)."""
    from rdna1_kmgr.commands.vmtest import experiment_report
    from rdna1_kmgr.core import output

    board = _matrix_on_a_board_wrong_without_quirks(tmp_path, monkeypatch)
    path, best = board.record, board.best
    out = json.loads(json.dumps(output.to_json(experiment_report(board).value)))
    assert sorted(out) == ["cells", "html", "recommended", "record"]
    assert out["record"] == str(path) and out["html"] == str(tmp_path / "experiments" / f"{path.stem}.html")
    assert [c["cell"] for c in out["cells"]] == [r.cell.id for r in board.results]
    assert out["recommended"]["cell"] == best.cell.id


def test_the_matrix_is_its_subcommand_only():
    result = CliRunner().invoke(main, ["vm-test", "--matrix"])
    assert result.exit_code == 2 and "No such option '--matrix'" in result.stderr
    result = CliRunner().invoke(main, ["vm-test", "matrix", "auto", "--cell-timeout", "0"])
    assert result.exit_code == 2 and "invalid --cell-timeout 0" in result.stderr


def test_the_board_experiment_refuses_a_module_no_kernel_is_known_for(tmp_path, monkeypatch):
    """--module outside the DKMS tree and no --kernel: one error asking for --kernel, before any VM starts."""
    from rdna1_kmgr.core.errors import UsageError
    from rdna1_kmgr.modbuild.built_module import BuiltModule
    from rdna1_kmgr.vm import experiment_board, guest_kernel, passthrough

    monkeypatch.setattr(passthrough, "resolve_gpu", lambda spec: "0000:0a:00.0")
    monkeypatch.setattr(passthrough, "require_root", lambda: None)
    monkeypatch.setattr(passthrough, "preflight", lambda bdf, **kw: object())
    located = []
    monkeypatch.setattr(guest_kernel, "locate", lambda release, fetch=False: located.append(release))
    built = BuiltModule(tmp_path / "amdgpu.ko", kernel=None, package_version=None, manifest=None)
    with pytest.raises(UsageError) as refused:
        experiment_board.run("auto", built, None, "tcg", 60.0, False, False, False)
    assert str(tmp_path / "amdgpu.ko") in refused.value.what and "--kernel" in (refused.value.hint or "")
    assert located == []


# --- the cell runner in real emulated VMs --------------------------------------------------------------------

from vm_fixtures import fake_modules_61, guest_kernel_61, vm_env  # noqa: E402,F401  (session fixtures)


def guest_sees(python: str) -> tuple[Path, ...]:
    """virtme-ng's guest has its own /var (tmpfs): the test torch venv under /var/cache is shown to it, read-only,
    at the same path (as vm-test maps the guest kernel's folder)."""
    return (Path(python).parent.parent,)


def cpu_workload(python: str) -> dict:
    """CPU against CPU; `python` has torch and lives where the guest sees the host's files as they are."""
    return {"device": "cpu", "args": ["--sweep", "smoke"], "pythons": [python]}


@pytest.fixture
def guest_python(vm_env, monkeypatch, torch_python) -> str:
    """A Python with torch for the guest (the guest sees the host's files); this process's state, logs, cache and
    temporary folder are the run's own, as vm_env makes them for the CLI (the experiment runs in-process here)."""
    python = torch_python
    for key in ("RDNA1_KMGR_STATE", "RDNA1_KMGR_LOG", "RDNA1_KMGR_CACHE", "TMPDIR"):
        monkeypatch.setenv(key, vm_env[key])
    return python


@pytest.mark.vm
def test_cells_run_in_an_emulated_vm_with_the_module_loaded_at_each_mask(
    fake_modules_61, guest_kernel_61, guest_python
):
    cells = [c for c in experiment.cells() if (c.mask, c.profile.name) in ((0, "as-installed"), (ALL, "conv-direct"))]
    run_batch = experiment_guest.batch_runner(
        guest_kernel_61,
        fake_modules_61["good"],
        cpu_workload(guest_python),
        cell_timeout=900,
        accel="tcg",
        base_env={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"},
        show=guest_sees(guest_python),
    )
    seen = []

    def recording(batch, attempt):
        outcome = run_batch(batch, attempt)
        seen.append(outcome)
        return outcome

    results = experiment.run(cells, recording)
    assert [r.outcome for r in results] == ["pass", "pass"], [r.detail for r in results]
    assert all(r.max_error == 0.0 and r.seconds > 0 for r in results)
    entries = {e["id"]: e for e in seen[0].result["cells"]}
    assert len(seen) == 1
    for cell in cells:
        loaded = entries[cell.id]["load"]
        assert loaded["rc"] == 0 and loaded["state"]["parameters"]["rdna1_quirks"] == str(cell.mask)
        assert entries[cell.id]["unload"]["rc"] == 0
        report = entries[cell.id]["workload"]["runs"][-1]["report"]
        assert report["sweep"] == "smoke" and len(report["cases"]) == 6


@pytest.mark.vm
def test_a_cell_over_its_limit_is_a_hang_and_the_next_cell_gets_a_fresh_vm(
    fake_modules_61, guest_kernel_61, guest_python
):
    cells = [c for c in experiment.cells() if c.mask == 0][:2]
    # One second is not even enough to import torch under TCG: the guest kills the workload, calls it a
    # hang and stops; the host boots a fresh VM for the second cell.
    run_batch = experiment_guest.batch_runner(
        guest_kernel_61,
        fake_modules_61["good"],
        cpu_workload(guest_python),
        cell_timeout=1,
        accel="tcg",
        show=guest_sees(guest_python),
    )
    results = experiment.run(cells, run_batch)
    assert [r.outcome for r in results] == ["hang", "hang"]
    assert [r.attempt for r in results] == [1, 2]
    assert "timed out after 1" in results[0].detail
