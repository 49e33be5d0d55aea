"""The kernel hooks and `follow`'s fast paths, run the way the distribution runs them.

The hooks are placed by `rdna1-kmgr hooks install` into a scratch root (RDNA1_KMGR_ROOT) and run by the real
`run-parts` with the arguments the kernel packages give (`--arg=KREL --arg=/boot/vmlinuz-KREL`), the apt
hook by the real `apt-config` and `sh`. "Opted in" is a finished install's journal, written with the journal's
own API (a real install does this in test_follow_real.py). Every test here takes well under a second a hook.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_kernel import make_tree
from sysfs_fixtures import FakeSysroot

from rdna1_kmgr.install import journal as jr
from rdna1_kmgr.install.install_begin import InstallBegin
from rdna1_kmgr.install.journal_records import Commit
from rdna1_kmgr.modbuild.dkms_package import Package, Trees

# real dkms, apt/dpkg, a CPU PyTorch or killed process trees on fixtures: seconds each, out of the fast tier
pytestmark = pytest.mark.system

CLI = Path(sys.executable).parent / "rdna1-kmgr"
OLD, NEW = "6.1.0-56-amd64", "6.12.95+deb12-amd64"
VERSION = "6.1.192+p0123456789ab"


class Host:
    def __init__(self, base: Path):
        self.root = base / "root"
        self.state = base / "state"
        self.src = base / "usr-src"
        FakeSysroot(self.root).kernel(OLD).os_release("debian", "12", "Debian GNU/Linux 12 (bookworm)")
        self.env = {
            **os.environ,
            "RDNA1_KMGR_ROOT": str(self.root),
            "RDNA1_KMGR_STATE": str(self.state),
            "RDNA1_KMGR_DKMS_SOURCE_TREE": str(self.src),
            "RDNA1_KMGR_DKMS_TREE": str(base / "var-lib-dkms"),
            "RDNA1_KMGR_CACHE": str(base / "cache"),
            "RDNA1_KMGR_LOG": str(base / "log"),
        }

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(CLI), *args], capture_output=True, text=True, env=self.env, timeout=120)

    def opt_in(self, kernel: str = OLD) -> None:
        """A finished install for `kernel`, and its package's render manifest."""
        saved = os.environ.get("RDNA1_KMGR_STATE")
        os.environ["RDNA1_KMGR_STATE"] = str(self.state)
        try:
            journal = jr.Journal(kernel)
            journal.begin(
                InstallBegin(
                    kernel=kernel,
                    root=str(self.root),
                    package=Package("rdna1-amdgpu", VERSION),
                    parameters={"rdna1_quirks": "0x3"},
                    trees=Trees(self.src, Path(self.env["RDNA1_KMGR_DKMS_TREE"])),
                )
            )
            journal.append(Commit(verified={}))
        finally:
            if saved is None:
                os.environ.pop("RDNA1_KMGR_STATE")
            else:
                os.environ["RDNA1_KMGR_STATE"] = saved
        package = self.src / f"rdna1-amdgpu-{VERSION}"
        package.mkdir(parents=True)
        (package / "rdna1-manifest.json").write_text(
            json.dumps(
                {"quirks": [{"id": "coarse-mtype", "bit": 0}, {"id": "crat-mem", "bit": 1}], "devices": ["0x731F"]}
            )
        )

    def run_parts(self, folder: str, kernel: str) -> tuple[subprocess.CompletedProcess, float]:
        started = time.monotonic()
        proc = subprocess.run(
            [
                "run-parts",
                "--report",
                "--exit-on-error",
                f"--arg={kernel}",
                f"--arg=/boot/vmlinuz-{kernel}",
                str(self.root / "etc/kernel" / folder),
            ],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
        )
        return proc, time.monotonic() - started

    @property
    def pending(self) -> list[str]:
        folder = self.state / "follow/pending"
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    def record(self, kernel: str) -> dict | None:
        path = self.state / "follow" / f"{kernel}.json"
        return json.loads(path.read_text()) if path.exists() else None


@pytest.fixture
def host(tmp_path) -> Host:
    h = Host(tmp_path)
    proc = h.cli("hooks", "install")
    assert proc.returncode == 0, proc.stderr
    return h


