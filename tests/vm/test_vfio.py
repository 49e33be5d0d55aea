"""Passthrough host checks on fixture sysfs trees: fast, and each refusal one clear line that changes nothing.

The bind and the restore themselves only mean something on a real kernel's sysfs: they are proven in
test_passthrough_nested.py, inside a guest with an emulated IOMMU. Here: what is refused, what is allowed,
what a guest's report and the host's kernel log are judged to say.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rdna1_kmgr.cli import main
from rdna1_kmgr.core.errors import HostError, KmgrError, UsageError
from rdna1_kmgr.host import kmsg
from rdna1_kmgr.vm import (
    guest_kernel,
    passthrough,
    plumbing_guest,
    plumbing_run,
    qemu_args,
    reset_readiness,
    vfio,
    vfio_journal,
    virtme_guest,
)

sys.path.insert(0, str(Path(__file__).parents[1]))
from sysfs_fixtures import FakeSysroot, rx5600xt, rx5700xt  # noqa: E402

GPU, AUDIO = "0000:0a:00.0", "0000:0a:00.1"
EDU = "0000:00:09.0"


@pytest.fixture(autouse=True)
def private_state(tmp_path, monkeypatch):
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path / "state"))


def desktop(root: Path, reset_method: str | None = "device_specific", boot_vga: bool = False) -> FakeSysroot:
    """A host with IOMMU on, vfio-pci loaded, vendor-reset loaded, and an RX 5600 XT (with audio) in group 14
    that does not drive the display (a second GPU does, in its own group)."""
    tree = FakeSysroot(root).kernel("6.1.0-56-amd64").iommu().driver("vfio-pci").module("vendor_reset")
    tree.pci_device("0000:03:00.0", 0x10DE, 0x2484, 0x030000, driver="nouveau", boot_vga=True, iommu_group=5)
    tree.pci_device(
        GPU, 0x1002, 0x731F, 0x030000, driver="amdgpu", boot_vga=boot_vga, iommu_group=14, reset_method=reset_method
    )
    tree.pci_device(AUDIO, 0x1002, 0xAB38, 0x040300, driver="snd_hda_intel", iommu_group=14, reset_method="flr")
    tree.drm(GPU, "card1", "renderD129")
    return tree


def refusal(call) -> KmgrError:
    """Run a call that must refuse; the refusal is a KmgrError whose line is one line."""
    with pytest.raises(KmgrError) as info:
        call()
    line = info.value.line()
    assert "\n" not in line and line.strip() == line
    return info.value


def snapshot(root: Path) -> str:
    """Every path, link target and file content under root: equal snapshots mean nothing changed."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            digest.update(str(path.relative_to(root)).encode())
            if path.is_symlink():
                digest.update(os.readlink(path).encode())
            elif path.is_file():
                digest.update(path.read_bytes())
    return digest.hexdigest()


def preflight(root: Path, bdf: str = GPU, **kw):
    kw.setdefault("plumbing_only", False)
    return passthrough.preflight(bdf, sysroot=root, **kw)


# --- what passes --------------------------------------------------------------------------------------------


def test_a_ready_board_goes_with_its_audio_function(tmp_path):
    desktop(tmp_path)
    pre = preflight(tmp_path)
    assert [d.bdf for d in pre.plan.passed] == [GPU, AUDIO]
    assert [d.bdf for d in pre.to_bind] == [GPU, AUDIO]
    assert pre.plan.iommu_group == 14
    assert not pre.accepted_reset_risk and not pre.forced
    gpu_reset = next(r for r in pre.reset if r.bdf == GPU)
    assert gpu_reset.ready and gpu_reset.chip == "navi10" and gpu_reset.vendor_reset_loaded
    assert "device_specific" in gpu_reset.detail


