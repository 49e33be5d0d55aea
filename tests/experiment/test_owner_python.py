"""The owner's Python runs as the owner, never as root (issue 40, H1), mounted as the review did.

The attack: anything running as the owner plants a `.pth` file in the owner's venv; Python runs its `import`
line at every start, before any of the tool's code. Here that line writes the uid it runs as to a file, and the
real commands run as root with SUDO_USER set to a real unprivileged user (made for the test): `experiment`
with --python (the probe and the cell), with no --python (discovery), `experiment kernel --dry-run`, and the
kernel cells' boot step. The uid written is the owner's every time, never 0. A venv another user could change is
refused in one line, and its `.pth` never runs.

The owner's venv is a real one (Debian's python3 -m venv) with a stand-in PyTorch for ROCm: torch/version.py
says HIP, as a ROCm wheel's does (doctor's discovery reads that file), and `import torch` gives the probe its
versions; the workload itself then fails at its first tensor, which is no concern here.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from sysfs_fixtures import rx5600xt

from rdna1_kmgr.cli import main
from rdna1_kmgr.core.owner import Owner
from rdna1_kmgr.experiment import cell_run, kernel_run
from rdna1_kmgr.experiment.kernel_cells import stock_cells
from rdna1_kmgr.install.target_root import TargetRoot

USER = "rdna1kmgr-owner-test"
SYSTEM_PYTHON = "/usr/bin/python3"  # a Python every user may run (this run's own may live in /root)
TORCH = {
    "__init__.py": "from torch import version\n__version__ = version.__version__\n",
    "version.py": "__version__ = '2.4.0+rocm6.1'\ndebug = False\ncuda = None\nhip = '6.1.40091'\n",
}


@pytest.fixture
def owner():
    """A real unprivileged user with a home, gone afterwards."""
    if os.geteuid() != 0:
        pytest.skip("creates a user and runs the tool as root")
    if not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"{SYSTEM_PYTHON} is not installed")
    subprocess.run(["userdel", "-r", USER], capture_output=True)
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", USER], check=True)
    try:
        yield pwd.getpwnam(USER)
    finally:
        subprocess.run(["userdel", "-r", USER], capture_output=True)


def planted_venv(venv: Path, uid: int, gid: int) -> Path:
    """A venv owned by uid:gid with a ROCm torch stand-in and the attacker's .pth; the file the .pth writes to."""
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    for name, text in TORCH.items():
        (site / "torch").mkdir(exist_ok=True)
        (site / "torch" / name).write_text(text)
    uids = venv / "uids"
    (site / "zz-planted.pth").write_text(f"import os; open({str(uids)!r}, 'a').write('%d\\n' % os.geteuid())\n")
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(venv)], check=True)
    return uids


def recorded(uids: Path) -> list[int]:
    return [int(line) for line in uids.read_text().split()] if uids.exists() else []


@pytest.fixture
def desk(tmp_path, monkeypatch, owner):
    """The board in a fixture tree, root's state in tmp, sudo's variables naming the owner, cell folders in a
    scratch folder the owner can reach (as /var/tmp is)."""
    tree = rx5600xt(tmp_path / "sysroot").kmsg("amdgpu 0000:0a:00.0: amdgpu: SMU is initialized successfully!")
    for name, folder in (("RDNA1_KMGR_STATE", "state"), ("RDNA1_KMGR_LOG", "log"), ("RDNA1_KMGR_ROOT", "root")):
        (tmp_path / folder).mkdir()
        monkeypatch.setenv(name, str(tmp_path / folder))
    monkeypatch.setenv("SUDO_USER", USER)
    monkeypatch.setenv("SUDO_UID", str(owner.pw_uid))
    monkeypatch.setenv("SUDO_GID", str(owner.pw_gid))
    scratch = Path(tempfile.mkdtemp(prefix="rdna1-kmgr-test-", dir="/var/tmp"))
    scratch.chmod(0o755)
    monkeypatch.setattr(cell_run, "SCRATCH", scratch)
    yield {"sysroot": str(tree.root), "owner": owner, "scratch": scratch, "tmp": tmp_path}
    shutil.rmtree(scratch)


