"""Shared by the vm-test tests: the canned guest results in data/ and the module facts they come from, the CLI run
as a subprocess, and real-boot fixtures (the Debian guest kernels unpacked into the persistent test cache, the
stand-in modules built for 6.1, one CLI run's environment).

A helper module, not a test module: test_engine, test_experiment, test_fresh_machine, test_passthrough_verdict and
test_quirk_selftest import from it. guest_kernel_61, guest_kernel_612 and fake_modules_61 are session fixtures
defined only here.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import fakeamdgpu
import pytest
from conftest import _using_test_cache, persistent_cache_root

from rdna1_kmgr.modbuild import module_elf
from rdna1_kmgr.vm import guest_kernel, verdict

DATA = Path(__file__).parent / "data"
CANNED_KERNEL = "6.1.0-56-amd64"
DEPENDS = (
    "ttm",
    "drm",
    "drm_display_helper",
    "drm_kms_helper",
    "drm_buddy",
    "i2c-algo-bit",
    "gpu-sched",
    "video",
    "drm_ttm_helper",
)


def canned(name: str) -> dict:
    return json.loads((DATA / f"result-{name}.json").read_text())


def stock_module(**changes) -> module_elf.ModuleFile:
    """The facts of the unpatched amdgpu.ko the canned stock result comes from."""
    facts = dict(
        path=Path("/tmp/rdna1-kmgr-vm-RUN/amdgpu.ko"),
        sha256="2" * 64,
        name="amdgpu",
        vermagic=f"{CANNED_KERNEL} SMP preempt mod_unload modversions ",
        depends=DEPENDS,
        parameters=("vramlimit", "debug_largebar"),
        build_id="eec37b5c70e650cc32ad77d9f54a69a2ff1c8ec6",
        srcversion=None,
        signed=False,
        texts=frozenset(verdict.INIT_MESSAGES),
    )
    facts.update(changes)
    return module_elf.ModuleFile(**facts)


def patched_module(**changes) -> module_elf.ModuleFile:
    return stock_module(parameters=("rdna1_quirks", "rdna1_selftest", "vramlimit"), **changes)


def patched_result(passed: int = 7, failed: int = 0) -> dict:
    """The stock run as the patched module gives it: the selftest line, and the parameters readable."""
    result = copy.deepcopy(canned("6.1-amdgpu-stock"))
    for step in result["steps"]:
        if step["name"] == "insmod selftest":
            step["argv"].append("rdna1_selftest=1")
            step["log"].insert(-1, f"[   63.655000] amdgpu: rdna1-kmgr selftest: {passed} passed, {failed} failed")
            step["after"]["parameters"] = {"rdna1_selftest": "Y", "rdna1_quirks": "3"}
        if step["name"] == "insmod stock":
            step["argv"].append("rdna1_quirks=0")
            step["after"]["parameters"] = {"rdna1_selftest": "N", "rdna1_quirks": "0"}
    return result


def dpkg_status(package: str) -> str:
    proc = subprocess.run(
        ["dpkg-query", "--show", "--showformat=${db:Status-Abbrev}", package], capture_output=True, text=True
    )
    return proc.stdout.strip() if proc.returncode == 0 else "unknown"


def rdna1_kmgr(args: list[str], env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    # the installed package under test, not whichever install /usr/local/bin/rdna1-kmgr points to
    script = str(Path(sys.executable).parent / "rdna1-kmgr")
    if not Path(script).is_file():
        script = shutil.which("rdna1-kmgr") or script
    return subprocess.run([script, *args], capture_output=True, text=True, env=env, timeout=timeout)


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain `text` (our run folder is in QEMU's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(cmdline)
    return found


def unpacked_guest_kernel(release: str) -> str:
    """The Debian kernel `release`, unpacked into the persistent test cache (fetched once)."""
    with _using_test_cache():
        guest_kernel.locate(release, fetch=True)
    return release


@pytest.fixture(scope="session")
def guest_kernel_61(headers_61) -> str:
    return unpacked_guest_kernel(headers_61)


@pytest.fixture(scope="session")
def guest_kernel_612(headers_612) -> str:
    return unpacked_guest_kernel(headers_612)


@pytest.fixture(scope="session")
def fake_modules_61(guest_kernel_61, tmp_path_factory) -> dict[str, Path]:
    workdir = tmp_path_factory.mktemp("fake-amdgpu")
    return {variant: fakeamdgpu.build(guest_kernel_61, variant, workdir) for variant in fakeamdgpu.VARIANTS}


@pytest.fixture
def vm_env(tmp_path) -> dict[str, str]:
    """Environment of one CLI run: its own state, logs and temporary folder; the shared kernel cache."""
    env = dict(os.environ)
    env.update(
        RDNA1_KMGR_STATE=str(tmp_path / "state"),
        RDNA1_KMGR_LOG=str(tmp_path / "log"),
        RDNA1_KMGR_CACHE=str(persistent_cache_root()),
        TMPDIR=str(tmp_path / "tmp"),
    )
    (tmp_path / "tmp").mkdir()
    return env


def assert_nothing_left_running(env: dict[str, str]) -> None:
    assert processes_mentioning(env["TMPDIR"]) == []