def test_hooks_install_places_every_hook_calling_this_installation_and_remove_takes_them_away(host):
    for folder in ("postinst.d", "header_postinst.d", "postrm.d"):
        hook = host.root / "etc/kernel" / folder / "rdna1-kmgr"
        assert hook.stat().st_mode & 0o777 == 0o755
        assert f"cli={CLI}\n" in hook.read_text()
    conf = host.root / "etc/apt/apt.conf.d/80rdna1-kmgr"
    assert f"then {CLI} follow pending --hook" in conf.read_text()
    unit = host.root / "etc/systemd/system/rdna1-kmgr-follow.service"
    assert f"ExecStart={CLI} follow pending --hook" in unit.read_text()
    link = host.root / "etc/systemd/system/multi-user.target.wants/rdna1-kmgr-follow.service"
    assert os.readlink(link) == "../rdna1-kmgr-follow.service"
    again = host.cli("hooks", "install")
    assert again.returncode == 0 and "in place already" in again.stdout
    assert again.stdout.splitlines()[0] == f"the hooks call {CLI}"  # which copy root will run, named first

    dry = host.cli("hooks", "remove", "--dry-run")
    assert f"remove {conf}" in dry.stdout.splitlines() and conf.exists()
    assert host.cli("hooks", "remove").returncode == 0
    assert not conf.exists() and not link.is_symlink()
    assert not (host.root / "etc/kernel/postinst.d/rdna1-kmgr").exists()


def post_invoke_dump(host) -> str:
    """`apt-config dump DPkg::Post-Invoke` of the placed apt hook alone, not of the machine's apt.conf.d too
    (which may hold another installation's hook)."""
    alone = host.root / "apt-alone"
    (alone / "parts").mkdir(parents=True, exist_ok=True)
    (alone / "apt.conf").write_text(f'Dir::Etc::main "/dev/null";\nDir::Etc::parts "{alone / "parts"}";\n')
    conf = host.root / "etc/apt/apt.conf.d/80rdna1-kmgr"
    return subprocess.run(
        ["apt-config", "-c", str(conf), "dump", "DPkg::Post-Invoke"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "APT_CONFIG": str(alone / "apt.conf")},
    ).stdout


def test_apt_reads_the_post_invoke_hook(host):
    if not shutil.which("apt-config"):
        pytest.skip("apt-config is not installed (not a Debian/Ubuntu host)")
    dump = post_invoke_dump(host)
    assert f"then {CLI} follow pending --hook || true; fi" in dump


def test_before_any_install_the_kernel_hooks_do_nothing(host):
    for folder in ("postinst.d", "header_postinst.d"):
        proc, seconds = host.run_parts(folder, NEW)
        assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == ""
        assert seconds < 10
    assert host.pending == []
    assert not host.state.exists()  # not even a directory


def test_once_opted_in_the_postinst_hook_only_notes_the_kernel_and_returns(host):
    host.opt_in()
    proc, seconds = host.run_parts("postinst.d", NEW)
    assert proc.returncode == 0, proc.stderr
    assert seconds < 10  # inside dpkg: no build, no apt
    assert host.pending == [NEW]
    assert host.record(NEW)["state"] == "pending"
    assert f"{NEW}: noted" in proc.stdout
    # The header hook for the same kernel notes it once, not twice.
    assert host.run_parts("header_postinst.d", NEW)[0].returncode == 0
    assert host.pending == [NEW]
    # A kernel that has its install already is not noted again.
    proc, _ = host.run_parts("postinst.d", OLD)
    assert host.pending == [NEW] and "has an rdna1-kmgr install already" in proc.stdout

    status = json.loads(host.cli("status", "--json").stdout)
    (k,) = [k for k in status["kernels"] if k["kernel"] == NEW]
    assert k["follow"]["state"] == "pending"
    assert k["next_boot"].startswith("the stock amdgpu; the patched one once `rdna1-kmgr follow` finishes")


