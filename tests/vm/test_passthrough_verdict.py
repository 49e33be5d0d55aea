"""vm-test gpu: the passthrough verdict rules on canned guest results, the plan the guest gets, the record's
host side; and a real CPU run of the conv2d workload script (skipped without torch).

The canned GPU facts are what collect.py reads in a guest driving an RX 5600 XT (1002:731f, 6 GiB): the
probe line the patched driver prints, KFD's CPU node 0 and GPU node 1 with its VRAM bank. They sit on top of
the canned emulated run of test_vm, so every emulated rule still applies.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from vm_fixtures import CANNED_KERNEL, patched_module, patched_result

from rdna1_kmgr.vm import (
    engine,
    gpu_checks,
    guest,
    guest_kernel,
    guest_view,
    passthrough,
    qemu_args,
    verdict,
    vfio,
    virtme_guest,
)

GPU = "1002:731f"
QUIRKS = ("crat-mem", "coarse-mtype")
CONV2D = Path(__file__).resolve().parents[2] / "qemu" / "guest" / "conv2d.py"
COLLECT = Path(__file__).resolve().parents[2] / "qemu" / "guest" / "collect.py"


def gpu_facts(heap_type: int = 2, flags: int = 0, bar0_bytes: int | None = None) -> dict:
    return {
        "devices": [{"bdf": "0000:01:00.0", "driver": "amdgpu", "bar0_bytes": bar0_bytes}],
        "kfd_nodes": [
            {
                "node": "0",
                "properties": {"cpu_cores_count": 1, "simd_count": 0, "vendor_id": 0, "device_id": 0},
                "mem_banks": [{"bank": "0", "properties": {"heap_type": 0, "size_in_bytes": 2147483648, "flags": 0}}],
            },
            {
                "node": "1",
                "properties": {
                    "cpu_cores_count": 0,
                    "simd_count": 72,
                    "vendor_id": 4098,
                    "device_id": 29471,
                    "gfx_target_version": 100100,
                },
                "mem_banks": [
                    {"bank": "0", "properties": {"heap_type": heap_type, "size_in_bytes": 6425673728, "flags": flags}}
                ],
            },
        ],
        "log": [],
    }


def workload_report(errors: dict[str, float] | None = None) -> dict:
    errors = errors or {}
    cases = [
        {"case": name, "max_abs_err": errors.get(name, 2e-6), "ok": errors.get(name, 2e-6) <= 1e-3}
        for name in gpu_checks.WORKLOAD_CASES
    ]
    return {
        "device": "cuda",
        "tolerance": {"rtol": 1e-3, "atol": 1e-3, "dtype": "float32"},
        "cases": cases,
        "ok": all(c["ok"] for c in cases),
    }


def passthrough_result(quirks_said: str = "crat-mem coarse-mtype", **facts) -> dict:
    result = patched_result()
    load = next(s for s in result["steps"] if s["name"] == "insmod selftest")
    if quirks_said is not None:
        load["log"].insert(
            -1,
            f"[   64.102000] amdgpu 0000:01:00.0: rdna1-kmgr: {GPU}, quirks active: "
            f"{quirks_said} (rdna1_quirks=0x3)",
        )
    result["gpu"] = gpu_facts(**facts)
    return result


def with_workload(result: dict, report: dict | None, rc: int = 0, output: str = "") -> dict:
    result["gpu"]["workload"] = {
        "name": "conv2d",
        "runs": [
            {"argv": ["python3", "conv2d.py"], "rc": rc, "output": output or json.dumps(report), "report": report}
        ],
    }
    return result


def judge(result, quirks=QUIRKS, workload=None) -> dict[str, verdict.Check]:
    target = gpu_checks.GpuTarget(GPU, quirks, workload)
    return {c.name: c for c in verdict.check_guest(result, patched_module(), CANNED_KERNEL, 7, None, target)}


def failing(checks) -> set[str]:
    return {name for name, check in checks.items() if not check.ok}


# --- the rules -------------------------------------------------------------------------------------------------


def test_a_gpu_driven_by_the_patched_module_passes_every_check():
    checks = judge(with_workload(passthrough_result(), workload_report()), workload="conv2d")
    assert failing(checks) == set()
    assert {"load", "selftest", "unload", "gpu-driver", "probe-line", "kfd-node", "vram-heap", "workload"} <= set(
        checks
    )
    assert checks["probe-line"].detail == "quirks active: crat-mem coarse-mtype"
    assert checks["kfd-node"].detail.startswith("KFD node 1 (device_id 29471")
    assert "heap_type 2 (FB_PRIVATE), size_in_bytes 6425673728, flags 0" in checks["vram-heap"].detail
    assert checks["workload"].detail.startswith("16 cases within rtol 0.001 / atol 0.001")
    assert verdict.decide(list(checks.values())) == ("pass", "all checks passed")


def test_an_emulated_rule_still_fails_a_passthrough_run():
    result = passthrough_result()
    next(s for s in result["steps"] if s["name"] == "rmmod stock").update(rc=1, output="rmmod: ERROR: in use\n")
    assert failing(judge(result)) == {"unload"}


def test_a_gpu_left_on_another_driver_fails():
    result = passthrough_result()
    result["gpu"]["devices"][0]["driver"] = "vfio-pci"
    checks = judge(result)
    assert failing(checks) == {"gpu-driver"}
    assert checks["gpu-driver"].detail == "1002:731f at 0000:01:00.0 is bound to vfio-pci, not amdgpu"
    result["gpu"]["devices"] = []
    assert judge(result)["gpu-driver"].detail == "the guest has no PCI device 1002:731f"


def test_a_probe_line_missing_an_active_quirk_fails():
    checks = judge(passthrough_result(quirks_said="crat-mem"))
    assert failing(checks) == {"probe-line"}
    assert checks["probe-line"].detail == (
        "the driver reports quirks active: crat-mem; " "expected: coarse-mtype crat-mem"
    )


def test_no_probe_line_fails_and_the_stock_reload_line_does_not_count():
    result = passthrough_result(quirks_said=None)
    # The second load (rdna1_quirks=0) prints its own line; only the load with the quirks on is judged.
    next(s for s in result["steps"] if s["name"] == "insmod stock")["log"].append(
        f"[   70.0] amdgpu 0000:01:00.0: rdna1-kmgr: {GPU}, quirks active: none (rdna1_quirks=0x0)"
    )
    checks = judge(result)
    assert failing(checks) == {"probe-line"}
    assert "no 'rdna1-kmgr: 1002:731f, quirks active:' line" in checks["probe-line"].detail


def test_unknown_quirks_cannot_pass_the_probe_line():
    checks = judge(passthrough_result(), quirks=None)
    assert failing(checks) == {"probe-line"} and "give --manifest" in checks["probe-line"].detail


def test_no_kfd_node_for_the_gpu_fails():
    result = passthrough_result()
    result["gpu"]["kfd_nodes"] = result["gpu"]["kfd_nodes"][:1]  # the CPU node only
    checks = judge(result)
    assert failing(checks) == {"kfd-node", "vram-heap"}
    assert checks["kfd-node"].detail == "no KFD topology node with vendor_id 4098 and device_id 29471 (1 node(s) seen)"


def test_a_public_vram_heap_fails_when_crat_mem_is_active():
    checks = judge(passthrough_result(heap_type=1))
    assert failing(checks) == {"vram-heap"}
    assert "crat-mem is active but VRAM bank(s) are: heap_type 1" in checks["vram-heap"].detail
    flagged = judge(passthrough_result(heap_type=2, flags=1))["vram-heap"]
    assert not flagged.ok and "flags 1" in flagged.detail


def test_a_public_vram_heap_is_fine_when_crat_mem_is_not_active():
    checks = judge(passthrough_result(quirks_said="coarse-mtype", heap_type=1), quirks=("coarse-mtype",))
    assert failing(checks) == set()
    assert "heap_type 1" in checks["vram-heap"].detail and "crat-mem not active" in checks["vram-heap"].detail


def test_a_conv2d_case_out_of_tolerance_fails_with_the_case():
    report = workload_report({"conv2d k=7 backward weight": 0.25})
    checks = judge(with_workload(passthrough_result(), report), workload="conv2d")
    assert failing(checks) == {"workload"}
    assert checks["workload"].detail == (
        "1 case(s) outside rtol 0.001 / atol 0.001, first: " "conv2d k=7 backward weight max_abs_err 0.25"
    )


def test_a_workload_that_could_not_run_is_a_failed_check_not_a_pass():
    error = {"error": "torch 2.13.0+cpu sees no GPU (torch.cuda.is_available() is False; HIP None)"}
    checks = judge(with_workload(passthrough_result(), error, rc=3), workload="conv2d")
    assert failing(checks) == {"workload"}
    assert checks["workload"].detail == f"the workload could not run: {error['error']}"
    crashed = with_workload(passthrough_result(), None, rc=-11, output="Segmentation fault")
    assert (
        judge(crashed, workload="conv2d")["workload"].detail
        == "the workload printed no report (exit -11): Segmentation fault"
    )
    missing = passthrough_result()  # asked for, never run (the guest stopped first)
    assert judge(missing, workload="conv2d")["workload"].detail == "the workload did not run"


def test_a_report_missing_cases_fails():
    report = workload_report()
    report["cases"] = [c for c in report["cases"] if c["case"] != "resnet18 forward"]
    check = judge(with_workload(passthrough_result(), report), workload="conv2d")["workload"]
    assert not check.ok and check.detail == "case(s) missing from the report: resnet18 forward"


def test_a_module_that_did_not_load_fails_every_gpu_check():
    result = passthrough_result()
    del result["gpu"]
    checks = judge(result, workload="conv2d")
    assert {"gpu-driver", "probe-line", "kfd-node", "vram-heap", "workload"} <= failing(checks)


def test_a_warning_while_the_gpu_is_driven_fails_the_kernel_log():
    result = passthrough_result()
    result["gpu"]["log"] = ["[   80.0] WARNING: CPU: 0 PID: 1 at drivers/gpu/drm/amd/amdgpu/amdgpu_vm.c:123"]
    assert failing(judge(result)) == {"kernel-log"}


def load_collect():
    spec = importlib.util.spec_from_file_location("collect", COLLECT)
    collect = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(collect)
    return collect


def test_the_guest_reads_kfd_topology_in_the_form_the_rules_judge(tmp_path):
    """collect.py on a KFD sysfs tree laid out as the kernel's (kfd_topology.c prints `name value` lines)."""
    nodes = tmp_path / "nodes"
    for node, props, bank in (
        ("0", "cpu_cores_count 1\nvendor_id 0\ndevice_id 0\n", "heap_type 0\nflags 0\n"),
        (
            "1",
            "cpu_cores_count 0\nsimd_count 72\nvendor_id 4098\ndevice_id 29471\n",
            "heap_type 2\nsize_in_bytes 6425673728\nflags 0\nwidth 192\n",
        ),
    ):
        (nodes / node / "mem_banks" / "0").mkdir(parents=True)
        (nodes / node / "properties").write_text(props)
        (nodes / node / "mem_banks" / "0" / "properties").write_text(bank)
    result = passthrough_result()
    result["gpu"]["kfd_nodes"] = load_collect().kfd_nodes(str(nodes))
    checks = judge(result)
    assert failing(checks) == set()
    assert checks["kfd-node"].detail.startswith("KFD node 1 (device_id 29471, 1 memory bank(s))")
    (nodes / "1" / "mem_banks" / "0" / "properties").write_text("heap_type 1\nsize_in_bytes 268435456\nflags 1\n")
    result["gpu"]["kfd_nodes"] = load_collect().kfd_nodes(str(nodes))
    assert failing(judge(result)) == {"vram-heap"}


