"""vm-test: the verdict rules on canned guest results, the process-session runner, the guest kernel cache,
bad input on the command line; then real QEMU boots of real Debian kernels (marked `vm`).

The canned results in data/vm/ are what qemu/guest/collect.py wrote in real runs here: the unpatched
Debian 6.1 amdgpu (built out of tree against linux-headers-6.1.0-56-amd64) and a stand-in module whose
init WARNs. Rules are tested on them and on variations of them; the boots prove the whole path.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import fakeamdgpu
import pytest
from click.testing import CliRunner
from conftest import _using_test_cache
from vm_fixtures import (
    CANNED_KERNEL,
    assert_nothing_left_running,
    canned,
    dpkg_status,
    fake_modules_61,  # noqa: F401  (a session fixture)
    guest_kernel_61,  # noqa: F401  (a session fixture)
    guest_kernel_612,  # noqa: F401  (a session fixture, asked for by name)
    patched_module,
    patched_result,
    processes_mentioning,
    rdna1_kmgr,
    stock_module,
    vm_env,  # noqa: F401  (a fixture)
)

from rdna1_kmgr.cli import main
from rdna1_kmgr.core import progress
from rdna1_kmgr.core.errors import HostError, UsageError
from rdna1_kmgr.modbuild import module_elf
from rdna1_kmgr.vm import engine, guest, guest_kernel, guest_view, hostroot_guest, verdict, virtme_guest


def step(result: dict, name: str) -> dict:
    return next(s for s in result["steps"] if s["name"] == name)


def judge(result, module=None, required=None, problem=None) -> dict[str, verdict.Check]:
    checks = verdict.check_guest(result, module or patched_module(), CANNED_KERNEL, required, problem)
    return {c.name: c for c in checks}


def failing(checks: dict[str, verdict.Check]) -> set[str]:
    return {name for name, check in checks.items() if not check.ok}


# --- the verdict rules ----------------------------------------------------------------------------------------


def test_the_patched_module_passes_every_check():
    checks = judge(patched_result(), required=7)
    assert failing(checks) == set()
    assert checks["selftest"].detail.startswith("7 passed, 0 failed")
    assert "Virtual CRAT table created for CPU" in checks["init-messages"].detail
    assert verdict.decide(list(checks.values())) == ("pass", "all checks passed")
    assert verdict.selftest_counts(patched_result()) == {"passed": 7, "failed": 0}


def test_the_stock_module_loads_cleanly_but_is_not_an_rdna1_build():
    checks = judge(canned("6.1-amdgpu-stock"), module=stock_module())
    assert failing(checks) == {"selftest", "stock-reload"}
    assert "no rdna1_selftest parameter" in checks["selftest"].detail
    assert checks["taint"].ok and "module taint EO" in checks["taint"].detail


def test_a_failing_selftest_case_fails_the_verdict():
    result = patched_result(passed=6, failed=1)
    step(result, "insmod selftest")["log"].insert(
        -2, "[   63.654000] amdgpu: rdna1-kmgr selftest: crat-mem case 3 failed"
    )
    checks = judge(result)
    assert failing(checks) == {"selftest"}
    assert "6 passed, 1 failed" in checks["selftest"].detail
    assert "crat-mem case 3 failed" in checks["selftest"].detail
    outcome, reason = verdict.decide(list(checks.values()))
    assert outcome == "fail" and reason.startswith("selftest: 6 passed, 1 failed")


def test_a_selftest_that_switched_the_quirks_off_says_so_in_the_verdict():
    result = patched_result(passed=80, failed=7)
    load = step(result, "insmod selftest")
    load["log"] = [
        line.replace(
            "80 passed, 7 failed", "80 passed, 7 failed (first: crat-mem case 2): quirks forced " "off, rdna1_quirks=0"
        )
        for line in load["log"]
    ]
    load["after"]["parameters"]["rdna1_quirks"] = "0"
    checks = judge(result, required=87)
    assert failing(checks) == {"selftest"}
    assert checks["selftest"].detail == (
        "80 passed, 7 failed (needs >= 87 passed, 0 failed); first failure: "
        "crat-mem case 2; the module switched every quirk off (rdna1_quirks=0)"
    )


def test_the_selftest_must_run_at_least_the_cases_the_render_defines():
    assert judge(patched_result(passed=7), required=7)["selftest"].ok
    short = judge(patched_result(passed=7), required=9)["selftest"]
    assert not short.ok and "needs >= 9" in short.detail


def test_a_missing_selftest_line_fails():
    result = patched_result()
    log = step(result, "insmod selftest")["log"]
    log[:] = [line for line in log if "selftest:" not in line or "stage" in line]
    assert judge(result)["selftest"].detail == "no selftest summary line"


def test_a_warning_splat_fails_the_log_and_taint_checks():
    """Real run: the stand-in module WARNs at init; the kernel adds taint W (512)."""
    result = canned("6.1-fake-warns")
    module = patched_module(
        depends=(), build_id=None, srcversion=None, texts=frozenset({"[drm] amdgpu kernel modesetting enabled"})
    )
    checks = judge(result, module=module)
    assert {"kernel-log", "taint"} <= failing(checks)
    assert "WARNING: CPU: 0" in checks["kernel-log"].detail
    assert "not allowed: W" in checks["taint"].detail


def test_a_module_the_kernel_rejects_fails_with_the_kernel_reason():
    result = patched_result()
    load = step(result, "insmod selftest")
    load.update(rc=1, output="insmod: ERROR: could not insert module amdgpu.ko: Invalid module format\n")
    load["log"] = [
        "[   53.4] rdna1-kmgr: stage insmod selftest",
        "[   53.5] amdgpu: disagrees about version of symbol drm_dev_enter",
    ]
    load["after"] = {"loaded": False, "initstate": None, "tainted": 0}
    result["steps"] = [s for s in result["steps"] if s["name"] != "rmmod selftest"]
    checks = judge(result)
    assert "Invalid module format" in checks["load"].detail
    assert "disagrees about version of symbol drm_dev_enter" in checks["load"].detail
    assert {"load", "identity", "selftest", "init-messages", "taint", "unload"} <= failing(checks)


def test_dependencies_that_do_not_load_fail_with_modprobe_s_reason():
    result = patched_result()
    step(result, "depends").update(rc=1, output="modprobe: FATAL: Module drm_buddy not found in directory x\n")
    check = judge(result)["dependencies"]
    assert not check.ok and "Module drm_buddy not found" in check.detail


def test_the_loaded_module_must_be_the_file_under_test():
    checks = judge(patched_result(), module=patched_module(build_id="0" * 40))
    assert failing(checks) == {"identity"}
    assert "!= file's 0000" in checks["identity"].detail


def test_init_messages_are_required_only_when_the_module_can_print_them():
    result = patched_result()
    log = step(result, "insmod selftest")["log"]
    log[:] = [line for line in log if "modesetting enabled" not in line]
    assert not judge(result)["init-messages"].ok  # 6.1 prints it: its absence means init did not run
    # 6.12 dropped the [drm] line: a module without that text is judged on KFD's CRAT line alone.
    newer = patched_module(texts=frozenset({"Virtual CRAT table created for CPU"}))
    assert judge(result, module=newer)["init-messages"].ok


def test_taints_other_than_out_of_tree_and_unsigned_fail():
    result = patched_result()
    step(result, "insmod selftest")["after"].update(taint="POE", tainted=12288 | 1)
    check = judge(result)["taint"]
    assert not check.ok and "not allowed: P" in check.detail


def test_a_module_already_loaded_before_the_test_fails():
    result = patched_result()
    result["preloaded"] = True
    assert failing(judge(result)) == {"not-preloaded"}


def test_a_failed_unload_fails():
    result = patched_result()
    step(result, "rmmod stock").update(rc=1, output="rmmod: ERROR: Module amdgpu is in use\n")
    check = judge(result)["unload"]
    assert not check.ok and "in use" in check.detail


def test_loading_with_rdna1_quirks_0_must_take_effect():
    result = patched_result()
    step(result, "insmod stock")["after"]["parameters"]["rdna1_quirks"] = "3"
    check = judge(result)["stock-reload"]
    assert not check.ok and "reads '3'" in check.detail


def test_no_result_after_a_timeout_is_one_failing_check_with_the_reason():
    checks = judge(None, problem="timed out after 20 s and was killed; console tail: x")
    assert list(checks) == ["guest-run"]
    assert not checks["guest-run"].ok and checks["guest-run"].detail.startswith("timed out after 20 s")


def test_a_guest_that_stopped_midway_fails():
    result = patched_result()
    result["finished"] = False
    result["steps"] = result["steps"][:2]  # the dependencies and the first insmod, then nothing
    checks = judge(result)
    assert "insmod selftest" in checks["guest-run"].detail
    assert {"guest-run", "stock-reload", "unload"} <= failing(checks)


def test_a_module_built_for_another_kernel_fails_before_any_boot():
    checks = verdict.check_module_file(
        patched_module(), "6.12.95+deb12-amd64", "6.12.95+deb12-amd64 SMP preempt mod_unload modversions "
    )
    vermagic = next(c for c in checks if c.name == "vermagic")
    assert not vermagic.ok
    assert "built for 6.1.0-56-amd64" in vermagic.detail and "6.12.95+deb12-amd64" in vermagic.detail


# --- the record -------------------------------------------------------------------------------------------------


def make_record(sha: str, kernel: str = CANNED_KERNEL, outcome: str = "pass") -> verdict.Record:
    checks = [verdict.Check("load", outcome == "pass", "x")]
    return verdict.Record(
        verdict=outcome,
        reason="r",
        mode="emulated",
        kernel=kernel,
        module="/m/amdgpu.ko",
        module_sha256=sha,
        accel="tcg",
        checks=checks,
        selftest={"passed": 7, "failed": 0},
        console_log="/log",
        seconds=1.0,
        started="2026-01-01T00:00:00+00:00",
        tool_version="t",
    )


def test_the_record_is_stored_by_module_sha256_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path))
    module = tmp_path / "amdgpu.ko"
    shutil.copyfile(fakeamdgpu_prebuilt(tmp_path), module)
    sha = hashlib.sha256(module.read_bytes()).hexdigest()
    path = verdict.write(make_record(sha))
    assert path == tmp_path / "validations" / f"{sha}.json"
    assert sorted(p.name for p in path.parent.iterdir()) == [f"{sha}.json"]  # no temporary left
    back = verdict.read(sha)
    assert back.passed and back.checks[0] == verdict.Check("load", True, "x") and back.record == str(path)
    assert verdict.passing_record(module, CANNED_KERNEL) == back
    assert verdict.passing_record(module, "6.12.95+deb12-amd64") is None  # another kernel
    verdict.write(make_record(sha, outcome="fail"))
    assert verdict.passing_record(module, CANNED_KERNEL) is None  # the latest verdict counts


def test_records_written_before_one_record_shape_still_read(tmp_path):
    """An emulated record as the tool wrote it (same keys), and a plumbing-only file of the time its device facts
    sat at the top level: both read as a Record; the plumbing one as mode plumbing with its facts kept."""
    emulated = make_record("5" * 64).to_json()
    assert verdict.Record.from_json(json.loads(json.dumps(emulated))) == make_record("5" * 64)
    old_plumbing = {
        "verdict": "pass",
        "reason": "all checks passed",
        "mode": "passthrough",
        "plumbing_only": True,
        "device": "0000:00:03.0",
        "vendor_device": "1234:11e8",
        "guest_saw": "1234:11e8",
        "kernel": CANNED_KERNEL,
        "accel": "tcg",
        "iommu_group": 7,
        "group": {"passed": ["0000:00:03.0"]},
        "devices": [{"bdf": "0000:00:03.0", "before": None, "during": "vfio-pci", "after": None, "restored": True}],
        "checks": [{"name": "vfio-bind", "ok": True, "detail": "0000:00:03.0 on vfio-pci, /dev/vfio/7"}],
        "reset": [],
        "accepted_reset_risk": False,
        "forced": [],
        "console_log": "/var/log/rdna1-kmgr/vm-test/x.log",
        "vm_seconds": 71.5,
        "seconds": 80.2,
        "started": "2026-01-01T00:00:00+00:00",
        "tool_version": "0.9",
        "record": "/var/log/rdna1-kmgr/vm-test/x.json",
    }
    record = verdict.Record.from_json(old_plumbing)
    assert record.passed and record.mode == "plumbing" and record.module is None
    assert record.checks == (verdict.Check("vfio-bind", True, "0000:00:03.0 on vfio-pci, /dev/vfio/7"),)
    assert record.passthrough["bdf"] == "0000:00:03.0" and record.passthrough["guest_saw"] == "1234:11e8"
    assert record.passthrough["devices"][0]["during"] == "vfio-pci" and record.details == {"vm_seconds": 71.5}
    assert record.record == "/var/log/rdna1-kmgr/vm-test/x.json"
    # and it is written back in the one shape, which reads the same again
    assert verdict.Record.from_json(json.loads(json.dumps(record.to_json()))) == record


def fakeamdgpu_prebuilt(tmp_path: Path) -> Path:
    """Any real module file: the stand-in, built for the installed 6.1 headers (skips without them)."""
    release = installed_61_headers()
    return fakeamdgpu.build(release, "good", tmp_path)


def installed_61_headers() -> str:
    found = sorted(p.name for p in Path("/lib/modules").glob("6.1.*") if (p / "build").is_dir())
    if not found:
        pytest.skip("no 6.1 kernel headers installed (/lib/modules/6.1.*/build)")
    return found[-1]


# --- module files --------------------------------------------------------------------------------------------


def test_module_facts_come_from_the_elf_file(tmp_path):
    ko = fakeamdgpu_prebuilt(tmp_path)
    facts = module_elf.read(ko, verdict.INIT_MESSAGES)
    assert facts.name == "amdgpu" and facts.release == installed_61_headers()
    assert facts.depends == () and set(facts.parameters) == {"rdna1_selftest", "rdna1_quirks"}
    assert facts.texts == {"[drm] amdgpu kernel modesetting enabled"}
    readelf = subprocess.run(["readelf", "-n", str(ko)], capture_output=True, text=True).stdout
    assert f"Build ID: {facts.build_id}" in readelf
    assert facts.sha256 == hashlib.sha256(ko.read_bytes()).hexdigest()


@pytest.mark.parametrize("name,content", [("notes.txt", b"x"), ("amdgpu.ko", b""), ("amdgpu.ko", b"not an elf" * 10)])
def test_a_file_that_is_not_a_module_is_refused(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(UsageError):
        module_elf.read(path)


# --- console stages, the guest command line ---------------------------------------------------------------------


def test_stages_are_reported_once_each_even_when_lines_arrive_in_pieces():
    watcher = guest.StageWatcher(virtme_guest.STAGES, clock=iter([0.0] + [1.0] * 20).__next__)
    console = (
        "Probing EDD... ok\r\n[    0.000000] Linux version 6.1.0-56-amd64 (debian)\r\n"
        "[ 5.1] virtme initramfs: mounting hostfs...\r\n[ 9.0] virtme-ng-init: basic initialization done\r\n"
        "[ 9.5] rdna1-kmgr: stage insmod selftest\r\n[ 9.6] Linux version 6.1.0-56-amd64 again\r\n"
        "[ 9.7] reboot: Power down\r\n"
    )
    said = io.StringIO()
    with progress.reporting_to(said):
        for start in range(0, len(console), 7):
            watcher.feed(console[start : start + 7])
    stages = ["kernel started", "initramfs mounts the host's root", "guest init done", "insmod selftest"]
    stages.append("guest powered off")
    assert [stage for _, stage in watcher.stages] == stages
    assert said.getvalue().splitlines() == [f"vm-test:   1.0 s  {stage}" for stage in stages]


def test_the_guest_command_uses_guest_paths_and_tcg_disables_kvm(tmp_path):
    rundir = tmp_path / "run"
    rundir.mkdir()
    kernel = guest_kernel.GuestKernel(CANNED_KERNEL, tmp_path / "kernels" / CANNED_KERNEL, "cache")
    view = guest_view.prepare(rundir)
    command = engine.guest_command(view)
    assert command.split()[1:] == ["-I", "-S", "/run/rdna1-kmgr/guest/collect.py", "/run/rdna1-kmgr"]
    assert (rundir / "guest" / "collect.py").is_file()  # the guest side travels in the run folder
    tools = virtme_guest.VirtmeNgGuest("/venv/bin/vng", "/usr/bin/qemu-system-x86_64")

    def argv(accel: str) -> list[str]:
        request = guest.GuestRequest(kernel, rundir, rundir / "console", accel, 5, command=command, view=view)
        return virtme_guest.vng_argv(tools, request)

    tcg, kvm = argv("tcg"), argv("kvm")
    assert "--disable-kvm" in tcg and "--disable-kvm" not in kvm
    assert tcg[tcg.index("--rwdir") + 1] == f"/run/rdna1-kmgr={rundir}" and tcg[-2:] == ["--exec", command]
    # the unpacked kernel, read-only at its own path: where virtme's /lib/modules/KREL link points
    assert f"{kernel.root}={kernel.root}" in tcg and tcg[tcg.index(f"{kernel.root}={kernel.root}") - 1] == "--rodir"
    assert tools.env()["PATH"].startswith("/venv/bin" + os.pathsep)


def test_the_guest_python_is_the_systems_or_its_installation_is_mapped(tmp_path):
    # a venv of the system's Python (install.sh, pipx): the real binary under /usr, nothing to map
    python, mapping = guest_view.interpreter("/usr/bin/python3", "/usr")
    assert python == os.path.realpath("/usr/bin/python3") and mapping is None
    # a Python installed elsewhere (pyenv, uv, a tarball under /opt or a home folder) is mapped read-only
    home = tmp_path / "pyenv" / "3.11.7"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "python3.11").write_text("")
    python, mapping = guest_view.interpreter(str(home / "bin" / "python3.11"), str(home))
    assert python == "/run/rdna1-kmgr-python/bin/python3.11"
    assert virtme_guest.mapping_args(mapping) == ["--rodir", f"/run/rdna1-kmgr-python={home}"]


def test_a_path_virtme_cannot_map_is_refused_with_what_to_do(tmp_path):
    odd = tmp_path / "a b,c"
    with pytest.raises(HostError, match="virtme-ng cannot show"):
        virtme_guest.mapping_args(guest_view.Mapping(guest_view.GUEST_RUN, odd, writable=True))


# --- the guest kernel -----------------------------------------------------------------------------------------


def fake_kernel_tree(root: Path, release: str) -> Path:
    (root / "boot").mkdir(parents=True)
    (root / "boot" / f"vmlinuz-{release}").write_bytes(b"kernel")
    (root / "lib" / "modules" / release / "kernel").mkdir(parents=True)
    (root / "lib" / "modules" / release / "modules.dep").write_text("")
    # what fetch_image writes into a cache entry it trimmed (harmless in a host's root)
    (root / guest_kernel.KEPT_FOR).write_text(guest_kernel._kept_for())
    return root


def test_a_kernel_neither_installed_nor_cached_needs_yes(tmp_path, monkeypatch):
    monkeypatch.setenv("RDNA1_KMGR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(guest_kernel, "HOST_ROOT", tmp_path / "host")
    # A host with only the headers of that kernel cannot boot it.
    (tmp_path / "host" / "lib" / "modules" / "6.1.0-99-amd64" / "build").mkdir(parents=True)
    with pytest.raises(HostError) as info:
        guest_kernel.locate("6.1.0-99-amd64")
    assert "run again with --yes to download linux-image-6.1.0-99-amd64" in info.value.line()
    assert not (tmp_path / "cache").exists()  # nothing fetched, nothing created


def test_a_cached_kernel_trimmed_for_other_guest_modules_is_not_used(tmp_path, monkeypatch):
    """An entry an earlier release of the tool trimmed (no overlay module: every guest boot waited 10 s for
    it) is fetched again rather than booted."""
    monkeypatch.setenv("RDNA1_KMGR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(guest_kernel, "HOST_ROOT", tmp_path / "host")
    entry = fake_kernel_tree(tmp_path / "cache" / "kernels" / "6.1.0-99-amd64", "6.1.0-99-amd64")
    kept = (entry / guest_kernel.KEPT_FOR).read_text()
    (entry / guest_kernel.KEPT_FOR).write_text(kept.replace("overlay\n", ""))
    with pytest.raises(HostError, match="neither installed on this host nor in the cache"):
        guest_kernel.locate("6.1.0-99-amd64")
    (entry / guest_kernel.KEPT_FOR).unlink()
    with pytest.raises(HostError, match="neither installed on this host nor in the cache"):
        guest_kernel.locate("6.1.0-99-amd64")


def test_a_cached_kernel_tree_is_used_and_a_host_kernel_preferred(tmp_path, monkeypatch):
    monkeypatch.setenv("RDNA1_KMGR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(guest_kernel, "HOST_ROOT", tmp_path / "host")
    fake_kernel_tree(tmp_path / "cache" / "kernels" / "6.1.0-99-amd64", "6.1.0-99-amd64")
    found = guest_kernel.locate("6.1.0-99-amd64")
    assert found.origin == "cache" and found.image.read_bytes() == b"kernel"
    fake_kernel_tree(tmp_path / "host", "6.1.0-99-amd64")
    assert guest_kernel.locate("6.1.0-99-amd64").origin == "host"


@pytest.mark.realbuild  # the built module names the dependencies a guest loads
def test_fetching_a_kernel_unpacks_its_image_package_into_the_cache(
    tmp_path, monkeypatch, headers_61, persistent_cache, built_module_61
):
    """Real: the .deb from Debian's archive (shared test cache), dpkg-deb -x and depmod into a fresh entry."""
    monkeypatch.setattr(guest_kernel, "HOST_ROOT", tmp_path / "host")  # as if not installed here
    monkeypatch.setattr(guest_kernel, "cached_root", lambda release: tmp_path / "kernels" / release)
    package = f"linux-image-{headers_61}"
    before = dpkg_status(package)
    kernel = guest_kernel.locate(headers_61, fetch=True)
    assert kernel.origin == "cache" and kernel.root == tmp_path / "kernels" / headers_61
    assert kernel.image.is_file() and kernel.image.stat().st_size > 1_000_000
    assert "kernel/drivers/gpu/drm/drm.ko" in (kernel.modules / "modules.dep").read_text()
    assert kernel.vermagic().startswith(headers_61 + " ")
    assert [p.name for p in (tmp_path / "kernels").iterdir() if not p.name.startswith(".")] == [headers_61]
    assert dpkg_status(package) == before  # unpacked, never installed
    assert guest_kernel.locate(headers_61) == kernel  # found again without fetching
    # Issue 27: what a guest loads stays, nothing else, and the .deb goes once unpacked. amdgpu's dependencies
    # as the built module's own modinfo names them (the guest loads that file by path: the stock amdgpu.ko is
    # not kept); virtme-ng's initramfs modules as virtme-ng itself lists them.
    from virtme import virtmods

    kept = {p.name.split(".ko")[0].replace("-", "_") for p in kernel.modules.rglob("*.ko*")}
    assert "amdgpu" not in kept
    module = built_module_61["module"]
    depends = subprocess.run(["modinfo", "-F", "depends", module], capture_output=True, text=True).stdout
    assert {"drm", "ttm"} <= {d.replace("-", "_") for d in depends.strip().split(",")} <= kept
    for alias in virtmods.MODALIASES:
        shown = subprocess.run(
            ["modprobe", "-d", str(kernel.root), "-S", headers_61, "--show-depends", alias], capture_output=True
        )
        assert shown.returncode == 0, (alias, shown.stderr)
    assert len(kept) < 100  # of the ~4000 modules Debian's image package holds
    empty = [folder for folder, dirs, names in os.walk(kernel.modules / "kernel") if not dirs and not names]
    assert empty == []  # nor the folders the others leave
    assert [p.name for p in (kernel.root / "boot").iterdir()] == [kernel.image.name]
    assert not (kernel.root / "usr" / "share").exists()
    assert not list((persistent_cache / "debs").glob(f"{package}_*.deb"))


