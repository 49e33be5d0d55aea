"""doctor on TheRock's multi-arch PyTorch (torch[device-gfx1010]) laid out as TheRock documents it, written at
test time (therock_fixtures.py): the kernels in the kpack archives, the ROCm SDK wheels' versions, a missing
or mismatched device wheel with the exact pip line, rocBLAS and the HIP runtime found in _rocm_sdk_*."""

import json
import struct
from pathlib import Path

from doctor_checks import board_root, by_check, run
from therock_fixtures import (
    dist_info,
    elf_library,
    kpack_archive,
    msgpack,
    therock_venv,
)

from rdna1_kmgr.doctor import kpack, msgpack_data

# TheRock's indexes, read in ROCm/TheRock at 89553ce3: RELEASES.md line 107 (the multi-arch nightly index, where
# the nightlies before 2026-08-22 stay), build_tools/setup_venv.py lines 57-59 (each channel's index since #7547)
INDEX = "https://rocm.nightlies.amd.com/whl-multi-arch/"
NIGHTLY_NOW = "https://nightly.repo.amd.com/rocm/whl-next/"
RELEASE_INDEX = "https://stable.repo.amd.com/rocm/whl-next/"
RELEASE_BEFORE = "https://repo.amd.com/rocm/whl-multi-arch/"  # #6550's, until the move
NEW_VENV = "python3 -m venv ~/therock-venv && ~/therock-venv/bin/python -m pip install"


def venv_root(tmp_path, **kwargs):
    tree = board_root(tmp_path)
    site = therock_venv(tmp_path / "root/home/owner/venv", **kwargs)
    return tree, site


def test_the_kpack_format_as_documented_is_read(tmp_path):
    path = kpack_archive(
        tmp_path / "blas_lib_gfx1010.kpack",
        "blas_lib",
        "gfx1010",
        ["rocblas/lib/librocblas.so.5", "rocblas/lib/librocblas.so.5#1"],
    )
    archive = kpack.read_archive(path)
    assert (archive.group, archive.family, archive.arches, archive.kernels) == ("blas_lib", "gfx1010", ("gfx1010",), 2)
    assert archive.holds_kernels_of(tmp_path / "librocblas.so.5") and not archive.holds_kernels_of(
        tmp_path / "libMIOpen.so"
    )
    (tmp_path / "bad.kpack").write_bytes(b"PK\x03\x04" + bytes(60))
    assert "no KPAK header" in kpack.read_archive(tmp_path / "bad.kpack").error
    ref = kpack.marker(
        elf_library(
            tmp_path / "lib/libx.so",
            {"kpack_search_paths": ["../.kpack/x_@GFXARCH@.kpack"], "kernel_name": "x/lib/libx.so"},
        )
    )
    assert ref.search_paths == ("../.kpack/x_@GFXARCH@.kpack",) and ref.kernel_name == "x/lib/libx.so"
    assert ref.candidates("gfx1010") == [(tmp_path / ".kpack/x_gfx1010.kpack").resolve()]
    assert kpack.marker(elf_library(tmp_path / "lib/plain.so")) is None


def test_msgpack_reader_against_the_spec_bytes():
    raw = msgpack({"a": [1, 300, 70000]}) + b"trailing"
    assert msgpack_data.decode(raw) == {"a": [1, 300, 70000]}
    # negative numbers and floats, written by hand from the specification
    assert msgpack_data.decode(b"\xff") == -1 and msgpack_data.decode(b"\xd1" + struct.pack(">h", -200)) == -200
    assert msgpack_data.decode(b"\xcb" + struct.pack(">d", 1.5)) == 1.5
    assert msgpack_data.decode(msgpack({"long": "x" * 40, "t": [True, None, b"\x00\x01"]})) == {
        "long": "x" * 40,
        "t": [True, None, b"\x00\x01"],
    }