# --- what the guest is asked, how vng is called -------------------------------------------------------------


def test_the_plan_carries_the_gpu_identity_quirks_and_workload(tmp_path):
    target = gpu_checks.GpuTarget(GPU, QUIRKS, "conv2d")
    view = guest_view.prepare(tmp_path, with_venv=True)
    plan = verdict.guest_plan(
        patched_module(), "/run/amdgpu.ko", gpu=target, workload=engine.workload_plan("conv2d", view)
    )
    assert plan["gpu"]["vendor_device"] == GPU and plan["gpu"]["quirks"] == list(QUIRKS)
    assert plan["gpu"]["on_load"] == "selftest"  # the load with every quirk on
    assert plan["gpu"]["workload"]["script"] == "/run/rdna1-kmgr/guest/conv2d.py"
    assert (tmp_path / "guest" / "conv2d.py").is_file()  # copied into the run folder the guest mounts
    # rdna1-kmgr's own venv first (torch would be there), mapped read-only where the guest sees it
    assert plan["gpu"]["workload"]["pythons"][0] == "/run/rdna1-kmgr-venv/bin/" + Path(sys.executable).name
    assert f"/run/rdna1-kmgr-venv={sys.prefix}" in virtme_guest.view_args(view)
    assert "gpu" not in verdict.guest_plan(patched_module(), "/run/amdgpu.ko")  # emulated: unchanged


