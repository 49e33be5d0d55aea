"""doctor's gpu-faults finding, from a kernel log holding a gfx10 page fault as Debian's 6.12 prints it
(gmc_v10_0_process_interrupt's three lines), and a log without one."""

from doctor_checks import board_root, by_check, run

FAULT = (
    "amdgpu 0000:0a:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32770)",
    "amdgpu 0000:0a:00.0: amdgpu:  in process python3 pid 2512 thread python3 pid 2512",
    "amdgpu 0000:0a:00.0: amdgpu:   in page starting at address 0x00007f0000000000 from client 0x1b (UTCL2)",
)


def test_a_page_fault_is_a_problem_naming_the_process_and_the_time(tmp_path):
    tree = board_root(tmp_path).kmsg("amdgpu 0000:0a:00.0: amdgpu: SMU is initialized successfully!", *FAULT)
    (found,) = by_check(run(tree), "gpu-faults")
    assert found["level"] == "problem"
    # the fixture's records are 1 ms apart: the fault is the second, 0.001 s after boot
    assert (
        "last: [gfxhub] page fault at 0x00007f0000000000 in process python3 (pid 2512), 0.0 s after boot"
        in (found["seen"])
    )
    assert "processes: python3" in found["seen"] and "memory-fault" in found["todo"]


def test_a_clean_log_is_ok(tmp_path):
    tree = board_root(tmp_path).kmsg("amdgpu 0000:0a:00.0: amdgpu: SMU is initialized successfully!")
    (found,) = by_check(run(tree), "gpu-faults")
    assert found["level"] == "ok" and "1 records" in found["seen"]


def test_a_compute_ring_timeout_names_its_process_and_time(tmp_path):
    """amdgpu_job_timedout (Debian's 6.12): `ring %s timeout, signaled seq=%u, emitted seq=%u`, then `Process
    information: process %s pid %d thread %s pid %d`."""
    tree = board_root(tmp_path).kmsg(
        "amdgpu 0000:0a:00.0: amdgpu: SMU is initialized successfully!",
        "amdgpu 0000:0a:00.0: amdgpu: ring comp_1.0.0 timeout, signaled seq=1234, emitted seq=1236",
        "amdgpu 0000:0a:00.0: amdgpu: Process information: process python3 pid 2512 thread python3 pid 2513",
    )
    (found,) = by_check(run(tree), "compute-hangs")
    assert found["level"] == "problem" and "(process python3 (pid 2512), 0.0 s after boot)" in found["seen"]