def test_bridges_and_idle_devices_may_share_the_group(tmp_path):
    tree = desktop(tmp_path)
    tree.pci_device("0000:00:03.1", 0x1022, 0x1483, 0x060400, driver="pcieport", iommu_group=14)
    tree.pci_device("0000:09:00.0", 0x1002, 0x1478, 0x060400, iommu_group=14)
    tree.pci_device("0000:0b:00.0", 0x1B21, 0x1142, 0x0C0330, iommu_group=14)  # USB controller, no driver
    plan = vfio.plan_group(GPU, tmp_path)
    assert [d.bdf for d in plan.passed] == [GPU, AUDIO]
    assert dict(plan.left) == {
        "0000:00:03.1": "PCI bridge",
        "0000:09:00.0": "PCI bridge",
        "0000:0b:00.0": "not in use (driver none)",
    }


def test_a_device_already_on_vfio_pci_is_passed_but_not_rebound(tmp_path):
    tree = FakeSysroot(tmp_path).iommu().driver("vfio-pci")
    tree.pci_device(GPU, 0x1002, 0x731F, 0x030000, driver="vfio-pci", iommu_group=9, reset_method="device_specific bus")
    pre = preflight(tmp_path)
    assert [d.bdf for d in pre.plan.passed] == [GPU] and pre.to_bind == ()


def test_plumbing_only_on_a_harmless_device_skips_the_reset_check(tmp_path):
    # QEMU's edu device: no reset bug, and like edu in a guest here, no reset method at all.
    tree = FakeSysroot(tmp_path).iommu().driver("vfio-pci")
    tree.pci_device(EDU, 0x1234, 0x11E8, 0x00FF00, iommu_group=9)
    pre = preflight(tmp_path, EDU, plumbing_only=True)
    (reset,) = pre.reset
    assert reset.ready and not reset.has_reset_bug and not pre.accepted_reset_risk
    assert "no known reset bug" in reset.detail


# --- refusals: one line each, nothing changed --------------------------------------------------------------


def test_iommu_off_is_refused(tmp_path):
    rx5700xt(tmp_path)
    before = snapshot(tmp_path)
    err = refusal(lambda: preflight(tmp_path, "0000:03:00.0"))
    assert isinstance(err, HostError)
    assert err.what == "the IOMMU is off (0000:03:00.0 has no IOMMU group)"
    assert "intel_iommu=on" in err.hint and "amd_iommu=on" in err.hint
    assert snapshot(tmp_path) == before


def test_a_group_with_a_stranger_in_use_is_refused(tmp_path):
    tree = desktop(tmp_path)
    tree.pci_device("0000:0c:00.0", 0x8086, 0x15F3, 0x020000, driver="igc", iommu_group=14)
    before = snapshot(tmp_path)
    err = refusal(lambda: preflight(tmp_path))
    assert err.what.startswith(f"IOMMU group 14 of {GPU} also holds 0000:0c:00.0 (8086:15f3, driver igc)")
    assert "ACS" in err.hint
    assert snapshot(tmp_path) == before and not vfio_journal.pending()


def test_the_boot_vga_gpu_is_refused_unless_forced(tmp_path):
    desktop(tmp_path, boot_vga=True)
    before = snapshot(tmp_path)
    err = refusal(lambda: preflight(tmp_path))
    assert err.what == f"{GPU} drives this host's display: it is the boot VGA device (boot_vga=1)"
    assert "--force" in err.hint
    assert snapshot(tmp_path) == before
    pre = preflight(tmp_path, force=True)
    assert pre.forced == (f"{GPU}: it is the boot VGA device (boot_vga=1)",)


def test_a_gpu_whose_card_a_compositor_holds_is_refused(tmp_path):
    tree = desktop(tmp_path)
    tree.process(812, "gnome-shell", "/dev/null", "/dev/dri/card1").process(900, "bash", "/dev/pts/0")
    err = refusal(lambda: preflight(tmp_path))
    assert err.what == f"{GPU} drives this host's display: /dev/dri/card1 is open in gnome-shell (pid 812)"