def test_passed_devices_become_vng_arguments_before_the_guest_command(tmp_path):
    tools = virtme_guest.VirtmeNgGuest("/venv/bin/vng", "/usr/bin/qemu-system-x86_64")
    kernel = guest_kernel.GuestKernel(CANNED_KERNEL, tmp_path, "cache")
    view = guest_view.GuestView(tmp_path, "/usr/bin/python3")
    devices = ("0000:0a:00.0", "0000:0a:00.1")
    request = guest.GuestRequest(kernel, tmp_path, tmp_path / "console", "kvm", 5, devices, "cmd", view)
    argv = virtme_guest.vng_argv(tools, request)
    assert argv[-2:] == ["--exec", "cmd"]
    assert "--disable-microvm" in argv and "--qemu-opts=" + " ".join(qemu_args.vfio_devices(devices)) in argv
    assert argv.count("--force-9p") == 1  # 9p, as in every run
    # the cached kernel once, read-only at its own path, as in an emulated run
    assert [argv[i + 1] for i, arg in enumerate(argv) if arg == "--rodir"] == [f"{tmp_path}={tmp_path}"]


def test_a_passthrough_boot_keeps_udev_from_loading_the_distro_amdgpu(tmp_path, monkeypatch):
    seen = []

    def run(argv, *args, **kwargs):
        seen.append(argv)
        return engine.runner.Outcome(0, False, False, 0.1, 1)

    monkeypatch.setattr(virtme_guest.runner, "run_session", run)
    tools = virtme_guest.VirtmeNgGuest("/venv/bin/vng", "/usr/bin/qemu-system-x86_64")
    kernel = guest_kernel.GuestKernel(CANNED_KERNEL, tmp_path, "cache")
    for devices in ((), ("0000:0a:00.0",)):
        view = guest_view.GuestView(tmp_path, "/usr/bin/python3")
        request = guest.GuestRequest(kernel, tmp_path, tmp_path / "console", "tcg", 5, devices, "cmd", view)
        tools.boot(request)
    emulated, passed = (argv[argv.index("--append") + 1].split("=", 1)[1].split(",") for argv in seen)
    assert "amdgpu" not in emulated and "amdgpu" in passed