def test_an_invalid_kernel_release_is_refused():
    with pytest.raises(UsageError):
        guest_kernel.locate("../../etc")


# --- the command line: bad input -----------------------------------------------------------------------------


@pytest.fixture
def isolated_state(tmp_path, monkeypatch):
    for env, sub in (("RDNA1_KMGR_STATE", "state"), ("RDNA1_KMGR_LOG", "log"), ("RDNA1_KMGR_CACHE", "cache")):
        monkeypatch.setenv(env, str(tmp_path / sub))
    monkeypatch.setenv("RDNA1_KMGR_DKMS_TREE", str(tmp_path / "dkms"))
    monkeypatch.setenv("RDNA1_KMGR_DKMS_SOURCE_TREE", str(tmp_path / "src"))
    (tmp_path / "dkms").mkdir()
    (tmp_path / "src").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    "args,code,message",
    [
        (["--module", "/nonexistent/amdgpu.ko"], 2, "is not a kernel module file"),
        (["--module", "/etc/hostname"], 2, "is not a kernel module file"),
        (["--kernel", "../../etc", "--module", "/x.ko"], 2, "invalid kernel release"),
        (["--timeout", "0", "--module", "/x.ko"], 2, "invalid --timeout"),
        (["gpu", "03:00"], 2, "invalid PCI address"),
        (["--manifest", "/x.json"], 2, "--manifest goes with --module"),
        (["--accel", "hvf"], 2, "hvf"),
        (["--kernel", "6.1.0-99-amd64"], 2, "no rdna1-amdgpu build for kernel 6.1.0-99-amd64"),
    ],
)
def test_bad_input_is_one_line_a_usage_exit_and_changes_nothing(isolated_state, args, code, message):
    result = CliRunner().invoke(main, ["vm-test", *args])
    assert result.exit_code == code, result.output
    assert message in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 or args[0] == "--accel"  # click's own usage text for a bad choice
    assert sorted(p.name for p in isolated_state.iterdir()) == ["dkms", "src"]