def test_therock_torch_with_its_device_wheel_is_ok_and_rocblas_and_hip_are_found(tmp_path):
    tree, site = venv_root(tmp_path)
    result = run(tree)
    torch = by_check(result, "torch")
    assert torch[0]["level"] == "ok", torch[0]
    assert "gfx1010 kernels in torch/.kpack/torch_gfx1010.kpack" in torch[0]["seen"]
    assert "amd-torch-device-gfx1010 2.11.0+rocm7.13.0a20260601" in torch[0]["seen"]
    sdk = by_check(result, "rocm-sdk")
    assert [f["level"] for f in sdk] == ["ok"]
    assert (
        "rocm-sdk-core 7.13.0a20260601" in sdk[0]["seen"]
        and "rocm-sdk-device-gfx1010 7.13.0a20260601" in sdk[0]["seen"]
    )
    assert "gfx1010 gfx1100" in sdk[0]["seen"]

    rocblas = [f for f in by_check(result, "rocblas") if f["seen"].startswith("rocBLAS in ")]
    assert [f["level"] for f in rocblas] == ["ok"] and "blas_lib_gfx1010.kpack" in rocblas[0]["seen"]
    assert rocblas[0]["facts"]["confirmed"]["gfx1010"] == 1  # the Tensile .co opened and agreeing
    hip = [f for f in by_check(result, "hip") if f["seen"].startswith("HIP runtime in ")]
    assert hip and hip[0]["seen"].startswith(f"HIP runtime in {site / '_rocm_sdk_core/lib'}")
    # no system ROCm: no "not installed" warning, and each library listed once, with the PyTorch that brings it
    assert [f["seen"].split(" (")[0] for f in by_check(result, "rocblas")] == [
        f"rocBLAS in {site / '_rocm_sdk_libraries/lib'}"
    ]
    assert not [f for f in result["findings"] if "not installed" in f["seen"]]
    hipblaslt = next(f for f in by_check(result, "hipblaslt") if f["seen"].startswith("hipBLASLt in "))
    # not built for gfx101X by design (TheRock #1062): a fact with what fails, not a warning
    assert hipblaslt["level"] == "info" and "NO gfx1010 code" in hipblaslt["seen"]
    assert "torch._int_mm" in hipblaslt["why"] and "rocBLAS" in hipblaslt["why"] and "#1062" in hipblaslt["why"]
    stack = ("torch", "rocm-sdk", "rocblas", "hipblaslt", "hip", "miopen", "versions")
    assert not [f for f in result["findings"] if f["check"] in stack and f["level"] == "warn"]
    versions = by_check(result, "versions")[0]
    assert "no ROCm runtime installed" not in versions["seen"] and "rocm-sdk-core 7.13.0a20260601" in versions["seen"]
    assert result["summary"]["problem"] == 0, [f for f in result["findings"] if f["level"] == "problem"]


def test_a_missing_device_wheel_is_a_problem_with_the_exact_pip_line(tmp_path):
    tree, _site = venv_root(tmp_path, device=None)
    result = run(tree)
    pip = (
        f"/home/owner/venv/bin/python -m pip install --index-url {INDEX} "
        f'"torch[device-gfx1010]==2.11.0+rocm7.13.0a20260601" "torchvision[device-gfx1010]==0.26.0+rocm7.13.0a20260601"'
    )
    torch = by_check(result, "torch")[0]
    assert torch["level"] == "problem"
    assert (
        "torch/.kpack has no gfx1010 archive (amd-torch-device-gfx1010 not installed; archives for: gfx1100)"
        in torch["seen"]
    )
    assert "device kernel image is invalid" in torch["why"] and "kpack_load_code_object" in torch["why"]
    assert pip in torch["todo"]
    sdk = by_check(result, "rocm-sdk")[0]
    assert sdk["level"] == "problem" and "rocm-sdk-device-gfx1010 is NOT installed" in sdk["seen"]
    assert pip in sdk["todo"]
    rocblas = next(f for f in by_check(result, "rocblas") if f["seen"].startswith("rocBLAS in "))
    assert rocblas["level"] == "problem" and "device wheels" in rocblas["todo"]