@pytest.mark.parametrize(
    "methods, why",
    [
        (None, "no reset_method file (a kernel < 5.15, or no reset method at all), so nothing shows that vendor-reset"),
        ("flr bus", "would be reset by 'flr', not vendor-reset's device_specific"),
        ("bus", "would be reset by 'bus', not vendor-reset's device_specific"),
        ("bus device_specific", "device_specific is listed but not first"),
    ],
)
def test_a_navi10_board_without_vendor_reset_is_refused(tmp_path, methods, why):
    desktop(tmp_path, reset_method=methods)
    before = snapshot(tmp_path)
    err = refusal(lambda: preflight(tmp_path))
    assert err.what.startswith(f"{GPU} (navi10 1002:731f) has the AMD reset bug")
    assert why in err.what
    assert err.what.endswith("it may stay dead until the machine is powered off and on")
    assert "https://github.com/gnif/vendor-reset" in err.hint
    assert f"echo device_specific > /sys/bus/pci/devices/{GPU}/reset_method" in err.hint
    assert "--accept-reset-risk" in err.hint
    assert snapshot(tmp_path) == before


def test_accept_reset_risk_goes_on_and_says_so(tmp_path):
    desktop(tmp_path, reset_method="flr bus")
    pre = preflight(tmp_path, accept_reset_risk=True)
    assert pre.accepted_reset_risk
    assert not next(r for r in pre.reset if r.bdf == GPU).ready


def test_the_plumbing_check_does_not_hide_a_navi10_reset_risk(tmp_path):
    # `vm-test plumbing` with the GPU itself still resets the GPU after the VM.
    desktop(tmp_path, reset_method="bus")
    err = refusal(lambda: preflight(tmp_path, plumbing_only=True))
    assert "AMD reset bug" in err.what


def test_vega_boards_have_the_reset_bug_too():
    assert reset_readiness.reset_bug_chip(0x1002, 0x687F) == "vega10"
    assert reset_readiness.reset_bug_chip(0x1002, 0x66AF) == "vega20"
    assert reset_readiness.reset_bug_chip(0x1002, 0x7340) == "navi14"
    assert reset_readiness.reset_bug_chip(0x1002, 0x73BF) is None  # Navi21 (RDNA2) resets fine
    assert reset_readiness.reset_bug_chip(0x10DE, 0x731F) is None


def test_a_device_that_is_not_rdna1_needs_plumbing_only(tmp_path):
    tree = FakeSysroot(tmp_path).iommu().driver("vfio-pci")
    tree.pci_device(EDU, 0x1234, 0x11E8, 0x00FF00, iommu_group=9)
    err = refusal(lambda: preflight(tmp_path, EDU))
    assert isinstance(err, UsageError)
    assert err.what == f"{EDU} (1234:11e8) is not an RDNA1 GPU" and "vm-test plumbing BDF" in err.hint


def test_vfio_pci_missing_is_refused(tmp_path):
    tree = FakeSysroot(tmp_path).iommu()
    tree.pci_device(EDU, 0x1234, 0x11E8, 0x00FF00, iommu_group=9)
    err = refusal(lambda: preflight(tmp_path, EDU, plumbing_only=True))
    assert err.what == f"vfio-pci is not loaded in {tmp_path}" and "CONFIG_VFIO_PCI" in err.hint


def test_a_device_a_killed_run_left_on_vfio_is_refused_until_restored(tmp_path):
    tree = FakeSysroot(tmp_path).iommu().driver("vfio-pci")
    tree.pci_device(EDU, 0x1234, 0x11E8, 0x00FF00, driver="vfio-pci", iommu_group=9)
    vfio_journal.write(binding(EDU, pid=dead_pid()))
    err = refusal(lambda: preflight(tmp_path, EDU, plumbing_only=True))
    assert err.what.startswith(f"{EDU} was left on vfio-pci by an earlier run that did not finish")
    assert err.hint == "give it back first: rdna1-kmgr vm-test restore"


def test_no_such_device_and_bad_addresses_are_refused(tmp_path):
    FakeSysroot(tmp_path).iommu().driver("vfio-pci")
    assert refusal(lambda: preflight(tmp_path, "0000:42:00.0")).what.startswith("no PCI device 0000:42:00.0")
    err = refusal(lambda: passthrough.resolve_gpu("0000:0a:00.0; reboot"))
    assert isinstance(err, UsageError) and err.what.startswith("invalid PCI address")