def test_passthrough_without_an_rdna1_gpu_is_refused_clearly(isolated_state):
    from rdna1_kmgr.host.host_facts import detect

    if detect().rdna1_devices:
        pytest.skip("this host has an RDNA1 GPU: passthrough tests are in test_vfio")
    result = CliRunner().invoke(main, ["vm-test", "gpu", "auto"])
    assert result.exit_code == 4
    assert "no 0x731F (RX 5600 XT) board found on this host" in result.stderr


# --- real boots ------------------------------------------------------------------------------------------------


@pytest.mark.vm
def test_emulated_verdict_passes_and_is_recorded(fake_modules_61, guest_kernel_61, vm_env):
    module = fake_modules_61["good"]
    proc = rdna1_kmgr(["vm-test", "--module", str(module), "--json"], vm_env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out.pop("output_schema") == "rdna1-kmgr.vm-test/1"  # the envelope; the rest is the stored record
    assert out["verdict"] == "pass" and out["mode"] == "emulated" and out["kernel"] == guest_kernel_61
    assert out["module_sha256"] == hashlib.sha256(module.read_bytes()).hexdigest()
    assert out["selftest"] == {"passed": 7, "failed": 0, "required": 1}
    assert {c["name"] for c in out["checks"]} >= {
        "vermagic",
        "load",
        "identity",
        "selftest",
        "init-messages",
        "kernel-log",
        "taint",
        "stock-reload",
        "unload",
    }
    record = Path(out["record"])
    assert record == Path(vm_env["RDNA1_KMGR_STATE"]) / "validations" / f"{out['module_sha256']}.json"
    assert json.loads(record.read_text()) == out
    console = Path(out["console_log"]).read_text()
    assert "rdna1-kmgr: stage rmmod stock" in console and "Linux version " + guest_kernel_61 in console
    assert "kernel started" in proc.stderr and "the host's root mounted" in proc.stderr  # progress by boot stage
    # the host-root guest: its init mounted the host's root and ran the command with no init system before it
    assert "rdna1-kmgr-guest: the host's root is mounted" in console and "udev" not in console
    assert "rdna1-kmgr-guest: the command ended with exit code 0" in console
    assert_nothing_left_running(vm_env)


def read_newc(archive: Path) -> dict[str, bytes]:
    """The files of an uncompressed newc cpio archive (the format the kernel unpacks: 6-byte magic, 13 fields of 8
    hex digits, the name, then the data, each padded to 4 bytes)."""
    data, files, at = archive.read_bytes(), {}, 0
    while True:
        assert data[at : at + 6] == b"070701"
        fields = [int(data[at + 6 + 8 * i : at + 14 + 8 * i], 16) for i in range(13)]
        size, name_size = fields[6], fields[11]
        name = data[at + 110 : at + 110 + name_size - 1].decode()
        start = at + 110 + name_size
        start += -start % 4
        if name == "TRAILER!!!":
            return files
        files[name] = data[start : start + size]
        at = start + size + (-size % 4)


@pytest.mark.vm
def test_the_host_root_initramfs_loads_each_module_after_what_it_needs(guest_kernel_61, tmp_path):
    """Checked against each module's own modinfo, not modprobe's order the code takes."""
    with _using_test_cache():
        kernel = guest_kernel.locate(guest_kernel_61)
    archive = hostroot_guest.build_initramfs(tmp_path / "initramfs.cpio", kernel, [], "true")
    files = read_newc(archive)
    order = files["modules/order"].decode().split()
    assert {"9p.ko", "9pnet_virtio.ko", "virtio_pci.ko"} <= set(order)
    loaded = set()
    for name in order:
        (tmp_path / name).write_bytes(files[f"modules/{name}"])
        depends = subprocess.run(["modinfo", "-F", "depends", tmp_path / name], capture_output=True, text=True)
        needs = {d.replace("-", "_") for d in depends.stdout.strip().split(",") if d}
        assert needs <= loaded, (name, needs - loaded)
        loaded.add(name.removesuffix(".ko").replace("-", "_"))
    assert files["command"] == b"true\n" and files["init"] == hostroot_guest.init_script().read_bytes()


@pytest.mark.vm
@pytest.mark.parametrize(
    "variant,reason",
    [
        ("selftest-fails", "selftest: 6 passed, 1 failed"),
        ("warns", "kernel-log: "),
    ],
)
def test_a_broken_module_fails_with_its_reason(fake_modules_61, vm_env, variant, reason):
    proc = rdna1_kmgr(["vm-test", "--module", str(fake_modules_61[variant]), "--accel", "tcg"], vm_env)
    assert proc.returncode == 5
    assert f"rdna1-kmgr: error: vm-test failed: {reason}" in proc.stderr
    if variant == "warns":
        assert "WARNING: CPU: " in proc.stderr  # the first bad line is quoted
    records = list((Path(vm_env["RDNA1_KMGR_STATE"]) / "validations").glob("*.json"))
    assert len(records) == 1 and json.loads(records[0].read_text())["verdict"] == "fail"
    assert_nothing_left_running(vm_env)


@pytest.mark.vm
def test_the_accel_probe_tells_a_kernel_that_boots_from_one_that_hangs(guest_kernel_61, tmp_path):
    """The probe's two answers, on the real kernel under TCG (KVM itself may not work on the test host)."""
    with _using_test_cache():
        kernel = guest_kernel.locate(guest_kernel_61)
    qemu = virtme_guest.find().qemu
    works, why = engine.kernel_init_completes(kernel, qemu, tmp_path, "tcg", "max", timeout=120)
    assert works, why
    # Half a second is far too little for TCG to get through init: the probe gives up and says so.
    works, why = engine.kernel_init_completes(kernel, qemu, tmp_path, "tcg", "max", timeout=0.5)
    assert not works and "no progress within" in why
    assert [c for c in processes_mentioning(str(kernel.image)) if "panic=-1 loglevel=4" in c] == []


@pytest.mark.vm
def test_kvm_that_does_not_work_ends_as_a_failure_with_no_qemu_left(fake_modules_61, vm_env):
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        pytest.skip("no usable /dev/kvm: --accel kvm is refused before any boot (see the bad-input tests)")
    proc = rdna1_kmgr(
        ["vm-test", "--module", str(fake_modules_61["good"]), "--accel", "kvm", "--timeout", "20", "--json"], vm_env
    )
    out = json.loads(proc.stdout)
    if out["verdict"] == "pass":
        pytest.skip("KVM works on this host: nothing to end")
    assert proc.returncode == 5 and out["accel"] == "kvm"
    assert out["reason"].startswith("guest-run: ")
    assert_nothing_left_running(vm_env)


@pytest.mark.vm
def test_the_hard_timeout_kills_qemu_and_fails_with_the_console_tail(fake_modules_61, vm_env):
    # 2 s: under TCG the kernel is still booting (the host-root guest's whole run with this stand-in module takes
    # ~10 s here; 8 s, enough for virtme-ng's init never to finish, is no longer too short)
    proc = rdna1_kmgr(
        ["vm-test", "--module", str(fake_modules_61["good"]), "--accel", "tcg", "--timeout", "2", "--json"], vm_env
    )
    out = json.loads(proc.stdout)
    assert proc.returncode == 5 and out["verdict"] == "fail"
    assert out["reason"].startswith("guest-run: timed out after 2 s and was killed; console tail: ")
    assert_nothing_left_running(vm_env)


@pytest.mark.vm
@pytest.mark.realbuild
@pytest.mark.parametrize("series", ["61", "612"])
def test_the_real_amdgpu_module_passes_every_check(request, series, vm_env):
    """`build`'s module, patched with every quirk, in an emulated VM of its own Debian kernel."""
    built = request.getfixturevalue(f"built_module_{series}")
    request.getfixturevalue(f"guest_kernel_{series}")
    proc = rdna1_kmgr(["vm-test", "--kernel", built["kernel"], "--json"], vm_env)
    assert proc.stdout, proc.stderr
    out = json.loads(proc.stdout)
    assert proc.returncode == 0, out.get("reason")
    assert out["module_sha256"] == built["sha256"] and out["module"] == built["module"]
    assert out["selftest"]["failed"] == 0 and out["selftest"]["passed"] >= out["selftest"]["required"] > 1
    assert all(check["ok"] for check in out["checks"])
    assert_nothing_left_running(vm_env)


@pytest.mark.vm
def test_a_module_built_for_another_kernel_fails_without_booting(fake_modules_61, headers_612, vm_env):
    """The 6.12 image is fetched into the cache with --yes; the 6.1 module's vermagic does not fit it."""
    proc = rdna1_kmgr(
        ["vm-test", "--module", str(fake_modules_61["good"]), "--kernel", headers_612, "--yes", "--json"], vm_env
    )
    out = json.loads(proc.stdout)
    assert proc.returncode == 5 and out["console_log"] is None and out["accel"] is None
    assert out["reason"].startswith("vermagic: ")
    assert f"built for {fake_modules_61['good'].parent.name.split('-good-')[1]}" in out["reason"]
    assert out["details"]["kernel_origin"] in ("host", "cache")  # installed here, or fetched by --yes
