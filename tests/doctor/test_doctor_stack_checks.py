"""doctor's checks of the 2026 stack around PyTorch: the CWSR queue failure on kernels that check the size,
mixed /opt/rocm stacks and MIOpen settings read from wherever an environment is set, PCIe atomics and
compute hangs from the kernel log; and a root with nothing on it stays a clean report."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from doctor_checks import board_root, by_check, queue_root, run
from sysfs_fixtures import no_gpu
from therock_fixtures import therock_venv

CLI = str(Path(sys.executable).parent / "rdna1-kmgr")
TOPOLOGY = "sys/class/kfd/kfd/topology/nodes"


# --- the queue failure (rocm-systems #6125 x KFD's CWSR size check) ----------------------------------------


def test_612_stock_amdgpu_and_a_rocm_after_6125_is_the_queue_problem(tmp_path):
    queue = by_check(run(queue_root(tmp_path)), "queue")
    assert [f["level"] for f in queue] == ["problem"]
    assert "6.12.95+deb12-amd64: by its version" in queue[0]["seen"] and "the stock amdgpu" in queue[0]["seen"]
    assert "rocm-sdk-core in " in queue[0]["seen"] and "7.13.0a20260601" in queue[0]["seen"]
    assert "HSA_STATUS_ERROR_OUT_OF_RESOURCES" in queue[0]["why"]
    todo = queue[0]["todo"]
    assert todo.index("1. install rdna1-kmgr's build") < todo.index("2. or boot") < todo.index("3. or use a ROCm")


def test_a_build_without_the_cwsr_bit_is_the_same_problem_and_with_it_ok(tmp_path):
    without = by_check(run(queue_root(tmp_path / "a", mask=0x2)), "queue")[0]
    assert without["level"] == "problem" and "without cwsr-size (rdna1_quirks=0x2)" in without["seen"]
    with_bit = by_check(run(queue_root(tmp_path / "b", mask=0x10)), "queue")[0]
    assert with_bit["level"] == "ok" and "has cwsr-size" in with_bit["seen"]


@pytest.mark.parametrize(
    "kernel,rocm,level,words",
    [
        ("6.1.0-56-amd64", "7.13.0a20260601", "ok", "does not check"),  # no validation before 6.12
        ("6.8.0-49-generic", "7.13.0a20260601", "ok", "does not check"),  # Ubuntu 24.04's GA kernel
        ("6.12.95+deb12-amd64", "7.13.0a20260401", "ok", "from before rocm-systems #6125"),  # an April nightly
        ("6.12.95+deb12-amd64", "7.13.0a20260514", "warn", "cannot be told"),  # the merge day itself
        ("5.14.0-570.12.1.el9_6.x86_64", "7.13.0a20260601", "problem", "RHEL 9 backported"),
    ],
)
def test_queue_forms(tmp_path, kernel, rocm, level, words):
    queue = by_check(run(queue_root(tmp_path, kernel=kernel, rocm=rocm)), "queue")[0]
    assert queue["level"] == level and words in queue["seen"], queue


def test_an_opt_rocm_whose_version_does_not_say_is_a_warning(tmp_path):
    # ROCm 7.2.x was released before rocm-systems #6125 merged (7.2.1 shipped by 2026-04-04): before (issue 48)
    tree = queue_root(tmp_path, rocm=None).file("opt/rocm-7.2.0/.info/version", "7.2.0-43\n")
    queue = by_check(run(tree), "queue")[0]
    assert queue["level"] == "ok" and "before rocm-systems #6125 (/opt/rocm-7.2.0 7.2.0-43)" in queue["seen"]
    # no 8.x or 9.x release is known: cannot be told
    nine = queue_root(tmp_path / "nine", rocm=None).file("opt/rocm-9.1.0/.info/version", "9.1.0-12\n")
    queue = by_check(run(nine), "queue")[0]
    assert queue["level"] == "warn" and "/opt/rocm-9.1.0 9.1.0-12" in queue["seen"]
    ten = queue_root(tmp_path / "ten", rocm=None).file("opt/rocm-10.0.0/.info/version", "10.0.0\n")
    assert by_check(run(ten), "queue")[0]["level"] == "problem"


def test_the_loaded_amdgpus_symbols_decide_over_the_version(tmp_path):
    tree = queue_root(tmp_path, kernel="6.1.0-56-amd64")
    tree.file(
        "proc/kallsyms",
        "ffffffffc0a00000 t kfd_queue_acquire_buffers\t[amdgpu]\n" "ffffffffc0a01000 t amdgpu_device_init\t[amdgpu]\n",
    )
    queue = by_check(run(tree), "queue")[0]
    assert queue["level"] == "problem" and "has kfd_queue_acquire_buffers (/proc/kallsyms)" in queue["seen"]


# --- mixed stacks ---------------------------------------------------------------------------------------------


def test_ld_library_path_to_opt_rocm_under_therock_torch_is_reported_with_its_file(tmp_path):
    tree = queue_root(tmp_path).file(
        "etc/profile.d/rocm.sh",
        "export LD_LIBRARY_PATH=/opt/rocm-5.2.0/lib:$LD_LIBRARY_PATH\n" "export ROCM_PATH=/opt/rocm\n",
    )
    mixed = by_check(run(tree), "mixed-stacks")
    assert [f["level"] for f in mixed] == ["problem", "warn"]
    assert "LD_LIBRARY_PATH=/opt/rocm-5.2.0/lib:$LD_LIBRARY_PATH in /etc/profile.d/rocm.sh:1" in mixed[0]["seen"]
    assert "_rocm_sdk_libraries/lib" in mixed[0]["seen"] and "RUNPATH" in mixed[0]["why"]
    assert "remove /opt/rocm-5.2.0/lib from LD_LIBRARY_PATH in /etc/profile.d/rocm.sh:1" in mixed[0]["todo"]
    assert "ROCM_PATH=/opt/rocm in /etc/profile.d/rocm.sh:2" in mixed[1]["seen"]


def test_no_rocm_paths_is_ok_and_without_an_own_rocm_it_is_a_note(tmp_path):
    assert [f["level"] for f in by_check(run(queue_root(tmp_path)), "mixed-stacks")] == ["ok"]
    tree = board_root(tmp_path / "plain").file("home/owner/.bashrc", "export LD_LIBRARY_PATH=/opt/rocm/lib\n")
    assert [f["level"] for f in by_check(run(tree), "mixed-stacks")] == ["info"]


# --- MIOpen settings ------------------------------------------------------------------------------------------


def test_miopen_direct_off_is_a_problem_reported_with_its_file(tmp_path):
    tree = board_root(tmp_path).file("etc/profile.d/miopen.sh", "export MIOPEN_DEBUG_CONV_DIRECT=0\n")
    settings = by_check(run(tree), "miopen-settings")
    assert [f["level"] for f in settings] == ["problem"]
    assert "MIOPEN_DEBUG_CONV_DIRECT=0 in /etc/profile.d/miopen.sh:1" in settings[0]["seen"]
    assert "No suitable algorithm" in settings[0]["why"]


def test_miopen_family_at_1_does_nothing_and_implicit_gemm_is_gated_on_gfx1010(tmp_path):
    tree = board_root(tmp_path).file(
        "etc/environment", "MIOPEN_DEBUG_CONV_IMPLICIT_GEMM=1\nMIOPEN_DEBUG_CONV_GEMM=0\n" "MIOPEN_FIND_MODE=FAST\n"
    )
    settings = {f["seen"].split("=")[0]: f for f in by_check(run(tree), "miopen-settings")}
    gated = settings["MIOPEN_DEBUG_CONV_IMPLICIT_GEMM"]
    assert gated["level"] == "warn" and gated["seen"].endswith("does nothing")
    assert "gfx103x" in gated["why"] and "HSA_OVERRIDE_GFX_VERSION=10.3.0" in gated["why"]
    assert settings["MIOPEN_DEBUG_CONV_GEMM"]["level"] == "info"
    assert settings["MIOPEN_FIND_MODE"]["level"] == "info"


def test_miopen_unset_is_ok_and_a_value_miopen_refuses_is_a_problem(tmp_path):
    assert [f["level"] for f in by_check(run(board_root(tmp_path)), "miopen-settings")] == ["ok"]
    tree = board_root(tmp_path / "bad").file("home/owner/.profile", "export MIOPEN_DEBUG_CONV_FFT=maybe\n")
    bad = by_check(run(tree), "miopen-settings")[0]
    assert bad["level"] == "problem" and "Invalid value" in bad["why"]


def test_deprecated_solvers_restore_opencl_direct_not_implicit_gemm_on_gfx1010(tmp_path):
    """MIOpen (rocm-libraries): ConvOclDirectFwd is gated by ThisSolverIsDeprecatedStatic; the implicit-GEMM
    solvers also by IsComposableKernelSupportedHardware, whose list has gfx103x and no gfx101x."""
    tree = board_root(tmp_path).file("etc/environment", "MIOPEN_DEBUG_ENABLE_DEPRECATED_SOLVERS=1\n")
    finding = by_check(run(tree), "miopen-settings")[0]
    assert finding["level"] == "info" and "OpenCL direct solvers" in finding["why"]
    assert "implicit GEMM stays off" in finding["why"]


@pytest.mark.parametrize(
    "value,level",
    # MIOpen's find_controls.cpp (ROCm/rocm-libraries, projects/miopen): the six names, upper-cased, and the
    # numbers 1..7 of miopen.h's miopenConvolutionFindMode_t; DEFAULT is not parsed.
    [("TRUST_VERIFY", "info"), ("trust_verify_full", "info"), ("7", "info"), ("DEFAULT", "warn"), ("8", "warn")],
)
def test_miopen_find_mode_as_miopen_parses_it(tmp_path, value, level):
    tree = board_root(tmp_path).file("home/owner/.bashrc", f"export MIOPEN_FIND_MODE={value}\n")
    finding = by_check(run(tree), "miopen-settings")[0]
    assert finding["level"] == level, finding
    if level == "warn":
        assert "/home/owner/.bashrc:1" in finding["todo"] and "TRUST_VERIFY_FULL" in finding["why"]


# --- the kernel log and KFD's io_links --------------------------------------------------------------------------


def test_compute_hangs_are_their_own_finding(tmp_path):
    tree = board_root(tmp_path).kmsg(
        "[drm] amdgpu kernel modesetting enabled.",
        "amdgpu 0000:0a:00.0: amdgpu: ring comp_1.0.0 timeout, signaled seq=12, emitted seq=14",
        "amdgpu 0000:0a:00.0: amdgpu: MODE1 reset",
        "amdgpu: Failed to evict process queues",
    )
    result = run(tree)
    hangs = by_check(result, "compute-hangs")[0]
    assert hangs["level"] == "problem" and "Failed to evict process queues" in hangs["seen"]
    assert len(hangs["facts"]["compute"]) == 2 and hangs["facts"]["other"] == [
        "amdgpu 0000:0a:00.0: amdgpu: MODE1 reset"
    ]
    assert by_check(result, "probe-errors")[0]["level"] == "ok"  # hangs are not probe errors
    reset = board_root(tmp_path / "reset").kmsg("amdgpu 0000:0a:00.0: amdgpu: ring gfx_0.0.0 timeout")
    assert by_check(run(reset), "compute-hangs")[0]["level"] == "warn"
    clean = board_root(tmp_path / "clean").kmsg("[drm] amdgpu kernel modesetting enabled.")
    assert by_check(run(clean), "compute-hangs")[0]["level"] == "ok"


def test_an_unreadable_kernel_log_is_said_not_taken_for_a_clean_one(tmp_path):
    """As a normal user with kernel.dmesg_restrict=1 (Debian's default) /dev/kmsg cannot be opened: the hang
    check says it was not made and how to make it, instead of leaving its line out."""
    tree = board_root(tmp_path)
    (tmp_path / "dev/kmsg").unlink(missing_ok=True)
    hangs = by_check(run(tree), "compute-hangs")
    assert len(hangs) == 1 and hangs[0]["level"] == "info", hangs
    assert "not checked" in hangs[0]["seen"] and "sudo rdna1-kmgr doctor" in hangs[0]["todo"]


def test_pcie_atomics_from_the_io_link_flags_and_the_kernel_log(tmp_path):
    # flags: bit 0 enabled, bits 2 and 3 no 32/64-bit atomics (kfd_crat.h CRAT_IOLINK_FLAGS_*)
    good = board_root(tmp_path / "good").file(f"{TOPOLOGY}/1/io_links/0/properties", "type 2\nflags 1\n")
    assert by_check(run(good), "pcie-atomics")[0]["level"] == "ok"
    bad = board_root(tmp_path / "bad").file(f"{TOPOLOGY}/1/io_links/0/properties", "type 2\nflags 13\n")
    finding = by_check(run(bad), "pcie-atomics")[0]
    assert finding["level"] == "problem" and "io_link without atomics" in finding["seen"]
    logged = board_root(tmp_path / "log").kmsg("amdgpu 0000:0a:00.0: amdgpu: PCIE atomic ops is not supported")
    assert "PCIE atomic ops is not supported" in by_check(run(logged), "pcie-atomics")[0]["seen"]
    assert by_check(run(board_root(tmp_path / "none")), "pcie-atomics")[0]["level"] == "warn"


# --- nothing there ------------------------------------------------------------------------------------------------


def test_a_root_without_board_rocm_or_torch_is_a_clean_report(tmp_path):
    tree = no_gpu(tmp_path / "root")
    proc = subprocess.run(
        [CLI, "doctor", "--json", "--sysroot", str(tree.root)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    result = json.loads(proc.stdout)
    assert result["board"] is None and result["summary"]["problem"] == 0
    checks = {f["check"] for f in result["findings"]}
    assert {"board", "torch", "rocblas", "mixed-stacks", "miopen-settings"} <= checks
    assert not checks & {"pcie-atomics", "rocm-sdk"}  # nothing to say without a board or TheRock
    # the queue check says what the kernel would do to a board, as a note
    assert [f["level"] for f in result["findings"] if f["check"] == "queue"] == ["info"]
    text = subprocess.run([CLI, "doctor", "--sysroot", str(tree.root)], capture_output=True, text=True, timeout=120)
    assert text.returncode == 0 and "0 problem(s)" in text.stdout


# --- the kpack loader's settings (rocm-kpack's kpack_cache_create) -------------------------------------------


@pytest.mark.parametrize(
    "line,level,says",
    [
        ("ROCM_KPACK_DISABLE=1", "problem", "refuses every load"),
        ("ROCM_KPACK_DISABLE=0", "info", "off as the loader reads it"),
        ("ROCM_KPACK_PATH=/srv/kpack:/opt/k", "warn", "/srv/kpack, /opt/k are searched"),
        ("ROCM_KPACK_PATH_PREFIX=/srv/kpack", "info", "before the libraries' own paths"),
        ("ROCM_KPACK_DEBUG=1", "info", "logs which archives"),
    ],
)
def test_kpack_loader_settings_are_read_and_reported(tmp_path, line, level, says):
    tree = board_root(tmp_path).file("etc/environment", line + "\n")
    finding = by_check(run(tree), "kpack-settings")[0]
    assert finding["level"] == level and says in finding["why"], finding
    assert finding["seen"].startswith(line + " in /etc/environment:1")


def test_kpack_unset_is_ok_and_a_missing_device_wheel_suggests_kpack_debug(tmp_path):
    tree = board_root(tmp_path)
    therock_venv(tmp_path / "root/home/owner/venv", device=None)
    result = run(tree)
    assert [f["level"] for f in by_check(result, "kpack-settings")] == ["ok"]
    torch = by_check(result, "torch")[0]
    assert "device kernel image is invalid" in torch["why"] and "ROCM_KPACK_DEBUG=1" in torch["why"]
