"""ROCm stacks counted as an owner counts them (issue 50): AMD's apt ROCm 6.4.1 is its /opt/rocm-6.4.1 tree and
the hip-runtime-amd package that put it there (one stack; dpkg's file list says so, and AMD's version
6.4.43484.60401 names 6.4.1); the ROCm 6.3 inside pytorch.org's torch/lib is a stack of its own; Debian's own
libamdhip64-5 is another."""

from doctor_checks import board_root, by_check, run

AMD = "6.4.43484.60401-83~24.04"


def apt_rocm(tree, listed: bool = True):
    tree.file("opt/rocm-6.4.1/.info/version", "6.4.1-83\n").file("opt/rocm-6.4.1/lib/libamdhip64.so.6", "")
    status = f"Package: hip-runtime-amd\nStatus: install ok installed\nVersion: {AMD}\n\n"
    tree.file("var/lib/dpkg/status", status)
    if listed:
        tree.file("var/lib/dpkg/info/hip-runtime-amd.list", "/opt/rocm-6.4.1\n/opt/rocm-6.4.1/lib/libamdhip64.so.6\n")
    return tree


def pytorch_org(tree):
    site = tree.root / "home/owner/venv/lib/python3.12/site-packages"
    tree.file("home/owner/venv/pyvenv.cfg", "home = /usr/bin\n")
    tree.file(
        "home/owner/venv/lib/python3.12/site-packages/torch/version.py",
        "__version__ = '2.7.1+rocm6.3'\ncuda = None\nhip = '6.3.42131'\n",
    )
    (site / "torch/lib").mkdir(parents=True, exist_ok=True)
    (site / "torch/lib/libamdhip64.so").write_bytes(b"\x7fELF" + bytes(64))
    (site / "torch/lib/libtorch_hip.so").write_bytes(b"\x7fELF" + bytes(64))
    return tree


def test_amds_package_and_its_opt_tree_are_one_stack_and_torchs_own_rocm_is_named(tmp_path):
    for listed in (True, False):  # by dpkg's file list, else by the release AMD's version carries
        (versions,) = by_check(run(pytorch_org(apt_rocm(board_root(tmp_path / str(listed)), listed))), "versions")
        assert versions["seen"].startswith(
            f"ROCm: 2 stack(s): /opt/rocm-6.4.1 6.4.1-83 (package hip-runtime-amd {AMD}); torch 2.7.1+rocm6.3's own "
            "ROCm (HIP 6.3.42131) in "
        ), versions["seen"]
        assert versions["level"] == "info" and "LD_LIBRARY_PATH" in versions["todo"]


def test_the_distributions_own_package_beside_amds_tree_is_a_second_stack(tmp_path):
    tree = apt_rocm(board_root(tmp_path))
    tree.file(
        "var/lib/dpkg/status",
        f"Package: hip-runtime-amd\nStatus: install ok installed\nVersion: {AMD}\n\n"
        "Package: libamdhip64-5\nStatus: install ok installed\nVersion: 5.2.3-12\n\n",
    )
    (versions,) = by_check(run(tree), "versions")
    assert versions["level"] == "warn" and "distribution libamdhip64-5 5.2.3-12" in versions["seen"]
    assert "ROCm: 2 stack(s)" in versions["seen"]
