"""doctor on Debian's own ROCm packages (sid: rocBLAS, MIOpen, the HIP runtime, hipBLASLt), unpacked at test
time, and doctor as a user runs it on this machine (no board here).

What doctor says is checked against what the package itself lists (`dpkg-deb -c`): rocBLAS ships gfx1010
Tensile files and gfx1010 offload bundles in librocblas.so; hipBLASLt ships none for gfx1010.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from doctor_checks import by_check
from rocm_fixtures import PACKAGES, link_tree, unpacked
from sysfs_fixtures import rx5600xt

# Debian's ROCm packages unpacked and a real CPU PyTorch run: out of the fast tier
pytestmark = pytest.mark.system

CLI = str(Path(sys.executable).parent / "rdna1-kmgr")


def doctor(*args: str, env: dict | None = None) -> dict:
    proc = subprocess.run(
        [CLI, "doctor", "--json", *args], capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})}
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def listed_names(family: str, processor: str) -> int:
    """How many files of the family's .deb name `processor`, from the package's own listing."""
    deb = next(
        (Path(os.environ.get("RDNA1_KMGR_TEST_CACHE", "/var/cache/rdna1-kmgr-tests")) / "debs").glob(
            f"{unpacked(PACKAGES[family]).name}.deb"
        )
    )
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    return sum(1 for line in listing.splitlines() if processor in line.rsplit("/", 1)[-1])


@pytest.fixture
def rocm_root(tmp_path, debian_rocm):
    """An RX 5600 XT desktop with Debian sid's four ROCm packages unpacked into its /usr."""
    tree = rx5600xt(tmp_path / "root")
    tree.users(("owner", 1000, ["render"]), groups={"render": os.getgid()})
    tree.kfd_node(0).kfd_node(1, gfx_target_version=100100, simd_count=36, render_minor=128, heap_types=(2,))
    for family in ("rocblas", "miopen", "hip", "hipblaslt"):
        link_tree(debian_rocm[family], tree.root)
    return tree


def test_debian_rocblas_carries_gfx1010_and_hipblaslt_does_not(rocm_root):
    result = doctor("--sysroot", str(rocm_root.root), "--user", "owner")
    assert result["rocm_loads"] == "gfx1010"
    rocblas = by_check(result, "rocblas")
    assert [f["level"] for f in rocblas] == ["ok"], rocblas
    facts = rocblas[0]["facts"]
    assert facts["in_libraries"]["targets"]["gfx1010"] == facts["in_libraries"]["bundles"] > 0
    named = listed_names("rocblas", "gfx1010")
    assert named > 0 and facts["code_object_files"]["gfx1010"] == named
    assert facts["confirmed"]["gfx1010"] > 0 and not facts["mismatched"]

    hipblaslt = by_check(result, "hipblaslt")
    assert listed_names("hipblaslt", "gfx1010") == 0
    assert hipblaslt[0]["level"] == "info" and "NO gfx1010 code" in hipblaslt[0]["seen"]  # by design: #1062
    assert "gfx1010" not in hipblaslt[0]["facts"]["code_object_files"]
    # hipBLASLt's .co files are zstd-compressed bundles: read, not skipped
    assert not hipblaslt[0]["facts"]["in_libraries"]["unreadable"]

    assert by_check(result, "miopen")[0]["level"] == "info"
    assert by_check(result, "hip")[0]["seen"].startswith("HIP runtime in ")
    assert result["summary"]["problem"] == 0


def test_the_override_makes_rocm_load_rdna2_code(rocm_root):
    rocm_root.file("home/owner/.profile", "export HSA_OVERRIDE_GFX_VERSION=10.3.0\n")
    result = doctor("--sysroot", str(rocm_root.root), "--user", "owner")
    assert result["rocm_loads"] == "gfx1030"
    override = by_check(result, "gfx-override")
    assert override[0]["level"] == "problem" and "/home/owner/.profile:1" in override[0]["seen"]
    rocblas = by_check(result, "rocblas")[0]
    assert "gfx1030 code present" in rocblas["seen"] and "the board's own gfx1010: present" in rocblas["seen"]
    assert "NO gfx1030 code" in by_check(result, "hipblaslt")[0]["seen"]


def test_a_root_without_rocblas_says_so(tmp_path, debian_rocm):
    tree = rx5600xt(tmp_path / "root")
    link_tree(debian_rocm["hipblaslt"], tree.root)
    result = doctor("--sysroot", str(tree.root))
    assert by_check(result, "rocblas")[0]["seen"].startswith("rocBLAS: not installed")
    assert by_check(result, "hipblaslt")[0]["level"] == "info"  # not built for gfx101X by design


def test_on_this_machine_without_a_board_it_says_so_and_checks_the_rest():
    if Path("/sys/class/kfd/kfd/topology/nodes").is_dir():
        pytest.skip("this machine has KFD nodes: the no-board test is for machines without a GPU")
    result = doctor(env={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"})
    assert result["board"] is None
    assert "no RDNA1 board on this machine" in by_check(result, "board")[0]["seen"]
    override = by_check(result, "gfx-override")
    assert override[0]["level"] == "problem" and "the environment of this process" in override[0]["seen"]
    checks = {f["check"] for f in result["findings"]}
    assert {"kfd", "access", "rocblas", "miopen", "hipblaslt", "hip", "torch", "versions", "profile"} <= checks


def test_a_real_cpu_torch_named_with_python_is_found_and_called_cpu_only(torch_python):
    """A real PyTorch wheel (the CPU one pip installs here), by its interpreter's path."""
    python = torch_python
    probe = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__, torch.version.hip)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    result = doctor("--python", python)
    mine = [f for f in by_check(result, "torch") if f["facts"].get("version") == probe[0]]
    assert mine, by_check(result, "torch")
    if probe[1] == "None":
        assert mine[0]["level"] == "warn" and "a CPU-only build, no HIP" in mine[0]["seen"]
    else:
        assert f"HIP {probe[1]}" in mine[0]["seen"]
