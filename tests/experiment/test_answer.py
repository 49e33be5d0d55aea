"""The experiment's answer never recommends a control: no-svm (HSA_USE_SVM=0) passing with the cwsr-size build
is the evidence that the bit fixes the BO case, not a change the owner should make; the same for the host
cells, the kernel cells and the VFIO matrix."""

from kernel_plans import kernel_plan

from rdna1_kmgr.experiment import answer, kernel_cells
from rdna1_kmgr.experiment.cell_run import HostResult
from rdna1_kmgr.experiment.host_cells import HostCell
from rdna1_kmgr.userspace import profiles
from rdna1_kmgr.vm import cell_outcomes
from rdna1_kmgr.vm import experiment as matrix

MIOPEN = cell_outcomes.BACKENDS["miopen"]


def test_no_svm_is_a_control_that_sets_exactly_0():
    no_svm = profiles.get("no-svm")
    # libhsakmt turns SVM off only for the exact string "0" (openclose.c: !strcmp(HSA_USE_SVM, "0"))
    assert no_svm.set == {"HSA_USE_SVM": "0"} and "BO-backed CWSR failure" in no_svm.experiment_only
    assert no_svm.apply({"HSA_USE_SVM": "1", "HSA_OVERRIDE_GFX_VERSION": "10.3.0"}) == {"HSA_USE_SVM": "0"}


def host(profile: str, outcome: str) -> HostResult:
    return HostResult(HostCell(profiles.get(profile), MIOPEN), outcome, "", None, None, None, 1.0)


def test_the_host_answer_never_picks_no_svm():
    only_control = [host("as-installed", "queue-failed"), host("no-svm", "pass")]
    assert answer.recommend(only_control) is None
    lines = answer.recommendation(None, only_control)
    assert lines[0].startswith("no user-space cell passed") and "no-svm/miopen" in lines[-1]
    with_profile = only_control + [host("find-fast", "pass")]
    assert answer.recommend(with_profile).cell.id == "find-fast/miopen"


def row(cell: str, kernel: str, outcome: str) -> answer.Row:
    profile, backend = cell.split("/")
    return answer.Row(cell, kernel, profile, backend, outcome, "-", None, None, "")


def test_the_kernel_answer_never_picks_a_no_svm_row(tmp_path):
    # "stock + no-svm fails, cwsr-size + no-svm passes": the rows say it, the answer installs neither
    off = kernel_cells.KernelCell("quirks-off", "amdgpu.rdna1_quirks=0", "the build with every quirk off")
    cwsr = kernel_cells.KernelCell("quirks+cwsr", "amdgpu.rdna1_quirks=16", "the build with cwsr-size")
    plan = kernel_plan(tmp_path / "kernel-x", [off, cwsr], ("no-svm/miopen", "as-installed/miopen"))
    rows = [row("no-svm/miopen", "quirks-off", "queue-failed"), row("no-svm/miopen", "quirks+cwsr", "pass")]
    assert answer.best_kernel_row(plan, rows) is None
    said = answer.kernel_recommendation(plan, rows, "")
    assert not any("profile install no-svm" in line for line in said)
    rows.append(row("as-installed/miopen", "quirks+cwsr", "pass"))
    best = answer.best_kernel_row(plan, rows)
    assert (best.cell, best.kernel) == ("as-installed/miopen", "quirks+cwsr")


def test_the_vfio_matrix_answer_never_picks_no_svm():
    cells = {name: matrix.Cell(0x10, ("cwsr-size",), profiles.get(name)) for name in ("no-svm", "as-installed")}
    results = [matrix.CellResult(cells["no-svm"], "pass", ""), matrix.CellResult(cells["as-installed"], "hang", "")]
    assert matrix.recommend(results) is None