def test_auto_picks_the_detected_board_or_refuses(tmp_path):
    rx5600xt(tmp_path / "a")
    assert passthrough.resolve_gpu("auto", tmp_path / "a") == GPU
    FakeSysroot(tmp_path / "b").kernel("6.1.0-56-amd64")
    err = refusal(lambda: passthrough.resolve_gpu("auto", tmp_path / "b"))
    assert err.what == "no 0x731F (RX 5600 XT) board found on this host"


# --- the guest's view -------------------------------------------------------------------------------------


def test_the_devices_sit_behind_a_root_port_function_for_function(tmp_path):
    desktop(tmp_path)
    pre = preflight(tmp_path)
    assert pre.devices == (GPU, AUDIO)
    assert qemu_args.vfio_devices(pre.devices) == [
        "-device",
        "pcie-root-port,id=rdna1-kmgr-rp,bus=pcie.0,chassis=81,addr=0x1c",
        "-device",
        f"vfio-pci,host={GPU},bus=rdna1-kmgr-rp,addr=0x0.0,multifunction=on",
        "-device",
        f"vfio-pci,host={AUDIO},bus=rdna1-kmgr-rp,addr=0x0.1",
    ]


def test_vng_gets_the_same_devices_on_q35_and_the_cached_kernel_shown(tmp_path):
    desktop(tmp_path)
    pre = preflight(tmp_path)
    cached = guest_kernel.GuestKernel("6.1.0-56-amd64", tmp_path / "cache/kernels/6.1.0-56-amd64", "cache")
    assert virtme_guest.passthrough_args(pre.devices) == [
        "--disable-microvm",
        "--qemu-opts=" + " ".join(qemu_args.vfio_devices(pre.devices)),
    ]
    assert virtme_guest.kernel_args(cached) == ["--rodir", f"{cached.root}={cached.root}"]
    installed = guest_kernel.GuestKernel("6.1.0-56-amd64", Path("/"), "host")
    assert virtme_guest.kernel_args(installed) == []


def guest_console(*pci_lines: str, done: bool = True) -> str:
    """What the plumbing guest prints, among kernel noise and with serial CRs."""
    lines = ["[    0.000000] Linux version 6.1.0-56-amd64", "rdna1-kmgr-guest kernel 6.1.0-56-amd64\r"]
    lines += [f"rdna1-kmgr-guest pci {line}\r" for line in pci_lines]
    lines += ["rdna1-kmgr-guest done\r"] if done else []
    return "\n".join(lines + ["[   71.5] reboot: Power down"])


PORT = "0000:00:1c.0 0x1b36 0x000c 0x060400 pci0000:00"


def test_guest_saw_is_the_device_behind_the_root_port(tmp_path):
    desktop(tmp_path)
    pre = preflight(tmp_path)
    guest = plumbing_guest.parse_console(
        guest_console(
            "0000:00:00.0 0x8086 0x29c0 0x060000 pci0000:00",
            PORT,
            "0000:01:00.0 0x1002 0x731f 0x030000 0000:00:1c.0",
            "0000:01:00.1 0x1002 0xab38 0x040300 0000:00:1c.0",
        )
    )
    assert guest["kernel"] == "6.1.0-56-amd64" and len(guest["devices"]) == 4
    assert plumbing_run._guest_counterparts(pre, guest) == {
        GPU: {"bdf": "0000:01:00.0", "id": "1002:731f"},
        AUDIO: {"bdf": "0000:01:00.1", "id": "1002:ab38"},
    }
    # The same id somewhere else in the guest is not the passed-through board.
    elsewhere = plumbing_guest.parse_console(guest_console(PORT, "0000:00:05.0 0x1002 0x731f 0x030000 pci0000:00"))
    assert plumbing_run._guest_counterparts(pre, elsewhere) == {}
    # A guest that never finished its list reports nothing.
    assert plumbing_guest.parse_console(guest_console(PORT, done=False)) is None


