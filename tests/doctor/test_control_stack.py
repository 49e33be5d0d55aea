"""doctor's `queue` finding with the control stack first (issue 48): KFD (Linux 6.12 on) refuses a queue whose
control stack differs from the node's before it looks at the CWSR area, so SVM does not matter there.

Every expected size here was worked out by hand, not taken from the code under test:
- KFD, kfd_queue.c `kfd_queue_ctx_save_restore_size` (Debian's 6.12.117, read by hand): gfx10 sizes the control
  stack for 32 waves a CU, ALIGN(40 + 12 * waves + 8, 4096), at most 0x7000; cwsr_size adds 0x55000 a CU.
- libhsakmt after rocm-systems #6125 (queues.c `update_ctx_save_restore_size`, read at 0b2e283c8a9e): the node's
  ctl_stack_size when it prints one, else the same formula for CUs * 2 SIMDs * 20 waves = 40 a CU on RDNA1.

  RX 5600 XT, 36 CUs: KFD 40 + 13824 + 8 = 13872 -> 0x4000; ROCm 40 + 17280 + 8 = 17328 -> 0x5000: refused.
  RX 5500, 20 CUs:    KFD 40 + 7680 + 8 = 7728 -> 0x2000;   ROCm 40 + 9600 + 8 = 9648 -> 0x3000: refused.
  RX 5500 XT, 22 CUs: KFD 40 + 8448 + 8 = 8496 -> 0x3000;   ROCm 40 + 10560 + 8 = 10608 -> 0x3000: equal.
Where the node prints the sizes (upstream 8fc2796dea6f) libhsakmt sends KFD's and nothing is refused there; the
CWSR area then decides: SVM takes ROCm's larger area, a BO refuses it (cwsr-size's story).
"""

import pytest
from doctor_checks import board_root, by_check, run
from therock_fixtures import therock_venv

from rdna1_kmgr.doctor import control_stack, queue_cwsr

SVM = 0x08006480  # the RX 5600 XT's capability with HSA_CAP_SVMAPI_SUPPORTED
NO_SVM = 0x00006480
# (gfx_target_version, simd_count, printed cwsr_size, printed ctl_stack_size), by hand as above
BOARDS = {
    "RX 5600 XT": (100100, 72, 12550144, 16384),
    "RX 5500": (100102, 40, 6971392, 8192),
    "RX 5500 XT": (100102, 44, 7671808, 12288),
}
REFUSED = {"RX 5600 XT": ("0x4000", "0x5000"), "RX 5500": ("0x2000", "0x3000")}
AFTER, BEFORE = "7.15.0a20260630", "7.13.0a20260501"
PRINTING, SILENT = "6.12.95+deb12-amd64", "6.17.0-14-generic"


def machine(tmp_path, board: str, prints: bool, svm: bool, rocm: str, mask: int | None = None):
    gfx, simds, cwsr, ctl = BOARDS[board]
    tree = board_root(tmp_path).kernel(PRINTING if prints else SILENT)
    sizes = dict(cwsr_size=cwsr, ctl_stack_size=ctl) if prints else {}
    cpu = dict(cwsr_size=0, ctl_stack_size=0) if prints else {}  # 8fc2796dea6f prints them on CPU nodes too
    tree.kfd_node(0, **cpu)
    tree.kfd_node(
        1, gfx, simds, 128, (1,), capability=SVM if svm else NO_SVM, simd_per_cu=2, max_waves_per_simd=20, **sizes
    )
    therock_venv(tmp_path / "root/home/owner/venv", rocm=rocm, torch="2.11.0+rocm" + rocm)
    if mask is not None:
        tree.file("sys/module/amdgpu/parameters/rdna1_quirks", f"{mask}\n")
    return tree


def queue(tree) -> dict:
    (found,) = by_check(run(tree), "queue")
    return found