def make_record() -> verdict.Record:
    return verdict.Record(
        verdict="pass",
        reason="all checks passed",
        mode="passthrough",
        kernel=CANNED_KERNEL,
        module="/m/amdgpu.ko",
        module_sha256="3" * 64,
        accel="kvm",
        checks=[verdict.Check("load", True, "x")],
        selftest=None,
        console_log="/log",
        seconds=1.0,
        started="2026-01-01T00:00:00+00:00",
        tool_version="t",
        passthrough={"bdf": "0000:0a:00.0", "accepted_reset_risk": True},
    )


def session_with(returned: list[vfio.Returned]) -> passthrough.Session:
    session = passthrough.Session(run="r", bindings=[object()] * len(returned))
    session.returned = returned
    return session


def test_the_record_says_whether_the_devices_came_back(tmp_path, monkeypatch):
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path))
    good = vfio.Returned(
        "0000:0a:00.0",
        "amdgpu",
        "amdgpu",
        True,
        "0000:0a:00.0 came back on amdgpu as /dev/dri/card1, no errors logged since the bind",
    )
    record = passthrough.settle(make_record(), session_with([good]))
    stored = json.loads(Path(record.record).read_text())
    assert stored["verdict"] == "pass" and stored["mode"] == "passthrough"
    assert stored["passthrough"]["bdf"] == "0000:0a:00.0" and stored["passthrough"]["accepted_reset_risk"] is True
    assert stored["passthrough"]["came_back"] is True

    dead = replace(
        good, ok=False, detail="0000:0a:00.0 is bound to amdgpu but has no DRM card: the board needs a " "power cycle"
    )
    record = passthrough.settle(make_record(), session_with([dead]))
    stored = json.loads(Path(record.record).read_text())
    assert stored["verdict"] == "fail" and stored["passthrough"]["came_back"] is False
    assert stored["reason"].startswith("restored: 0000:0a:00.0 is bound to amdgpu but has no DRM card")


