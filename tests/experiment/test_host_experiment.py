"""`rdna1-kmgr experiment` on the host, for real: a real PyTorch (the CPU build) runs the real workload
(qemu/guest/conv2d.py --sweep experiment-quick) in a fresh process per cell, and a stand-in device
(standin/sitecustomize.py on the cell's PYTHONPATH) makes each scripted cell pass, compute wrong numbers,
raise or abort with each error class, hang (with a child process), compile for longer than the case limit
while MIOpen's cache grows, or leave ring-timeout / failed-reset lines in a fake kernel log (the fixture
sysroot's dev/kmsg). Every expectation below comes from the script, not from the code under test.

The torch: RDNA1_KMGR_TORCH_PYTHON, else a venv made once in the persistent test cache."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from sysfs_fixtures import FakeSysroot, no_gpu, rx5600xt

from rdna1_kmgr.cli import main
from rdna1_kmgr.experiment import cell_run

# real dkms, apt/dpkg, a CPU PyTorch or killed process trees on fixtures: seconds each, out of the fast tier
pytestmark = pytest.mark.system

STANDIN = Path(__file__).parent / "standin"
CASE_LIMIT = 6  # seconds without progress; the stand-in's compilation takes 15 s, its hang forever

RING = "ring comp_1.0.0 timeout"
SCRIPT = {  # --backend miopen, every profile: one cell each
    "as-installed/miopen": {"do": "wrong", "at": "conv2d k=3"},
    "no-override/miopen": {"do": "raise", "at": "smoke", "message": "HIP error: invalid device function"},
    "find-fast/miopen": {"do": "raise", "at": "smoke", "message": "HIP error: device kernel image is invalid"},
    "conv-gemm/miopen": {
        "do": "abort",
        "at": "smoke",
        "message": "hip runtime: HSA_STATUS_ERROR_OUT_OF_RESOURCES: "
        "The runtime failed to allocate the necessary resources.",
    },
    # the kernel's page fault (gmc_v10_0_process_interrupt, Debian's 6.12), then HIP's generic launch failure: the
    # kernel log alone names it a memory fault
    "conv-direct/miopen": {
        "do": "abort",
        "at": "conv2d k=5",
        "kmsg": [
            "[gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32770)",
            " in process python3 pid 2512 thread python3 pid 2512",
            "  in page starting at address 0x00007f0000000000 from client 0x1b (UTCL2)",
        ],
        "message": "HIP error: unspecified launch failure",
    },
    "no-winograd/miopen": {"do": "hang", "at": "conv2d k=7"},
    "no-asm/miopen": {"do": "ring", "at": "conv2d k=1"},
    "deprecated-solvers/miopen": {"do": "compile", "at": "conv2d k=1", "steps": 30},
    "no-buffer-ops/miopen": {"do": "pass"},
    "override-1030/miopen": {"do": "pass"},
    "small-bar/miopen": {
        "do": "raise",
        "at": "conv2d depthwise",
        "message": "miopenStatusUnknownError: No suitable algorithm was found to execute the " "required convolution",
    },
    # the control: a BO-backed CWSR area that KFD's exact check refuses (the stock amdgpu on a 6.12+ kernel)
    "no-svm/miopen": {
        "do": "abort",
        "at": "smoke",
        "message": "hip runtime: HSA_STATUS_ERROR_OUT_OF_RESOURCES: "
        "The runtime failed to allocate the necessary resources.",
    },
}
EXPECTED = {
    "as-installed/miopen": ("wrong", "conv2d"),
    "no-override/miopen": ("invalid-device-function", "smoke"),
    "find-fast/miopen": ("kernel-image-invalid", "smoke"),
    "conv-gemm/miopen": ("queue-failed", "smoke"),
    "conv-direct/miopen": ("memory-fault", "conv2d"),
    "no-winograd/miopen": ("hang", "conv2d"),
    "no-asm/miopen": ("ring-timeout", None),
    "deprecated-solvers/miopen": ("pass", None),
    "no-buffer-ops/miopen": ("pass", None),
    "override-1030/miopen": ("pass", None),
    "small-bar/miopen": ("not-applicable", "variants"),
    "no-svm/miopen": ("queue-failed", "smoke"),
}


@pytest.fixture
def bench(tmp_path, monkeypatch):
    """A fixture desktop with the board, its kernel log a plain file, the state in tmp, the stand-in on the path."""
    tree = rx5600xt(tmp_path / "sysroot").kmsg("amdgpu 0000:0a:00.0: amdgpu: SMU is initialized successfully!")
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("RDNA1_KMGR_LOG", str(tmp_path / "log"))
    monkeypatch.setenv("RDNA1_KMGR_ROOT", str((tmp_path / "root").resolve()))
    (tmp_path / "root").mkdir()
    # A copy of the stand-in with its script beside it (standin.json): the cells get the owner's stack of this
    # process's environment (PYTHONPATH), not a test's own variables (core/program_env.py)
    shutil.copytree(STANDIN, tmp_path / "standin")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "standin"))
    (tmp_path / "scratch").mkdir()
    monkeypatch.setattr(cell_run, "SCRATCH", tmp_path / "scratch")  # the owner's cell folders

    def script(cells: dict) -> Path:
        path = tmp_path / "standin.json"
        path.write_text(
            json.dumps({"kmsg": str(tree.root / "dev/kmsg"), "log": str(tmp_path / "standin.log"), "cells": cells})
        )
        return path

    def seen() -> list[dict]:
        log = tmp_path / "standin.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return {"sysroot": str(tree.root), "script": script, "seen": seen, "tmp": tmp_path}


def experiment(bench, python, *args):
    return CliRunner().invoke(
        main,
        [
            "experiment",
            "--python",
            python,
            "--sysroot",
            bench["sysroot"],
            "--quick",
            "--case-timeout",
            str(CASE_LIMIT),
            "--cell-timeout",
            "300",
            *args,
        ],
    )


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_every_outcome_class_from_the_scripted_cells(bench, torch_python):
    bench["script"](SCRIPT)
    result = experiment(bench, torch_python, "--backend", "miopen", "--json")
    assert result.exit_code == 0, result.output
    assert "the screen may freeze" in result.stderr
    record = json.loads(result.stdout)
    cells = {c["cell"]: c for c in record["cells"]}
    assert list(cells) == list(SCRIPT)  # every profile, the file's order
    for cell, (outcome, stage) in EXPECTED.items():
        assert (cells[cell]["outcome"], cells[cell]["stage"]) == (outcome, stage), cells[cell]
    assert cells["as-installed/miopen"]["case"].startswith("conv2d k=3")
    assert cells["conv-direct/miopen"]["case"].startswith("conv2d k=5")
    assert cells["small-bar/miopen"]["case"].startswith("conv2d depthwise")
    assert "No suitable algorithm" in cells["small-bar/miopen"]["detail"]
    # the kernel log names the fault, where HIP's own text ("unspecified launch failure") names nothing
    assert "kernel log during the cell: " in cells["conv-direct/miopen"]["detail"]
    assert "[gfxhub] page fault" in cells["conv-direct/miopen"]["detail"]
    assert RING in cells["no-asm/miopen"]["kernel_log"][0]
    # The hang: killed after the case limit with the child it started (its whole process group).
    hang = cells["no-winograd/miopen"]
    assert hang["case"].startswith("conv2d k=7") and f"{CASE_LIMIT} s without progress" in hang["detail"]
    assert hang["seconds"] < 60 and hang["heartbeats"] >= CASE_LIMIT - 1
    children = [e["child"] for e in bench["seen"]() if e.get("event") == "hang"]
    assert len(children) == 1 and not alive(children[0])
    # The compilation: 15 s with no new case, over twice the limit, but MIOpen's cache grew: no hang.
    slow = cells["deprecated-solvers/miopen"]
    assert slow["seconds"] > 2 * CASE_LIMIT and slow["heartbeats"] >= 2 * CASE_LIMIT
    # Versions per cell, from the workload.
    assert slow["versions"]["hip"] == "7.1.52802-standin" and slow["versions"]["miopen"] == 3005000
    assert slow["versions"]["torch"].startswith("2.13.0")
    # The answer: the control override-1030 passed too, but the smallest installable change is the profile.
    assert record["recommended"]["cell"] == "deprecated-solvers/miopen"
    assert any("override-1030/miopen" in line for line in record["answer"])
    assert record["counts"]["pass"] == 3 and record["counts"]["hang"] == 1


def test_each_cell_has_its_own_miopen_caches_and_its_profile(bench, torch_python):
    bench["script"]({})
    result = experiment(
        bench,
        torch_python,
        "--backend",
        "miopen",
        "--profile",
        "as-installed",
        "--profile",
        "conv-gemm",
        "--profile",
        "deprecated-solvers",
    )
    assert result.exit_code == 0, result.output
    starts = {e["cell"]: e for e in bench["seen"]() if e.get("event") == "start"}
    assert set(starts) == {"as-installed/miopen", "conv-gemm/miopen", "deprecated-solvers/miopen"}
    folders = {Path(e["db"]).parent for e in starts.values()} | {Path(e["cache"]).parent for e in starts.values()}
    assert len(folders) == 3  # one folder per cell holds both caches
    # The caches are the owner's, each cell's in a folder of its own outside root's state (the record's is root's).
    scratch = bench["tmp"] / "scratch"
    for cell, start in starts.items():
        assert start["db_before"] == [] and start["cache_before"] == []  # nothing leaked in from another cell
        assert Path(start["db"]).parent.parent == scratch
        assert os.listdir(start["db"]) == [f"gfx1010_18.{cell.replace('/', '--')}.udb.txt"]
    assert starts["conv-gemm/miopen"]["env"]["MIOPEN_DEBUG_CONV_WINOGRAD"] == "0"
    assert "MIOPEN_DEBUG_CONV_DIRECT" not in starts["conv-gemm/miopen"]["env"]
    assert starts["deprecated-solvers/miopen"]["env"]["MIOPEN_DEBUG_ENABLE_DEPRECATED_SOLVERS"] == "1"
    assert "table:" in result.stdout and "smallest change" not in result.stdout
    assert "nothing to change: as-installed/miopen passes" in result.stdout


def test_backends_reach_the_workload_and_apply_installs_the_answer(bench, torch_python, tmp_path):
    bench["script"](
        {
            "as-installed/miopen": {"do": "wrong", "at": "smoke"},
            "no-override/miopen": {"do": "wrong", "at": "smoke"},
            "no-override/miopen-benchmark": {"do": "pass"},
            "as-installed/miopen-benchmark": {
                "do": "raise",
                "at": "smoke",
                "message": "HIP error: invalid device function",
            },
            "as-installed/no-miopen": {"do": "pass"},
            "no-override/no-miopen": {"do": "pass"},
        }
    )
    result = experiment(bench, torch_python, "--profile", "as-installed", "--profile", "no-override")
    assert result.exit_code == 0, result.output
    starts = {e["cell"]: (e["cudnn"], e["benchmark"]) for e in bench["seen"]() if e.get("event") == "start"}
    assert starts["as-installed/miopen"] == (True, False) and starts["no-override/miopen-benchmark"] == (True, True)
    assert starts["no-override/no-miopen"] == (False, False)
    # One change each (a line of code, or a profile); the profile file's order breaks the tie.
    assert "smallest change that passes: as-installed/no-miopen" in result.stdout
    assert "torch.backends.cudnn.enabled = False" in result.stdout
    page = Path(json.loads((bench["tmp"] / "state/experiments/host-latest.json").read_text())["html"]).read_text()
    assert (
        page.count("<tr><th>") == 1 + 2 and "#4caf50" in page and "invalid-device-function" in page
    )  # header, 2 profiles

    dry = CliRunner().invoke(main, ["experiment", "apply", "--cell", "no-override/miopen-benchmark", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "install the user-space profile no-override" in dry.stdout and "benchmark = True" in dry.stdout
    root = Path(os.environ["RDNA1_KMGR_ROOT"])
    assert not (root / "etc").exists()  # the dry run changed nothing
    done = CliRunner().invoke(main, ["experiment", "apply", "--cell", "no-override/miopen-benchmark"])
    assert done.exit_code == 0, done.output
    assert "unset HSA_OVERRIDE_GFX_VERSION" in (root / "etc/profile.d/rdna1-kmgr.sh").read_text()
    assert (bench["tmp"] / "state/journal/profile/journal.jsonl").is_file()
    refused = CliRunner().invoke(main, ["experiment", "apply", "--cell", "as-installed/miopen"])
    assert refused.exit_code == 2 and "did not pass" in refused.stderr


def test_a_failed_gpu_reset_stops_the_experiment_and_says_what_to_do(bench, torch_python):
    bench["script"]({"as-installed/miopen": {"do": "reset-failed", "at": "smoke"}})
    result = experiment(
        bench,
        torch_python,
        "--backend",
        "miopen",
        "--profile",
        "as-installed",
        "--profile",
        "no-override",
        "--case-timeout",
        "120",
    )
    assert result.exit_code == 9, result.output  # README: 9 lost GPU
    assert "did not come back" in result.stderr and "power it off" in result.stderr
    record = json.loads((bench["tmp"] / "state/experiments/host-latest.json").read_text())
    assert [c["cell"] for c in record["cells"]] == ["as-installed/miopen"]  # the next cell never ran
    cell = record["cells"][0]
    assert cell["outcome"] == "gpu-reset" and cell["reset_failed"] and "GPU reset(1) failed" in cell["detail"]
    assert cell["seconds"] < 60  # stopped when the log said so, not at the case limit


def test_a_torch_that_sees_no_gpu_stops_after_one_cell_with_the_reason_everywhere(bench, torch_python):
    bench["script"]({cell: {"do": "no-gpu"} for cell in ("as-installed/miopen", "no-override/miopen")})
    args = ("--backend", "miopen", "--profile", "as-installed", "--profile", "no-override")
    result = experiment(bench, torch_python, *args)
    assert result.exit_code == 4, result.output
    record = json.loads((bench["tmp"] / "state/experiments/host-latest.json").read_text())
    assert [c["cell"] for c in record["cells"]] == ["as-installed/miopen"]  # stopped at the first cell
    assert record["cells"][0]["outcome"] == "not-run" and "sees no GPU" in record["cells"][0]["detail"]
    for said in (record["dead_end"], " ".join(record["answer"]), result.stdout):
        assert "sees no GPU" in said and "rdna1-kmgr doctor" in said and "/dev/kfd" in said
    assert "kernel axis (quirk masks" not in result.stdout and "experiment kernel" not in result.stdout
    page = Path(record["html"]).read_text()
    assert "sees no GPU" in page and "rdna1-kmgr doctor" in page
    applied = CliRunner().invoke(main, ["experiment", "apply", "--dry-run"])
    assert applied.exit_code == 2 and "sees no GPU" in applied.stderr and "doctor" in applied.stderr


def test_a_refused_control_stack_is_named_as_such_and_stops_the_experiment(bench, torch_python):
    """Issue 48: on a kernel that checks the control stack and does not print it (6.17 here), a post-#6125 ROCm's
    first kernel launch fails; PyTorch often just dies. The cell says it is KFD refusing the queue, with the
    sizes, and points at doctor, instead of calling it a crash."""
    tree = FakeSysroot(Path(bench["sysroot"]))
    tree.kernel("6.17.0-14-generic")
    # the RX 5600 XT's node: 36 CUs (72 SIMDs, 2 a CU, 20 waves a SIMD), no cwsr_size / ctl_stack_size lines
    tree.kfd_node(1, 100100, 72, 128, (1,), simd_per_cu=2, max_waves_per_simd=20)
    bench["script"](
        {
            cell: {"do": "abort", "at": "smoke", "message": "Segmentation fault"}
            for cell in ("as-installed/miopen", "no-override/miopen")
        }
    )
    args = ("--backend", "miopen", "--profile", "as-installed", "--profile", "no-override")
    result = experiment(bench, torch_python, *args)
    record = json.loads((bench["tmp"] / "state/experiments/host-latest.json").read_text())
    assert [c["cell"] for c in record["cells"]] == ["as-installed/miopen"], result.output
    cell = record["cells"][0]
    assert cell["outcome"] == "queue-failed"
    # KFD's 0x4000 against 0x5000 (ALIGN(40 + 12 * 32 * 36 + 8, 4096) and the same for 40 waves a CU, by hand)
    assert "KFD checks 0x4000, ROCm after rocm-systems #6125 sends 0x5000" in cell["detail"]
    assert "rdna1-kmgr doctor" in record["dead_end"] and "control-stack" in record["dead_end"]


# These cells do not test the hang limit: a loaded machine takes over CASE_LIMIT for the batchnorm step's first
# optimizer call (torch._dynamo's imports: 6-8 s measured at a load of 12 on 2 cores).
UNHURRIED = ("--case-timeout", "120")


def triton_stage(record: dict) -> list[dict]:
    """The workload's own cases of its triton stage, from the cell's output.log (its last JSON line)."""
    output = Path(record["cells"][0]["folder"]) / "output.log"
    report = json.loads([line for line in output.read_text().splitlines() if line.startswith("{")][-1])
    return [c for c in report["cases"] if c["stage"] == "triton"]


def test_without_triton_the_triton_stage_is_skipped_with_its_reason(bench, torch_python):
    bench["script"]({})  # the CPU build of torch: no Triton, as `pip install torch` from PyPI's CPU index
    result = experiment(bench, torch_python, "--cells", "as-installed/miopen", *UNHURRIED, "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    cell = record["cells"][0]
    assert cell["outcome"] == "pass" and "skipped: triton (no Triton: import triton failed" in cell["detail"]
    [case] = triton_stage(record)
    assert case["outcome"] == "skipped" and case["ok"] and "No module named 'triton'" in case["why"]


def test_a_compiled_result_that_differs_from_the_cpu_is_wrong_at_the_triton_stage(bench, torch_python):
    bench["script"]({"as-installed/miopen": {"do": "wrong", "at": "triton", "triton": True}})
    result = experiment(bench, torch_python, "--cells", "as-installed/miopen", *UNHURRIED, "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    wrong = record["cells"][0]
    assert (wrong["outcome"], wrong["stage"], wrong["case"]) == ("wrong", "triton", "triton conv2d relu")
    cases = triton_stage(record)
    assert [c["case"] for c in cases] == ["triton conv2d relu", "triton matmul gelu softmax"]
    assert not any(c["ok"] for c in cases) and all(c["max_abs_err"] >= 1.0 for c in cases)
    assert record["recommended"] is None  # a wrong compiled result is no pass


def test_int8_without_hipblaslt_is_not_applicable_and_the_cell_passes(bench, torch_python):
    # PyTorch's words when hipBLASLt has no kernel for the board (its int8_gemm is a cublasLt call under HIP).
    message = "CUDA error: HIPBLAS_STATUS_NOT_SUPPORTED when calling `cublasLtMatmul( ltHandle, computeDesc...)`"
    bench["script"]({"as-installed/miopen": {"do": "raise", "at": "int8", "message": message}})
    result = experiment(bench, torch_python, "--cells", "as-installed/miopen", *UNHURRIED, "--json")
    assert result.exit_code == 0, result.output
    cell = json.loads(result.stdout)["cells"][0]
    assert cell["outcome"] == "pass", cell
    assert "not-applicable: int8 matmul (int8 matrix products need hipBLASLt" in cell["detail"]


def test_the_buffer_ops_profile_reaches_the_workload(bench, torch_python):
    bench["script"]({"no-buffer-ops/miopen": {"do": "pass", "triton": True}})
    result = experiment(bench, torch_python, "--cells", "no-buffer-ops/miopen", *UNHURRIED, "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["cells"][0]["outcome"] == "pass" and "skipped" not in record["cells"][0]["detail"]
    starts = [e for e in bench["seen"]() if e.get("event") == "start"]
    assert starts[0]["env"]["AMDGCN_USE_BUFFER_OPS"] == "0"
    assert [c["ok"] for c in triton_stage(record)] == [True, True]


@pytest.mark.parametrize(
    "args, says",
    [
        (["--profile", "no-such"], "unknown profile 'no-such'"),
        (["--cells", "nothing/*"], "--cells 'nothing/*' matches no cell"),
        (["--python", "/nonexistent/python"], "is not a file"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(bench, args, says):
    result = CliRunner().invoke(main, ["experiment", "--sysroot", bench["sysroot"], "--python", sys.executable, *args])
    assert result.exit_code == 2 and says in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (bench["tmp"] / "state").exists()


def test_a_python_without_a_gpu_torch_is_refused(bench, torch_python, monkeypatch):
    result = CliRunner().invoke(main, ["experiment", "--sysroot", bench["sysroot"], "--python", sys.executable])
    assert result.exit_code == 2 and "is not a Python with torch" in result.stderr
    monkeypatch.delenv("STANDIN_SCRIPT", raising=False)  # the plain CPU build, no stand-in
    result = CliRunner().invoke(main, ["experiment", "--sysroot", bench["sysroot"], "--python", torch_python])
    assert result.exit_code == 2 and "a CPU-only build (no HIP): it cannot use the board" in result.stderr
    assert not (bench["tmp"] / "state").exists()


def test_no_board_says_so_and_runs_nothing(tmp_path, monkeypatch, torch_python):
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path / "state"))
    tree = no_gpu(tmp_path / "sysroot")
    result = CliRunner().invoke(main, ["experiment", "--sysroot", str(tree.root)])
    assert result.exit_code == 4 and "no RDNA1 board in this machine" in result.stderr
    assert "nothing was run and nothing changed" in result.stderr
    # The check: with the owner's venv (a torch, here the CPU build) the answer is still "no board".
    monkeypatch.delenv("STANDIN_SCRIPT", raising=False)
    result = CliRunner().invoke(main, ["experiment", "--sysroot", str(tree.root), "--python", torch_python])
    assert result.exit_code == 4 and "no RDNA1 board in this machine" in result.stderr
    # Bad input is said before the machine is looked at: a --python that is no Python with torch.
    result = CliRunner().invoke(main, ["experiment", "--sysroot", str(tree.root), "--python", "/bin/true"])
    assert result.exit_code == 2 and "'/bin/true' is not a Python with torch" in result.stderr
    assert not (tmp_path / "state").exists()