def test_the_post_invoke_command_does_nothing_fast_when_nothing_is_pending(host):
    if not shutil.which("apt-config"):
        pytest.skip("apt-config is not installed")
    dump = post_invoke_dump(host)
    (line,) = [ln for ln in dump.splitlines() if str(CLI) in ln]
    command = line.split(" ", 1)[1].rstrip(";").strip('"')  # DPkg::Post-Invoke:: "<command>";
    marker = host.state / "follow/pending"
    marker.mkdir(parents=True)
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=host.env, timeout=60)
    assert proc.returncode == 0 and proc.stdout == ""
    # With a pending kernel it runs follow, which, opted out, drops the note and says nothing.
    (marker / NEW).touch()
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=host.env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert host.pending == []


def test_a_kernel_that_is_not_installed_stays_stock_with_the_reason_in_status(host):
    host.opt_in()
    assert host.run_parts("postinst.d", NEW)[0].returncode == 0
    # As apt's Post-Invoke hook runs it: exit status 0, one line that says why.
    proc = host.cli("follow", "pending", "--hook")
    assert proc.returncode == 0, proc.stderr
    (last,) = [line for line in proc.stdout.splitlines() if line.strip()][-1:]
    assert last.startswith(f"rdna1-kmgr: {NEW}: keeps the stock amdgpu: kernel {NEW} is not installed")
    record = host.record(NEW)
    assert record["state"] == "stock" and record["stage"] == "image"
    assert host.pending == []
    assert "--- image" in Path(record["log"]).read_text()
    # By hand, without --hook, the same failure is an error line and a non-zero exit.
    by_hand = host.cli("follow", "--kernel", NEW)
    assert by_hand.returncode == 4
    status = json.loads(host.cli("status", "--json").stdout)
    (k,) = [k for k in status["kernels"] if k["kernel"] == NEW]
    assert k["follow"]["state"] == "stock" and "is not installed" in k["follow"]["reason"]
    assert k["next_boot"] == "the stock amdgpu"
    text = host.cli("status").stdout
    assert f"follow      keeps the stock amdgpu: kernel {NEW} is not installed" in text


def test_the_postrm_hook_forgets_a_removed_kernel(host):
    host.opt_in()
    host.run_parts("postinst.d", NEW)
    assert host.record(NEW) is not None
    # vm-test unpacked the kernel's image and modules into the cache (issue 27: they go with the kernel too)
    guest = Path(host.env["RDNA1_KMGR_CACHE"]) / "kernels" / NEW
    (guest / "boot").mkdir(parents=True)
    (guest / "boot" / f"vmlinuz-{NEW}").write_bytes(b"image")
    dry = host.cli("follow", "removed", NEW, "--dry-run")
    assert dry.returncode == 0 and f"remove the follow record of {NEW}" in dry.stdout
    assert f"remove the guest kernel {guest}" in dry.stdout
    assert f"remove its kernel source under {Path(host.env['RDNA1_KMGR_CACHE']) / 'src'} unless" in dry.stdout
    assert host.record(NEW) is not None and guest.is_dir()
    proc, _ = host.run_parts("postrm.d", NEW)
    assert proc.returncode == 0, proc.stderr
    assert host.record(NEW) is None and host.pending == []
    assert not guest.exists()


def test_bad_input_is_one_line_and_the_hook_form_never_fails(host):
    for args in (["follow"], ["follow", "defer", "../etc"], ["follow", "--kernel", "../etc"]):
        proc = host.cli(*args)
        assert proc.returncode == 2
        assert [ln for ln in proc.stderr.splitlines() if ln.strip()][0].startswith("rdna1-kmgr: error: ")
    proc = host.cli("follow", "defer", "../etc", "--hook")
    assert proc.returncode == 0 and proc.stdout.startswith("rdna1-kmgr: ")


def test_systemd_accepts_the_boot_unit(host):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    unit = host.root / "etc/systemd/system/rdna1-kmgr-follow.service"
    proc = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [ln for ln in proc.stderr.splitlines() if "rdna1-kmgr-follow" in ln]
    assert proc.returncode == 0 and not problems, proc.stderr