@pytest.mark.parametrize("board", sorted(BOARDS))
@pytest.mark.parametrize("prints", [True, False], ids=["prints", "silent"])
@pytest.mark.parametrize("svm", [True, False], ids=["svm", "bo"])
@pytest.mark.parametrize("rocm", [AFTER, BEFORE], ids=["after-6125", "before-6125"])
def test_each_board_kernel_backing_and_rocm_gets_the_verdict_the_sources_give(tmp_path, board, prints, svm, rocm):
    found = queue(machine(tmp_path, board, prints, svm, rocm))
    stack_refused = rocm == AFTER and not prints and board in REFUSED
    if stack_refused:
        kfd, sent = REFUSED[board]
        assert found["level"] == "problem"
        assert f"KFD checks {kfd}, ROCm after rocm-systems #6125 sends {sent}" in found["seen"]
        assert "control stack" in found["seen"] and "not affected" not in found["seen"]
        todo = found["todo"]
        assert todo.index("topology-sizes") < todo.index("2. or boot a kernel that prints") < todo.index("3. or use")
        assert ("which cwsr-size accepts" in found["why"]) == (not svm)
    elif rocm == BEFORE:
        assert found["level"] == "ok"
        assert ("not affected unless HSA_USE_SVM=0" if svm else "before rocm-systems #6125") in found["seen"]
    elif svm:
        assert found["level"] == "ok" and "not affected unless HSA_USE_SVM=0" in found["seen"]
    else:
        assert found["level"] == "problem" and "the CWSR area is a BO" in found["seen"]
        assert found["todo"].startswith("1. install rdna1-kmgr's build, which has cwsr-size")
    if not prints and board == "RX 5500 XT":  # 22 CUs: both sides 0x3000, nothing refused at the stack
        assert "control stack" not in found["seen"]


def test_cwsr_size_alone_is_never_ok_where_the_control_stack_is_refused(tmp_path):
    """Before issue 48 a build with cwsr-size read as "ok (cwsr-size)" on 6.14 / 6.17 with any RDNA1 board."""
    found = queue(machine(tmp_path, "RX 5600 XT", prints=False, svm=False, rocm=AFTER, mask=0x10))
    assert found["level"] == "problem" and "KFD checks 0x4000" in found["seen"] and "has cwsr-size" not in found["seen"]


def test_a_build_with_topology_sizes_prints_the_sizes_and_then_cwsr_size_decides(tmp_path):
    # the loaded build prints KFD's sizes for the board: the node looks like a kernel with the export
    found = queue(machine(tmp_path, "RX 5600 XT", prints=True, svm=False, rocm=AFTER, mask=0x30))
    assert (
        found["level"] == "ok" and "has cwsr-size" in found["seen"] and "prints ctl_stack_size 16384" in found["seen"]
    )


def test_a_rocm_whose_version_says_nothing_is_still_the_stack_problem(tmp_path):
    tree = machine(tmp_path, "RX 5500", prints=False, svm=True, rocm=AFTER)
    (tmp_path / "root/home/owner/venv").rename(tmp_path / "gone")
    tree.file("opt/rocm-9.1.0/.info/version", "9.1.0-12\n")
    found = queue(tree)
    assert found["level"] == "problem"
    assert "KFD checks 0x2000" in found["seen"] and "cannot be told from its version: /opt/rocm-9.1.0" in found["seen"]
    # no ROCm at all: nothing to refuse yet, but the first 2026 ROCm will be
    tree.file("opt/rocm-9.1.0/.info/version", "?\n")
    (tmp_path / "root/opt/rocm-9.1.0/.info/version").unlink()
    found = queue(tree)
    assert found["level"] == "warn" and "no ROCm user space found" in found["seen"]


def torch_with_its_own_rocm(venv, hip: str) -> None:
    """A pytorch.org ROCm wheel's layout: torch/version.py's `hip`, and the HSA runtime in torch/lib."""
    site = venv / "lib/python3.11/site-packages"
    (site / "torch/lib").mkdir(parents=True)
    (site / "torch/version.py").write_text(f"__version__ = '2.7.1+rocm6.3'\ncuda = None\nhip = '{hip}'\n")
    (site / "torch/lib/libhsa-runtime64.so").write_bytes(b"\x7fELF")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")


def test_a_rocm_inside_the_torch_wheel_is_the_owners_rocm(tmp_path):
    tree = machine(tmp_path, "RX 5600 XT", prints=False, svm=False, rocm=AFTER)
    (tmp_path / "root/home/owner/venv").rename(tmp_path / "gone")
    torch_with_its_own_rocm(tmp_path / "root/home/owner/pt", "6.3.42131-fa1d09cbd")
    found = queue(tree)
    # HIP 6.3: a ROCm release from long before #6125, the only ROCm here: nothing is refused
    assert found["level"] == "ok"
    assert "torch 2.7.1+rocm6.3's own ROCm in " in found["seen"] and "6.3.42131-fa1d09cbd" in found["seen"]