def test_the_plumbing_initramfs_holds_init_and_a_static_busybox(tmp_path):
    archive = plumbing_guest.build_initramfs(tmp_path / "initramfs.cpio")
    listing = subprocess.run(["cpio", "-t", "-v"], stdin=open(archive, "rb"), capture_output=True, text=True)
    if listing.returncode != 0 and "not found" in listing.stderr:
        pytest.skip("cpio is not installed")
    names = [line.split()[-1] for line in listing.stdout.splitlines()]
    assert names == ["bin", "bin/busybox", "init"]
    out = tmp_path / "x"
    out.mkdir()
    subprocess.run(["cpio", "-i", "-d"], stdin=open(archive, "rb"), cwd=out, check=True, capture_output=True)
    assert (out / "init").read_bytes() == plumbing_guest.init_script().read_bytes()
    assert os.access(out / "init", os.X_OK)
    assert "statically linked" in subprocess.run(["file", out / "bin/busybox"], capture_output=True, text=True).stdout


def test_the_plain_qemu_guest_gets_the_devices_as_data_and_reports_what_it_listed(tmp_path, monkeypatch):
    from rdna1_kmgr.vm import guest, guest_registry

    seen = []

    def run_session(argv, console, timeout, **kwargs):
        seen.append(argv)
        console.write_text(guest_console(PORT, "0000:01:00.0 0x1002 0x731f 0x030000 0000:00:1c.0"))
        return plumbing_guest.runner.Outcome(0, False, False, 0.1, 1)

    monkeypatch.setattr(plumbing_guest.runner, "run_session", run_session)
    monkeypatch.setattr(plumbing_guest, "build_initramfs", lambda dest: dest)
    kernel = guest_kernel.GuestKernel("6.1.0-56-amd64", tmp_path, "cache")
    request = guest.GuestRequest(kernel, tmp_path, tmp_path / "console", "kvm", 30, (GPU, AUDIO))
    run = plumbing_guest.PlainQemuGuest("/usr/bin/qemu-system-x86_64").boot(request)
    (argv,) = seen
    assert argv[argv.index("-machine") + 1] == "q35,accel=kvm" and argv[argv.index("-cpu") + 1] == "host,topoext=on"
    assert argv[-len(qemu_args.vfio_devices(request.devices)) :] == qemu_args.vfio_devices((GPU, AUDIO))
    assert run.result["kernel"] == "6.1.0-56-amd64" and run.result["devices"][1].bdf == "0000:01:00.0"
    with pytest.raises(ValueError, match="runs its own init"):
        plumbing_guest.PlainQemuGuest("qemu").boot(
            guest.GuestRequest(kernel, tmp_path, tmp_path / "c", "tcg", 1, command="true")
        )
    assert sorted(guest_registry.GUESTS) == ["host-root", "qemu", "virtme-ng"]
    with pytest.raises(ValueError, match="no guest 'vng'"):
        guest_registry.find("vng")


# --- after the run: did the board come back? ----------------------------------------------------------------


def binding(bdf=GPU, driver="amdgpu", pid=None, seq=1001, run="r1") -> vfio_journal.Binding:
    pid_, start, boot = vfio_journal.me()
    return vfio_journal.Binding(
        bdf=bdf,
        vendor=0x1002,
        device=0x731F,
        driver=driver,
        driver_override=None,
        iommu_group=14,
        run=run,
        pid=pid or pid_,
        pid_start=start if pid is None else 1,
        boot_id=boot,
        kmsg_seq=seq,
        started="2026-01-01T00:00:00+00:00",
    )


def test_a_board_back_on_amdgpu_with_its_card_came_back(tmp_path):
    desktop(tmp_path).kmsg(
        "vfio-pci 0000:0a:00.0: enabling device",
        "amdgpu: probe of 0000:0a:00.0 failed with error -22",
        "[drm] Initialized amdgpu 3.49.0 for 0000:0a:00.0 on minor 1",
    )
    # The failure is record 1001, the bind was after it (seq 1001): only what came later counts.
    ok, detail = passthrough.came_back(binding(seq=1001), tmp_path)
    assert ok and detail == f"{GPU} came back on amdgpu as /dev/dri/card1, no errors logged since the bind"


