"""GPU page faults as amdgpu logs them, written by hand from the format strings: gmc_v10_0_process_interrupt in
Debian's 6.1 and 6.12 (`"[%s] page fault (src_id:%u ring:%u vmid:%u pasid:%u)"`, `" in process %s pid %d thread
%s pid %d"`, `"  in page starting at address 0x%016llx from client 0x%x (%s)"`), gmc_v9's `"..., for process %s
pid %d thread %s pid %d)"` on the first line, amdgpu_vm_print_task_info's `" Process %s pid %d ..."` of newer
kernels, and the `VMC page fault` / `retry page fault` forms."""

from rdna1_kmgr.host import gpu_faults, kmsg

DEV = "amdgpu 0000:0a:00.0: amdgpu: "


def records(*messages: str):
    return kmsg.parse("".join(f"3,{100 + i},{(5 + i) * 1_000_000},-;{DEV}{m}\n" for i, m in enumerate(messages)))


def test_the_gfx10_form_names_the_process_on_the_next_line_and_the_address_after():
    (fault,) = gpu_faults.faults(
        records(
            "[gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32770)",
            " in process python3 pid 2512 thread python3 pid 2512",
            "  in page starting at address 0x00007f0000000000 from client 0x1b (UTCL2)",
            "GCVM_L2_PROTECTION_FAULT_STATUS:0x00800932",
        )
    )
    assert (fault.hub, fault.process, fault.pid, fault.address) == ("gfxhub", "python3", 2512, "0x00007f0000000000")
    assert fault.said() == "[gfxhub] page fault at 0x00007f0000000000 in process python3 (pid 2512), 5.0 s after boot"


def test_the_older_forms():
    found = gpu_faults.faults(
        records(
            "[gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32769, for process kfdtest pid 77 thread kfdtest pid 77)",
            "[mmhub0] VMC page fault (src_id:0 ring:0 vmid:0 pasid:0)",
            "[gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32772)",
            " Process python3 pid 31 thread python3 pid 31",
            "[gfxhub0] retry page fault (src_id:0 ring:0 vmid:8 pasid:32771, for process python3 pid 9 thread x pid 9)",
        )
    )
    assert [(f.hub, f.process, f.pid) for f in found] == [
        ("gfxhub", "kfdtest", 77),
        ("mmhub", None, None),
        ("gfxhub", "python3", 31),
        ("gfxhub", "python3", 9),
    ]


def test_other_lines_are_not_faults():
    assert gpu_faults.faults(records("ring comp_1.0.0 timeout", "GPU reset begin!", "fault handler installed")) == []