@pytest.mark.parametrize(
    "version, carries",
    [
        ("7.2.1", False),  # ROCm 7.2.1 shipped by 2026-04-04
        ("7.13.0", False),  # therock-7.13 pins rocm-systems develop of 2026-05-04
        ("7.14.0", True),  # therock-7.14, 2026-07-09
        ("10.0.0", True),  # rocm-systems #11299 reports 10.0.0
        ("9.0.0", None),
        ("7.13.0a20260513", False),
        ("7.13.0a20260516", None),  # #6125 opened 05-14, discussed to 05-18
        ("7.14.0a20260520", True),
        ("6.3.42131-fa1d09cbd", False),  # torch.version.hip of a pytorch.org ROCm 6.3 wheel
    ],
)
def test_which_rocm_carries_6125(version, carries):
    assert queue_cwsr.carries_6125(version) is carries


def test_a_released_revert_counts(monkeypatch):
    monkeypatch.setattr(queue_cwsr, "REVERTED_IN", 20261001)
    assert queue_cwsr.carries_6125("10.1.0a20260930") is True
    assert queue_cwsr.carries_6125("10.1.0a20261002") is False


def test_without_a_board_doctor_says_whether_this_kernel_prints_the_sizes(tmp_path):
    """8fc2796dea6f prints the two lines on CPU nodes too: a machine without the board can tell."""
    for prints, said in ((True, "no control stack to fix"), (False, "an RX 5600 XT or RX 5500 needs topology-sizes")):
        root = tmp_path / str(prints) / "root"
        node = root / "sys/class/kfd/kfd/topology/nodes/0"
        node.mkdir(parents=True)
        (node / "properties").write_text(
            "cpu_cores_count 8\nsimd_count 0\n" + ("cwsr_size 0\nctl_stack_size 0\n" * prints)
        )
        (root / "boot").mkdir()
        (root / f"boot/config-{SILENT}").write_text("CONFIG_HSA_AMD=y\n# CONFIG_DEVICE_PRIVATE is not set\n")
        nodes = queue_cwsr.kfd_access.read_nodes(root)
        svm = queue_cwsr.read_svm_facts(root, SILENT)
        (found,) = queue_cwsr.findings(False, SILENT, root, None, [], svm, [], [], control_stack.kernel_prints(nodes))
        assert found.level == "info" and said in found.seen


def test_two_gpus_name_the_node_without_svm_and_never_ask_for_an_svm_kernel(tmp_path):
    """An RX 580 (gfx803, no SVM API ever) beside the board turns libhsakmt's SVM off for both."""
    tree = machine(tmp_path, "RX 5600 XT", prints=True, svm=True, rocm=AFTER)
    tree.kfd_node(2, 80003, 72, 129, (1,), capability=NO_SVM)
    found = queue(tree)
    assert found["level"] == "problem" and "lacks HSA_CAP_SVMAPI_SUPPORTED (0x08000000) on GPU node 2" in found["seen"]
    assert "boot a kernel whose KFD offers the SVM API" not in found["todo"]
    assert "GPU node 2 out of KFD" in found["todo"]


def test_hsa_use_svm_0_on_a_kernel_without_svm_names_both(tmp_path):
    tree = machine(tmp_path, "RX 5600 XT", prints=True, svm=False, rocm=AFTER)
    tree.file("home/owner/.bashrc", "export HSA_USE_SVM=0\n")
    found = queue(tree)
    assert found["level"] == "problem"
    assert (
        "no SVM API, the CWSR area is a BO" in found["seen"]
        and "HSA_USE_SVM=0 in /home/owner/.bashrc:1 too" in (found["seen"])
    )
    assert "remove HSA_USE_SVM=0" not in found["todo"]  # removing it changes nothing without the SVM API


@pytest.mark.parametrize(
    "release, prints",
    [
        ("6.12.63-amd64", False),  # the stable backport came with 6.12.64
        ("6.12.64-amd64", True),
        ("6.17.0-14-generic", False),  # 6.17.y never got it
        ("6.18.3", False),
        ("6.18.4-arch1-1", True),
        ("6.19.0", True),
        ("7.1.2", True),
        ("6.1.0-56-amd64", None),  # no check at all: nothing to say
    ],
)
def test_without_a_topology_the_release_says_whether_upstream_prints_the_sizes(release, prints):
    assert control_stack.prints_by_version(release) is prints