def test_a_probe_error_since_the_bind_means_a_power_cycle(tmp_path):
    desktop(tmp_path).kmsg(
        "vfio-pci 0000:0a:00.0: enabling device",
        "amdgpu 0000:0a:00.0: amdgpu: PSP load kdb failed!",
        "amdgpu 0000:0a:00.0: amdgpu: Fatal error during GPU init",
    )
    ok, detail = passthrough.came_back(binding(seq=1000), tmp_path)
    assert not ok
    assert "the kernel logged: amdgpu 0000:0a:00.0: amdgpu: PSP load kdb failed!" in detail
    assert detail.endswith("the board needs a power cycle: shut the machine down, switch it off at the wall, then boot")


def test_no_drm_card_or_no_driver_means_a_power_cycle(tmp_path):
    tree = FakeSysroot(tmp_path).iommu()
    tree.pci_device(GPU, 0x1002, 0x731F, 0x030000, driver="amdgpu", iommu_group=14)
    tree.kmsg("amdgpu: probe of 0000:0a:00.0 failed with error -110")
    ok, detail = passthrough.came_back(binding(seq=999), tmp_path)
    assert not ok and "has no DRM card (kernel: amdgpu: probe of 0000:0a:00.0 failed with error -110)" in detail
    tree2 = FakeSysroot(tmp_path / "b").iommu()
    tree2.pci_device(GPU, 0x1002, 0x731F, 0x030000, iommu_group=14)
    ok, detail = passthrough.came_back(binding(), tmp_path / "b")
    assert not ok and detail.startswith(f"{GPU} did not come back on amdgpu: the board needs a power cycle")


def test_a_board_back_on_amdgpu_that_does_not_work_is_not_given_back(monkeypatch):
    """give_back_all: the board is on amdgpu again, but came_back finds no DRM card: the entry fails with
    came_back's words, and says so under came_back (the keys `vm-test restore --json` and the records carry);
    the audio function back on its driver has no came_back."""
    dead = f"{GPU} is bound to amdgpu but has no DRM card: the board needs a power cycle"
    monkeypatch.setattr(passthrough, "came_back", lambda b: (False, dead))
    monkeypatch.setattr(
        passthrough.vfio,
        "give_back",
        lambda b: vfio.Returned(b.bdf, b.driver, b.driver, True, f"{b.bdf} is back on {b.driver}"),
    )
    monkeypatch.setattr(passthrough.engine, "say", lambda line: None)
    board, audio = binding(GPU), binding(AUDIO, driver="snd_hda_intel")
    for bound in (board, audio):
        vfio_journal.write(bound)
    returned = passthrough.give_back_all([board, audio])
    assert [r.to_json() for r in returned] == [
        {
            "bdf": GPU,
            "wanted": "amdgpu",
            "driver": "amdgpu",
            "ok": False,
            "detail": dead,
            "came_back": {"ok": False, "detail": dead},
        },
        {
            "bdf": AUDIO,
            "wanted": "snd_hda_intel",
            "driver": "snd_hda_intel",
            "ok": True,
            "detail": f"{AUDIO} is back on snd_hda_intel",
        },
    ]
    assert vfio_journal.pending() == []  # both back on their drivers: nothing for restore to retry


def test_kernel_log_records_and_continuations():
    text = "6,5,100,-;first\n SUBSYSTEM=pci\n DEVICE=+pci:0000:0a:00.0\n4,6,200,c;second; with semicolon\nnoise\n"
    # prio,seq,usec,flags;message (the kernel's Documentation/ABI/testing/dev-kmsg)
    assert kmsg.parse(text) == [kmsg.Record(5, "first", 100), kmsg.Record(6, "second; with semicolon", 200)]


def test_the_real_kernel_log_reads_with_increasing_numbers():
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    found = kmsg.records()
    assert found and all(a.seq < b.seq for a, b in zip(found, found[1:], strict=False))
    assert kmsg.since(found[-1].seq) == [] or kmsg.since(found[-1].seq)[0].seq > found[-1].seq