def experiment(desk, *args: str):
    one_cell = ["--profile", "as-installed", "--backend", "miopen", "--quick", "--case-timeout", "20"]
    return CliRunner().invoke(main, ["experiment", "--sysroot", desk["sysroot"], *one_cell, "--json", *args])


def test_the_probe_and_the_cell_run_as_the_owner_not_root(desk):
    owner = desk["owner"]
    venv = Path(owner.pw_dir) / "rocm"
    uids = planted_venv(venv, owner.pw_uid, owner.pw_gid)
    result = experiment(desk, "--python", str(venv / "bin/python"))
    # The probe, then the one cell (Python reads the venv's site-packages twice, as lib and lib64: two lines each).
    assert len(recorded(uids)) == 4, result.output
    assert set(recorded(uids)) == {owner.pw_uid}
    cell = json.loads(result.stdout)["cells"][0]
    assert cell["outcome"] != "not-run"
    # The cell's caches are the owner's; the record folder stays root's.
    assert Path(cell["caches"]).stat().st_uid == owner.pw_uid
    assert Path(cell["folder"]).stat().st_uid == 0


def test_discovery_reads_as_root_and_runs_only_as_the_owner(desk):
    """No --python: the ROCm torch under the owner's home is found by reading files; running it is the owner's."""
    owner = desk["owner"]
    uids = planted_venv(Path(owner.pw_dir) / "venvs" / "rocm", owner.pw_uid, owner.pw_gid)
    result = experiment(desk)
    assert recorded(uids), result.output
    assert set(recorded(uids)) == {owner.pw_uid}
    assert json.loads(result.stdout)["python"].startswith(owner.pw_dir)


def test_the_kernel_cells_dry_run_probes_as_the_owner(desk):
    owner = desk["owner"]
    venv = Path(owner.pw_dir) / "rocm"
    uids = planted_venv(venv, owner.pw_uid, owner.pw_gid)
    result = CliRunner().invoke(
        main, ["experiment", "kernel", "--dry-run", "--sysroot", desk["sysroot"], "--python", str(venv / "bin/python")]
    )
    # Whether this machine can boot cells (no GRUB here) is said after the probe: the probe ran, as the owner.
    assert recorded(uids) == [owner.pw_uid] * 2, result.output


def test_the_boot_step_drops_to_the_owner_the_plan_recorded(desk):
    """The unit runs as root with no sudo variables: the cells run as the uid and gid recorded at `start`."""
    owner = desk["owner"]
    venv = Path(owner.pw_dir) / "rocm"
    uids = planted_venv(venv, owner.pw_uid, owner.pw_gid)
    os.environ.pop("SUDO_USER")
    folder = desk["tmp"] / "state" / "experiments" / "kernel-x"
    plan = kernel_run.Plan(
        str(folder),
        tuple(stock_cells()[:1]),
        ("as-installed/miopen",),
        str(venv / "bin/python"),
        desk["sysroot"],
        {},
        cell_run.Limits(case=20, cell=120),
        True,
        False,
        Owner(owner.pw_name, owner.pw_uid, owner.pw_gid, owner.pw_dir).to_json(),
    )
    plan = kernel_run.Plan.from_json(json.loads(json.dumps(plan.to_json())))  # as plan.json gives it back
    results = kernel_run._run_host_cells(plan, plan.kernel_cells[0], TargetRoot.from_env(), 1, 1)
    assert [r.cell.id for r in results] == ["as-installed/miopen"]
    assert recorded(uids) == [owner.pw_uid] * 2
    # A plan whose owner no longer matches the password database runs nothing.
    forged = kernel_run.Plan.from_json({**plan.to_json(), "owner": {"name": "root", "uid": owner.pw_uid, "gid": 0}})
    with pytest.raises(Exception, match="is no longer that user"):
        kernel_run._run_host_cells(forged, plan.kernel_cells[0], TargetRoot.from_env(), 1, 1)
    assert recorded(uids) == [owner.pw_uid] * 2