# --- the command: the order of the run, the exit code ----------------------------------------------------------


def test_vm_test_gpu_binds_validates_in_passthrough_mode_gives_back_and_exits_5_on_a_fail(tmp_path, monkeypatch):
    """The host side with every device operation stubbed: what is called, in which order, with what."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    from click.testing import CliRunner

    from rdna1_kmgr.cli import main

    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path / "state"))
    module = tmp_path / "amdgpu.ko"
    module.write_bytes(b"ko")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(
        json.dumps({"quirks": [{"id": "crat-mem", "bit": 1}, {"id": "coarse-mtype", "bit": 2}], "selftest_cases": 7})
    )
    board = SimpleNamespace(bdf="0000:0a:00.0", vendor=0x1002, device=0x731F)
    pre = passthrough.Preflight(
        plan=SimpleNamespace(target=board, passed=(board,), iommu_group=14),
        reset=(),
        accepted_reset_risk=True,
        forced=(),
        to_bind=(board,),
    )
    events = []
    monkeypatch.setattr(passthrough, "require_root", lambda: None)
    monkeypatch.setattr(passthrough, "resolve_gpu", lambda spec: board.bdf)
    monkeypatch.setattr(passthrough, "require_rdna1", lambda bdf, sysroot=None: None)  # the board is stubbed
    monkeypatch.setattr(passthrough, "preflight", lambda bdf, **kw: events.append(("preflight", bdf, kw)) or pre)
    monkeypatch.setattr(
        guest_kernel, "locate", lambda release, fetch=False: guest_kernel.GuestKernel(release, tmp_path, "host")
    )
    monkeypatch.setattr(passthrough.vfio, "current_driver", lambda bdf: "vfio-pci")
    outcome = {"ok": True}

    @contextmanager
    def bound(p):
        events.append(("bound",))
        session = passthrough.Session(run="r", bindings=[board])
        yield session
        events.append(("given back",))
        session.returned = [vfio.Returned(board.bdf, "amdgpu", "amdgpu", True, "came back on amdgpu")]

    def validate_module(path, release, **kw):
        # validate_module's mode follows from gpu: a passthrough run is one that names its GPU
        mode = "passthrough" if kw["gpu"] is not None else "emulated"
        events.append(("validate", mode, kw["devices"], kw["gpu"]))
        return verdict.Record(
            verdict="pass" if outcome["ok"] else "fail",
            reason="all checks passed" if outcome["ok"] else "vram-heap: heap_type 1",
            mode=mode,
            kernel=release,
            module=str(path),
            module_sha256="4" * 64,
            accel="kvm",
            checks=[verdict.Check("vram-heap", outcome["ok"], "heap_type 1")],
            selftest=None,
            console_log="/log",
            seconds=1.0,
            started="s",
            tool_version="t",
            passthrough=kw["passthrough"],
        )

    monkeypatch.setattr(passthrough, "bound", bound)
    monkeypatch.setattr(passthrough.engine, "validate_module", validate_module)
    args = [
        "vm-test",
        "gpu",
        board.bdf,
        "--module",
        str(module),
        "--manifest",
        str(manifest),
        "--kernel",
        CANNED_KERNEL,
        "--workload",
        "conv2d",
        "--accept-reset-risk",
        "--json",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert [e[0] for e in events] == ["preflight", "bound", "validate", "given back"]
    assert events[0][2]["accept_reset_risk"] is True and events[0][2]["plumbing_only"] is False
    _, mode, devices, gpu = events[2]
    assert mode == "passthrough" and devices == (board.bdf,)  # as data: the guest turns them into its options
    assert gpu == gpu_checks.GpuTarget("1002:731f", ("crat-mem", "coarse-mtype"), "conv2d")
    out = json.loads(result.stdout)
    assert out.pop("output_schema") == "rdna1-kmgr.vm-test.gpu/1"  # the envelope; the rest is the stored record
    assert out["mode"] == "passthrough" and out["passthrough"]["bdf"] == board.bdf
    assert out["passthrough"]["accepted_reset_risk"] is True and out["passthrough"]["came_back"] is True
    assert json.loads(Path(out["record"]).read_text()) == out

    outcome["ok"] = False
    events.clear()
    result = CliRunner().invoke(main, args[:-1])
    assert result.exit_code == 5
    assert "vm-test failed: vram-heap: heap_type 1" in result.stderr
    assert events[-1] == ("given back",)


# --- the workload script, really run on the CPU ----------------------------------------------------------------


def run_collect_workload(pythons: list[str], device: str) -> dict:
    """collect.py's own run_workload (the guest's code), on the real script."""
    return load_collect().run_workload(
        {"name": "conv2d", "script": str(CONV2D), "device": device, "pythons": pythons}, 300
    )


@pytest.mark.system  # a real CPU PyTorch
def test_conv2d_runs_on_the_cpu_against_the_cpu_and_passes(torch_python):
    python = torch_python
    workload = run_collect_workload([python], "cpu")
    report = workload["runs"][-1]["report"]
    assert [c["case"] for c in report["cases"]] == list(gpu_checks.WORKLOAD_CASES)
    assert report["tolerance"] == {"rtol": 1e-3, "atol": 1e-3, "dtype": "float32"}
    assert all(c["ok"] and c["max_abs_err"] <= 1e-3 for c in report["cases"])
    check = gpu_checks._workload(workload)
    assert check.ok and check.detail.startswith("16 cases within rtol 0.001 / atol 0.001")


@pytest.mark.system  # a real CPU PyTorch
def test_conv2d_without_a_gpu_reports_that_it_could_not_run(torch_python):
    python = torch_python
    if subprocess.run([python, "-c", "import sys, torch; sys.exit(torch.cuda.is_available())"]).returncode:
        pytest.skip("this torch sees a GPU: the no-GPU path cannot be shown here")
    # A Python without torch first (exit 3: try the next), then one whose torch has no GPU here.
    no_torch = subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True).returncode != 0
    pythons = (["/usr/bin/python3"] if no_torch else []) + [python]
    workload = run_collect_workload(pythons, "cuda")
    assert len(workload["runs"]) == len(pythons)
    if no_torch:
        assert workload["runs"][0]["report"]["error"].startswith("cannot import torch")
    check = gpu_checks._workload(workload)
    assert not check.ok and "the workload could not run: torch" in check.detail and "sees no GPU" in check.detail


def test_crat_mem_on_a_small_bar_board_is_said_to_have_done_nothing():
    # an RX 5600 XT's stock 256 MiB BAR before 6 GiB of VRAM: KFD reports FB_PRIVATE with or without the quirk
    small = judge(passthrough_result(bar0_bytes=256 << 20))["vram-heap"]
    assert small.ok and small.detail.startswith(
        "crat-mem did nothing: the BAR (256 MiB) is smaller than VRAM (6128 MiB)"
    )
    # a full BAR (resized by amdgpu): the FB_PRIVATE heap is the quirk's doing
    full = judge(passthrough_result(bar0_bytes=8 << 30))["vram-heap"]
    assert full.ok and "crat-mem took effect" in full.detail