def test_a_device_wheel_of_another_version_is_a_problem(tmp_path):
    tree, site = venv_root(tmp_path)
    for info in site.glob("amd_torch_device_gfx1010-*.dist-info"):
        (info / "METADATA").unlink()
        info.rmdir()
    dist_info(site, "amd-torch-device-gfx1010", "2.10.0+rocm7.12.0")
    torch = by_check(run(tree), "torch")[0]
    assert (
        torch["level"] == "problem"
        and "amd-torch-device-gfx1010 2.10.0+rocm7.12.0 does not match torch" in torch["seen"]
    )


def test_an_archive_that_is_not_kpack_is_not_counted(tmp_path):
    tree, site = venv_root(tmp_path, device=None)
    (site / "torch/.kpack/torch_gfx1010.kpack").write_bytes(b"not an archive")
    torch = by_check(run(tree), "torch")[0]
    assert torch["level"] == "problem" and "archives for: gfx1100" in torch["seen"]


def test_under_the_override_the_wanted_wheel_is_the_boards_own_and_the_file_line_is_named(tmp_path):
    tree, _site = venv_root(tmp_path)
    tree.file("home/owner/.bashrc", "# forum advice\nexport HSA_OVERRIDE_GFX_VERSION=10.3.0\n")
    result = run(tree)
    assert result["rocm_loads"] == "gfx1030"
    override = by_check(result, "gfx-override")[0]
    assert override["level"] == "problem"
    assert "edit /home/owner/.bashrc and delete (or comment out) line 2" in override["todo"]
    assert "profile install" not in override["todo"]
    torch = by_check(result, "torch")[0]
    assert "gfx1010 kernels in torch/.kpack/torch_gfx1010.kpack" in torch["seen"] and torch["level"] == "warn"
    sdk = by_check(result, "rocm-sdk")[0]
    assert "rocm-sdk-device-gfx1010 7.13.0a20260601" in sdk["seen"] and sdk["level"] == "ok"
    everything = json.dumps(result["findings"])
    assert "[device-gfx1030" not in everything and "device-gfx1030]" not in everything  # no pip line for RDNA2


def test_under_the_override_a_missing_device_wheel_asks_for_gfx1010s(tmp_path):
    tree, _site = venv_root(tmp_path, device=None, host_arches=("gfx1030",))
    tree.file("etc/profile.d/rocm.sh", "export HSA_OVERRIDE_GFX_VERSION=10.3.0\n")
    result = run(tree)
    for check in ("torch", "rocm-sdk"):
        finding = by_check(result, check)[0]
        assert finding["level"] == "problem", finding
        assert '"torch[device-gfx1010]==2.11.0+rocm7.13.0a20260601"' in finding["todo"]
        assert "[device-gfx1030]" not in finding["todo"]


def test_a_nightly_install_gets_the_nightly_index_and_says_so(tmp_path):
    tree, _site = venv_root(tmp_path, device=None)
    todo = by_check(run(tree), "rocm-sdk")[0]["todo"]
    assert todo.startswith(
        f"install the device wheels: `/home/owner/venv/bin/python -m pip install --index-url {INDEX} "
    )
    assert "(nightly channel, ROCm 7.13.0a20260601, as installed" in todo
    assert f"--index-url {RELEASE_INDEX}" in todo  # the other channel, named after it


def test_a_nightly_built_after_the_move_gets_the_new_nightly_index(tmp_path):
    tree, _site = venv_root(tmp_path, device=None, rocm="10.2.0a20261120", torch="2.13.0+rocm10.2.0a20261120")
    todo = by_check(run(tree), "torch")[0]["todo"]
    assert f'--index-url {NIGHTLY_NOW} "torch[device-gfx1010]==2.13.0+rocm10.2.0a20261120"' in todo, todo
    assert INDEX not in todo