def test_root_without_sudo_runs_a_users_venv_in_tmp_as_that_user(desk):
    """Not through sudo (a root login): the venv's owner is the owner."""
    owner = desk["owner"]
    os.environ.pop("SUDO_USER")
    os.environ.pop("SUDO_UID")
    venv = Path(tempfile.mkdtemp(prefix="rdna1-kmgr-test-venv-", dir="/tmp"))
    try:
        uids = planted_venv(venv, owner.pw_uid, owner.pw_gid)
        result = experiment(desk, "--python", str(venv / "bin/python"))
        assert recorded(uids) and set(recorded(uids)) == {owner.pw_uid}, result.output
    finally:
        shutil.rmtree(venv)


@pytest.mark.parametrize("how", ["another user's", "group-writable site-packages", "all-writable .pth"])
def test_a_venv_someone_else_can_change_is_refused_in_one_line(desk, how):
    owner = desk["owner"]
    nobody = pwd.getpwnam("nobody")
    venv = Path(owner.pw_dir) / "rocm"
    if how == "another user's":
        uids = planted_venv(venv, nobody.pw_uid, nobody.pw_gid)
        says = "is owned by nobody"
    else:
        uids = planted_venv(venv, owner.pw_uid, owner.pw_gid)
        site = next(venv.glob("lib/python3*/site-packages"))
        if how == "group-writable site-packages":
            site.chmod(0o775)
            says = "site-packages is writable by its group"
        else:
            (site / "zz-planted.pth").chmod(0o666)
            says = "zz-planted.pth is writable by all users"
    result = experiment(desk, "--python", str(venv / "bin/python"))
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert "\n" not in line and f"is not safe to run as {USER}" in line and says in line, line
    assert recorded(uids) == []  # nothing of it ran, as anyone


def test_a_forged_sudo_user_is_refused(desk, monkeypatch):
    """SUDO_USER naming root, or a user whose uid is not SUDO_UID, is no owner: refused before anything runs."""
    owner = desk["owner"]
    uids = planted_venv(Path(owner.pw_dir) / "rocm", owner.pw_uid, owner.pw_gid)
    for name, uid in (("root", str(owner.pw_uid)), (USER, "0"), (f"{USER}\n", str(owner.pw_uid))):
        monkeypatch.setenv("SUDO_USER", name)
        monkeypatch.setenv("SUDO_UID", uid)
        result = experiment(desk, "--python", str(Path(owner.pw_dir) / "rocm/bin/python"))
        assert result.exit_code != 0 and "SUDO_USER=" in result.stderr, result.output
    assert recorded(uids) == []


def test_the_owners_program_gets_their_identity_groups_and_no_root_variables(owner):
    """The runner's one drop (core/process_tree.py): uid, gid and the owner's groups (render, video: the GPU's
    devices), and an environment with the owner's HOME, USER, LOGNAME and PATH, what the caller passed, nothing
    of root's."""
    from rdna1_kmgr.core import runner
    from rdna1_kmgr.core.owner import of_entry

    subprocess.run(["usermod", "-a", "-G", "video", USER], check=True)
    env = {"HOME": "/root", "SUDO_COMMAND": "/bin/sh", "XDG_RUNTIME_DIR": "/run/user/0", "HSA_X": "1"}
    shown = runner.run(
        ["/bin/sh", "-c", "id -u; id -g; id -Gn; env"], env=env, cwd="/", as_user=of_entry(pwd.getpwnam(USER))
    )
    uid, gid, groups, *variables = shown.stdout.splitlines()
    assert (int(uid), int(gid)) == (owner.pw_uid, owner.pw_gid) and "video" in groups.split()
    seen = dict(v.split("=", 1) for v in variables if "=" in v)
    assert seen["HOME"] == owner.pw_dir and seen["USER"] == seen["LOGNAME"] == USER and seen["HSA_X"] == "1"
    assert seen["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert not {"SUDO_COMMAND", "XDG_RUNTIME_DIR"} & set(seen)
