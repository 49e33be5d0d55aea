"""vm-test on a machine like a newcomer's: the kernel's image package not installed, rdna1-kmgr installed
wherever its user put it (a venv under /var/cache or /tmp). Both are places the guest does not see unless
they are mapped into it (rdna1_kmgr/vm/guest_view.py), so these boots prove the mappings.

Nothing here installs a linux-image package: vm-test fetches the image into its cache with --yes and
unpacks it there.
"""

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import TEST_CACHE_ENV
from vm_fixtures import (  # noqa: F401
    assert_nothing_left_running,
    dpkg_status,
    fake_modules_61,
    guest_kernel_61,
    rdna1_kmgr,
    vm_env,
)

REPO = Path(__file__).resolve().parents[2]


def image_installed(release: str) -> bool:
    return dpkg_status(f"linux-image-{release}").startswith("ii")


@pytest.mark.vm
@pytest.mark.realbuild
def test_vm_test_yes_passes_for_a_kernel_whose_image_is_not_installed(request, vm_env):
    """`build`'s real module (the suite's shared build) and `vm-test --yes`, with linux-image-KREL absent:
    the image is fetched into the cache (under /var/cache, which the guest does not see) and booted with
    its own modules. When a series' image is installed here, the other series is used."""
    seen = []
    for series in ("61", "612"):
        release = request.getfixturevalue(f"headers_{series}")
        if not image_installed(release):
            break
        seen.append(f"linux-image-{release} is installed on this machine")
    else:
        pytest.skip("; ".join(seen) + ": this test needs a kernel whose image package is not installed")
    if not Path(vm_env["RDNA1_KMGR_CACHE"]).is_relative_to("/var/cache"):
        pytest.skip(
            f"the test cache {vm_env['RDNA1_KMGR_CACHE']} ({TEST_CACHE_ENV}) is not under /var/cache: the guest sees"
            " it without a mapping, so this boot would prove none"
        )
    built = request.getfixturevalue(f"built_module_{series}")
    proc = rdna1_kmgr(["vm-test", "--kernel", release, "--yes", "--json"], vm_env)
    out = json.loads(proc.stdout)
    assert proc.returncode == 0, f"{out.get('reason')} (console {out.get('console_log')})"
    assert out["verdict"] == "pass" and out["details"]["kernel_origin"] == "cache"
    assert out["module_sha256"] == built["sha256"]
    assert all(check["ok"] for check in out["checks"])
    assert out["selftest"]["failed"] == 0 and out["selftest"]["passed"] >= out["selftest"]["required"] > 1
    assert not image_installed(release)  # vm-test unpacked it, never installed it
    assert_nothing_left_running(vm_env)


def venv_with_rdna1_kmgr(where: Path) -> Path:
    """A fresh venv of the system's Python at `where`, with rdna1-kmgr installed into it by pip from this
    checkout (copied first, so pip leaves no build/ folder in it)."""
    source = where.parent / (where.name + "-src")

    def left_out(folder: str, names: list[str]) -> set[str]:
        # pip's leftovers at the top of a checkout (rdna1_kmgr/modbuild/ is a package and stays)
        top = {".git", "build"} if Path(folder) == REPO else set()
        return {n for n in names if n in top or n == "__pycache__" or n.endswith(".egg-info")}

    shutil.copytree(REPO, source, ignore=left_out)
    try:
        subprocess.run(["/usr/bin/python3", "-m", "venv", str(where)], check=True, capture_output=True)
        proc = subprocess.run(
            [str(where / "bin" / "pip"), "install", "-q", str(source)], capture_output=True, text=True, timeout=900
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
    finally:
        shutil.rmtree(source, ignore_errors=True)
    return where / "bin" / "rdna1-kmgr"


@pytest.mark.vm
@pytest.mark.parametrize("parent", ["/var/cache", "/tmp"])
def test_vm_test_passes_with_the_tool_installed_in_a_venv_the_guest_cannot_see(
    parent, fake_modules_61, guest_kernel_61, vm_env
):
    if os.geteuid() != 0:
        pytest.skip(f"making a venv under {parent} and booting a VM: root only")
    folder = Path(tempfile.mkdtemp(prefix="rdna1-kmgr-test-venv-", dir=parent))
    try:
        cli = venv_with_rdna1_kmgr(folder / "venv")
        module = fake_modules_61["good"]
        proc = subprocess.run(
            [str(cli), "vm-test", "--module", str(module), "--kernel", guest_kernel_61, "--json"],
            capture_output=True,
            text=True,
            env=vm_env,
            timeout=900,
        )
        out = json.loads(proc.stdout)
        assert proc.returncode == 0, f"{out.get('reason')} (console {out.get('console_log')})"
        assert out["verdict"] == "pass" and out["selftest"]["passed"] > 0
        # the guest ran the guest side this venv copied into the run folder, to its last step
        console = Path(out["console_log"]).read_text(errors="replace")
        assert "rdna1-kmgr: stage rmmod stock" in console
        assert_nothing_left_running(vm_env)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