# --- the journal -------------------------------------------------------------------------------------------


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_journal_records_survive_and_name_their_owner(tmp_path):
    mine = binding(EDU)
    path = vfio_journal.write(mine)
    assert path == tmp_path / "state" / "vfio" / f"{EDU}.json"
    assert vfio_journal.pending() == [mine]
    assert vfio_journal.owner_alive(mine)
    gone = binding(GPU, pid=dead_pid())
    vfio_journal.write(gone)
    assert not vfio_journal.owner_alive(gone)
    vfio_journal.forget(EDU)
    assert vfio_journal.pending() == [gone]


def test_restore_stops_the_vm_a_killed_run_left_running():
    """The token in a leftover process's environment finds it; SIGTERM is enough for a well-behaved one."""
    env = dict(os.environ, **{vfio_journal.RUN_ENV: "feedface"})
    left = subprocess.Popen(["sleep", "300"], env=env)
    other = subprocess.Popen(["sleep", "300"])
    try:
        stopped = passthrough.stop_run_processes("feedface", grace=5)
        assert stopped == [(left.pid, "sleep")]
        assert left.wait(timeout=5) == -signal.SIGTERM
        assert other.poll() is None
    finally:
        for proc in (left, other):
            proc.kill()
            proc.wait()


def test_restore_with_nothing_journaled_does_nothing():
    assert passthrough.restore_pending() == ()


# --- the command line ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, code, line",
    [
        (["plumbing", "0000:0a:00.0;reboot"], 2, "invalid PCI address '0000:0a:00.0;reboot'"),
        (["plumbing", "0000:42:00.0"], 4, "no PCI device 0000:42:00.0 in /sys/bus/pci/devices"),
    ],
)
def test_bad_passthrough_invocations_are_one_line_and_change_nothing(tmp_path, args, code, line):
    result = CliRunner().invoke(main, ["vm-test", *args])
    assert result.exit_code == code, result.output
    (err,) = result.stderr.splitlines()
    assert err.startswith(f"rdna1-kmgr: error: {line}")
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    "args, gone",
    [
        (["--plumbing-only"], "--plumbing-only"),
        (["--restore", "--gpu", EDU], "--restore"),
        (["--gpu", EDU, "--plumbing-only"], "--gpu"),
        (["--force"], "--force"),
        (["restore", "--gpu", EDU], "--gpu"),
    ],
)
def test_the_old_passthrough_flags_are_gone_and_change_nothing(tmp_path, args, gone):
    """`vm-test plumbing BDF` and `vm-test restore` replaced them: click's usage error, exit 2."""
    result = CliRunner().invoke(main, ["vm-test", *args])
    assert result.exit_code == 2, result.output
    assert f"No such option '{gone}'" in result.stderr
    assert not (tmp_path / "state").exists()


def test_restore_with_nothing_left_says_so():
    result = CliRunner().invoke(main, ["vm-test", "restore", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {"output_schema": "rdna1-kmgr.vm-test.restore/1", "restored": []}
    result = CliRunner().invoke(main, ["vm-test", "restore"])
    assert result.exit_code == 0 and result.stdout == "no device left on vfio-pci by rdna1-kmgr\n"


@pytest.mark.parametrize(
    "field, value, why",
    [
        ("driver", "../../../../../tmp/rdna1-owned", "names the driver '../../../../../tmp/rdna1-owned'"),
        ("driver_override", "vfio-pci/../../x", "which is no driver's name"),
        ("bdf", "0000:0b:00.0", "not the one its file is named for"),
        ("iommu_group", "14; rm -rf /", "has no valid iommu group"),
    ],
)
def test_a_forged_vfio_record_is_refused_before_any_device_is_touched(tmp_path, field, value, why):
    """Issue 40, M3: restoring writes a record's driver and address into sysfs paths as root; a record a run
    did not write is refused in one line and nothing is given back."""
    record = binding(EDU).to_json()
    vfio_journal.write(binding(EDU))
    path = vfio_journal.path_of(EDU)
    path.write_text(json.dumps({**record, field: value}))
    with pytest.raises(vfio_journal.RecordRefused) as err:
        passthrough.restore_pending()
    assert why in err.value.line() and str(path) in err.value.line() and "\n" not in err.value.line()
    assert path.is_file()  # kept, for the owner to look at