def test_a_source_the_renderer_refuses_leaves_the_kernel_stock_with_the_reason(host, tmp_path):
    kernel = "6.1.0-99-amd64"  # no headers here: the build would stop later anyway; render comes first
    (host.root / "lib/modules" / kernel / "kernel").mkdir(parents=True)
    tree = make_tree(tmp_path / "src", "6.1.192", omit="gmc_v10_0_get_vm_pte")
    host.opt_in()
    proc = host.cli("follow", "--kernel", kernel, "--source", str(tree))
    assert proc.returncode == 3
    assert proc.stderr.strip().splitlines()[-1].startswith("rdna1-kmgr: error: render: cannot render")
    record = host.record(kernel)
    assert record["state"] == "stock" and record["stage"] == "render"
    assert "gmc_v10_0" in record["reason"]
    status = json.loads(host.cli("status", "--json").stdout)
    (k,) = [k for k in status["kernels"] if k["kernel"] == kernel]
    assert k["follow"]["stage"] == "render" and k["journal"] is None and k["dkms"] == []


def test_follow_dry_run_prints_the_plan_and_changes_nothing(host):
    host.opt_in()
    before = sorted(str(p) for p in host.state.rglob("*"))
    proc = host.cli("follow", "--kernel", NEW, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == (
        f"follow {NEW} with the quirks installed for {OLD} (rdna1-amdgpu/{VERSION}): "
        "coarse-mtype crat-mem; devices 0x731F"
    )
    assert any(line.startswith("  install: `rdna1-kmgr install --kernel") for line in lines)
    assert sorted(str(p) for p in host.state.rglob("*")) == before
    assert host.cli("follow", "--kernel", OLD, "--dry-run").stdout.startswith(f"nothing to do for {OLD}")


def user_venv_copy(owner: str) -> Path:
    """A venv in /tmp with a console script `rdna1-kmgr` (as pip writes one), handed to `owner`: a copy of the
    tool that user can change at will."""
    venv = Path(
        subprocess.run(["mktemp", "-d", "/tmp/rdna1-kmgr-copy.XXXXXX"], capture_output=True, text=True).stdout.strip()
    )
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    script = venv / "bin/rdna1-kmgr"
    script.write_text(f"#!{venv}/bin/python\nfrom rdna1_kmgr.cli import main\nmain()\n")
    script.chmod(0o755)
    subprocess.run(["chown", "-R", owner, str(venv)], check=True)
    return venv


@pytest.mark.parametrize("how", ["a user's venv in /tmp", "a root-owned script in a venv a user can change"])
def test_hooks_install_refuses_a_command_anyone_but_root_can_change(tmp_path, how):
    """The review's M1: the hooks (run as root at every kernel update) called whatever copy placed them. A copy in
    a user's /tmp venv, or whose interpreter or site-packages a user can change, is refused in one line, and
    nothing is written."""
    if os.geteuid() != 0:
        pytest.skip("chowns to another user")
    h = Host(tmp_path)
    venv = user_venv_copy("nobody:nogroup")
    try:
        if how != "a user's venv in /tmp":
            subprocess.run(
                ["chown", "root:root", str(venv), str(venv / "bin"), str(venv / "bin/rdna1-kmgr")], check=True
            )
        proc = h.cli("hooks", "install", "--cli", str(venv / "bin/rdna1-kmgr"))
        assert proc.returncode == 4, proc.stderr
        line = proc.stderr.strip()
        assert "\n" not in line and f"root would run {venv}/bin/rdna1-kmgr" in line and "is owned by nobody" in line
        assert not (h.root / "etc/kernel").exists() and not (h.root / "etc/apt").exists()
    finally:
        shutil.rmtree(venv)


def test_this_installation_in_a_users_venv_is_no_command_for_root(monkeypatch):
    """The default command (this running copy's script) is checked the same way: run from a user's venv, the
    units and hooks get no path to it."""
    if os.geteuid() != 0:
        pytest.skip("chowns to another user")
    from rdna1_kmgr.core import trust
    from rdna1_kmgr.core.errors import HostError

    venv = user_venv_copy("nobody:nogroup")
    try:
        monkeypatch.setattr(trust.sys, "executable", str(venv / "bin/python"))
        with pytest.raises(HostError, match=f"root would run {venv}/bin/rdna1-kmgr.*is owned by nobody"):
            trust.this_command()
        monkeypatch.undo()
        assert trust.this_command() == CLI  # the suite's own venv: root's
    finally:
        shutil.rmtree(venv)