def test_a_release_install_gets_the_stable_index(tmp_path):
    tree, _site = venv_root(tmp_path, device=None, rocm="10.1.0", torch="2.12.0+rocm10.1.0")
    result = run(tree)
    for check in ("torch", "rocm-sdk"):
        todo = by_check(result, check)[0]["todo"]
        # a release names no date: today's stable index, and the one before the move as an extra index
        pinned = (
            f'--index-url {RELEASE_INDEX} --extra-index-url {RELEASE_BEFORE} "torch[device-gfx1010]==2.12.0+rocm10.1.0"'
        )
        assert pinned in todo and "(release channel, ROCm 10.1.0, as installed" in todo, todo
        assert f'--index-url {INDEX} "torch[device-gfx1010]==' not in todo  # a release pin on the nightly index


def legacy_site(root, family: str):
    """A legacy per-family install as TheRock's legacy_per_family_releases.md and RELEASES.md of 2025 show it:
    `rocm-sdk-libraries-<family>`, torch `2.7.0a0+rocmsdk<date>`, kernels inside the libraries (no kpack)."""
    site = root / "lib/python3.12/site-packages"
    (root / "pyvenv.cfg").parent.mkdir(parents=True, exist_ok=True)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (site / "torch/lib").mkdir(parents=True)
    (site / "torch/version.py").write_text("__version__ = '2.7.0a0+rocmsdk20250608'\ncuda = None\nhip = '6.5.0'\n")
    elf_library(site / "torch/lib/libtorch_hip.so")
    elf_library(site / f"_rocm_sdk_libraries_{family.replace('-', '_')}/lib/librocblas.so.4")
    for name, version in (
        ("torch", "2.7.0a0+rocmsdk20250608"),
        ("rocm-sdk-core", "6.5.0rc20250606"),
        (f"rocm-sdk-libraries-{family}", "6.5.0rc20250606"),
    ):
        dist_info(site, name, version)
    return site


def test_a_legacy_per_family_install_is_named_and_sent_to_a_new_venv(tmp_path):
    tree = board_root(tmp_path)
    legacy_site(tmp_path / "root/home/owner/venv", "gfx110X-all")
    result = run(tree)
    sdk = by_check(result, "rocm-sdk")[0]
    assert sdk["level"] == "problem" and "legacy per-family wheels for gfx110X-all" in sdk["seen"]
    # per-family wheels declare no device extras: asked of that venv, pip would install nothing
    new = f'{NEW_VENV} --index-url {NIGHTLY_NOW} "torch[device-gfx1010]" "torchvision[device-gfx1010]"'
    assert new in sdk["todo"] and "have no device extras" in sdk["todo"]
    torch = by_check(result, "torch")[0]
    assert torch["level"] == "problem" and new in torch["todo"]


def test_a_venv_holding_another_torch_or_a_system_python_gets_a_new_venv():
    from rdna1_kmgr.doctor import therock_wheels

    line = therock_wheels.pip_line(Path("/x/y/z/site"), Path("/"), "gfx1010", {"torch": ""})
    assert line.startswith(f'`{NEW_VENV} --index-url {NIGHTLY_NOW} "torch[device-gfx1010]"')
    assert f"--index-url {RELEASE_INDEX}" in line and "PEP 668" in line and "--break-system-packages" not in line
    replaced = therock_wheels.pip_line(Path("/v/lib/python3.12/site-packages"), Path("/"), "gfx1010", {}, True)
    assert replaced.startswith(f"`{NEW_VENV} ") and "pip keeps an installed torch as it is" in replaced


def test_a_split_hipblaslt_without_archives_is_not_said_to_carry_no_gpu_code(tmp_path):
    tree, _site = venv_root(tmp_path, host_arches=())  # only gfx1010's device wheels: no hipBLASLt archive
    hipblaslt = next(f for f in by_check(run(tree), "hipblaslt") if f["seen"].startswith("hipBLASLt in "))
    assert hipblaslt["level"] == "info" and "no GPU code" not in hipblaslt["seen"]
    assert "kpack archives" in hipblaslt["seen"] and hipblaslt["todo"] == ""


def test_no_rocm_pytorch_makes_missing_libraries_facts_not_warnings(tmp_path):
    result = run(board_root(tmp_path))
    for check in ("rocblas", "hip"):
        finding = by_check(result, check)[0]
        assert "not installed" in finding["seen"] and finding["level"] == "info", finding
