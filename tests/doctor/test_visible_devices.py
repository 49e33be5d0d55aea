"""HIP_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES against the board (issue 50): on the one-GPU
RX 5600 XT machine (its KFD node 1 is the only GPU, index 0), `1` or an empty value hides it; `0` does not. With
ROCR_VISIBLE_DEVICES=1 on a two-GPU machine, HIP's index 0 is the machine's GPU 1 (HIP picks among what ROCr
shows: HIP's docs, "HIP environment variables")."""

import pytest
from doctor_checks import board_root, by_check, run


@pytest.mark.parametrize(
    ("lines", "level"),
    [
        ("export HIP_VISIBLE_DEVICES=1\n", "problem"),
        ("export CUDA_VISIBLE_DEVICES=\n", "problem"),
        ("export HIP_VISIBLE_DEVICES=0\n", "info"),
        ("export ROCR_VISIBLE_DEVICES=GPU-4fd1c2a3b4c5d6e7\n", "warn"),
    ],
)
def test_one_gpu(tmp_path, lines, level):
    tree = board_root(tmp_path)
    tree.file("home/owner/.profile", "# mine\n" + lines)
    (found,) = by_check(run(tree), "visible-devices")
    assert found["level"] == level and "/home/owner/.profile:2" in found["seen"], found
    if level == "problem":
        assert "hides the board (GPU 0 of 1" in found["seen"] and "line 2" in found["todo"]


def test_hip_picks_among_what_rocr_shows(tmp_path):
    tree = board_root(tmp_path)
    tree.kfd_node(1, gfx_target_version=110000, simd_count=96, render_minor=128, heap_types=(1,))
    tree.kfd_node(2, gfx_target_version=100100, simd_count=36, render_minor=129, heap_types=(1,))
    tree.file("etc/profile.d/gpu.sh", "export ROCR_VISIBLE_DEVICES=1\nexport HIP_VISIBLE_DEVICES=0\n")
    (found,) = by_check(run(tree), "visible-devices")
    assert found["level"] == "info" and "stays visible" in found["seen"], found
    tree.file("etc/profile.d/gpu.sh", "export ROCR_VISIBLE_DEVICES=0\n")
    (found,) = by_check(run(tree), "visible-devices")
    assert found["level"] == "problem" and "GPU 1 of 2" in found["seen"], found


def test_nothing_set_is_ok_and_says_where_it_looked(tmp_path):
    (found,) = by_check(run(board_root(tmp_path)), "visible-devices")
    assert found["level"] == "ok" and "system files" in found["seen"]
