"""Root trusts none of the caller's environment (issue 49). Each attack is mounted for real against the program
it aims at, first without the tool (so the test shows the attack works on this machine), then through the tool's
runner or command, where nothing of the attacker's may run:

- e1: RDNA1_KMGR_DKMS_TREE naming a folder a user owns, with a dkms.conf that is bash: refused in one line;
- e2: RDNA1_KMGR_ROOT naming a user's tree, and a folder link planted on the way of a path the journal restores;
- e3: OPENSSL_CONF loading a provider built here, APT_CONFIG, MODPROBE_OPTIONS;
- e4: BASH_ENV, read by dkms (a bash script);
- e5: PYTHONPATH with a sitecustomize, for the installed command (`python -I`);
- e6: a token in root's environment never reaches the owner's Python;
- the test switch RDNA1_KMGR_TEST_ABORT_AFTER is honoured only while root's test-run marker exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rdna1_kmgr.core import program_env, runner, tool_env
from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.core.owner import Owner
from rdna1_kmgr.install import journal
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.modbuild.dkms_package import Trees

HOSTILE = {
    "OPENSSL_CONF": "/nonexistent/openssl.cnf",
    "APT_CONFIG": "/nonexistent/apt.conf",
    "MODPROBE_OPTIONS": "-C /nonexistent",
    "BASH_ENV": "/nonexistent/bashrc",
    "PYTHONPATH": "/nonexistent/site",
    "LD_LIBRARY_PATH": "/nonexistent/lib",
    "API_TOKEN": "s3cret-token",
}
NOBODY = Owner("nobody", 65534, 65534, "/nonexistent")


@pytest.fixture
def hostile(monkeypatch):
    for name, value in HOSTILE.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SUDO_UID", raising=False)  # a root login (`su` without `-`)
    # outside a test run: what a user's root shell has (the session's marker is for the crash tests)
    monkeypatch.setattr(tool_env, "TEST_MARKER", Path("/nonexistent/rdna1-kmgr-test-run"))


def environment_of(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@pytest.mark.skipif(os.geteuid() != 0, reason="root's programs: run as root")
def test_every_way_the_runner_starts_a_program_gives_it_the_allow_list_only(hostile, tmp_path):
    seen = [environment_of(runner.run(["env"]).stdout)]
    seen.append(environment_of(runner.run(["env"], env={"DEBIAN_FRONTEND": "noninteractive"}).stdout))
    out = tmp_path / "session.out"
    runner.run_session(["env"], out, timeout=30)
    seen.append(environment_of(out.read_text()))
    for env in seen:
        assert not set(HOSTILE) & set(env), env
        assert env["HOME"] == "/root" and env["PATH"]
    assert seen[1]["DEBIAN_FRONTEND"] == "noninteractive"  # what the caller names for that program passes


@pytest.mark.skipif(os.geteuid() != 0, reason="runs a program as uid 65534: root only")
def test_e6_a_token_in_roots_environment_never_reaches_the_owners_python(hostile):
    probe = "import json, os; print(json.dumps(dict(os.environ)))"
    env = program_env.for_owner({"RDNA1_KMGR_CELL": "as-installed/miopen"})
    shown = runner.run(["/usr/bin/python3", "-I", "-c", probe], env=env, as_user=NOBODY, cwd="/").stdout
    seen = __import__("json").loads(shown)
    assert "API_TOKEN" not in seen and "OPENSSL_CONF" not in seen and "BASH_ENV" not in seen
    # the owner's stack settings do pass: their PyTorch reads them, and it runs as them
    assert seen["PYTHONPATH"] == HOSTILE["PYTHONPATH"] and seen["RDNA1_KMGR_CELL"] == "as-installed/miopen"
    assert seen["HOME"] == "/nonexistent" and seen["USER"] == "nobody"


def test_through_sudo_the_owner_gets_what_sudo_kept_less_roots_additions(monkeypatch):
    monkeypatch.setenv("SUDO_UID", "1000")
    monkeypatch.setenv("SUDO_USER", "alice")
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("MAIL", "/var/mail/root")
    env = program_env.for_owner()
    assert env["HIP_VISIBLE_DEVICES"] == "0"
    assert "MAIL" not in env and not [k for k in env if k.startswith("SUDO_")]


def provider(tmp_path: Path, marker: Path) -> Path:
    """A shared object whose constructor leaves `marker`: what an attacker's OpenSSL provider would run."""
    source = tmp_path / "evil.c"
    source.write_text(
        "#include <stdio.h>\n__attribute__((constructor)) static void run(void)\n"
        f'{{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n'
        "int OSSL_provider_init(void) { return 0; }\n"
    )
    built = tmp_path / "evil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(built), str(source)], check=True)
    return built


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("openssl") is None, reason="needs gcc and openssl")
def test_e3_openssl_conf_loads_the_attackers_provider_in_no_program_of_roots(hostile, tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    conf = tmp_path / "openssl.cnf"
    conf.write_text(
        "openssl_conf = init\n[init]\nproviders = providers\n[providers]\nevil = evil\n"
        f"[evil]\nmodule = {provider(tmp_path, marker)}\nactivate = 1\n"
    )
    monkeypatch.setenv("OPENSSL_CONF", str(conf))
    subprocess.run(["openssl", "version"], capture_output=True)  # without the tool: the attack works here
    assert marker.exists(), "the planted provider did not load: the test would prove nothing"
    marker.unlink()
    runner.run(["openssl", "version"])
    assert not marker.exists()


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_e3_openssl_conf_is_gone_before_the_tools_own_process_loads_openssl(tmp_path):
    """Found as a newcomer would (issue 49): the tool's own Python loads libcrypto (hashlib), which read the
    caller's OPENSSL_CONF and ran its provider as root before any program was started."""
    marker = tmp_path / "ran"
    conf = tmp_path / "openssl.cnf"
    conf.write_text(
        "openssl_conf = init\n[init]\nproviders = providers\n[providers]\nevil = evil\n"
        f"[evil]\nmodule = {provider(tmp_path, marker)}\nactivate = 1\n"
    )
    env = {**os.environ, "OPENSSL_CONF": str(conf)}
    subprocess.run([sys.executable, "-I", "-c", "import hashlib; hashlib.sha256()"], env=env)
    assert marker.exists(), "the planted provider did not load: the test would prove nothing"
    marker.unlink()
    done = subprocess.run([sys.executable, "-I", "-c", "import rdna1_kmgr.cli, hashlib; hashlib.sha256()"], env=env)
    assert done.returncode == 0 and not marker.exists()


@pytest.mark.skipif(shutil.which("apt-config") is None, reason="needs apt")
def test_e3_apt_config_and_modprobe_options_reach_neither_program(hostile, tmp_path, monkeypatch):
    conf = tmp_path / "apt.conf"
    conf.write_text('Evil::Planted "yes";\n')
    monkeypatch.setenv("APT_CONFIG", str(conf))
    assert "Evil::Planted" in subprocess.run(["apt-config", "dump"], capture_output=True, text=True).stdout
    assert "Evil::Planted" not in runner.run(["apt-config", "dump"]).stdout
    if shutil.which("modprobe", path="/usr/sbin:/sbin") is None:
        return
    planted = tmp_path / "modprobe.d"
    planted.mkdir()
    (planted / "evil.conf").write_text("options rdna1evil planted=1\n")
    monkeypatch.setenv("MODPROBE_OPTIONS", f"-C {planted}")
    direct = subprocess.run(["modprobe", "--showconfig"], capture_output=True, text=True, env={**os.environ})
    assert "rdna1evil" in direct.stdout
    assert "rdna1evil" not in runner.run(["modprobe", "--showconfig"]).stdout


@pytest.mark.skipif(shutil.which("dkms") is None, reason="needs dkms")
def test_e4_bash_env_is_not_read_by_dkms(hostile, tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    rc = tmp_path / "bashrc"
    rc.write_text(f"touch {marker}\n")
    monkeypatch.setenv("BASH_ENV", str(rc))
    subprocess.run(["bash", "-c", "true"])
    assert marker.exists()
    marker.unlink()
    runner.run([shutil.which("dkms") or "dkms", "status"], check=False)
    assert not marker.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="a folder another user owns: root only")
def test_e1_a_dkms_tree_a_user_owns_is_refused_in_one_line_before_dkms_reads_it(hostile, tmp_path, monkeypatch):
    tree = tmp_path / "user-dkms"
    (tree / "rdna1-amdgpu/1.0/source").mkdir(parents=True)
    marker = tmp_path / "ran"
    (tree / "rdna1-amdgpu/1.0/source/dkms.conf").write_text(f"PACKAGE_NAME=x\n$(touch {marker})\n")
    os.chown(tree, 1000, 1000)
    monkeypatch.setenv(tool_env.DKMS_TREE, str(tree))
    with pytest.raises(HostError) as err:
        Trees.from_env()
    assert err.value.line().startswith(f"refusing {tree} as a folder of the tool: ")
    assert "owned by" in err.value.line() and tool_env.DKMS_TREE in err.value.line()
    assert not marker.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="a folder another user owns: root only")
def test_e2_a_user_tree_as_the_target_root_and_a_planted_folder_link_are_refused(hostile, tmp_path, monkeypatch):
    user_tree = tmp_path / "user-root"
    user_tree.mkdir()
    os.chown(user_tree, 1000, 1000)
    monkeypatch.setenv("RDNA1_KMGR_ROOT", str(user_tree))
    with pytest.raises(HostError) as err:
        TargetRoot.from_env()
    assert "owned by" in err.value.line()
    # a folder on the way swapped for a link by a user, between the backup and the restore: never written through
    etc = tmp_path / "root/etc"
    (etc / "profile.d").mkdir(parents=True)
    target = tmp_path / "real-etc-profile.d"
    target.mkdir()
    os.chown(etc, 1000, 1000)  # a user could swap what is in it
    with pytest.raises(HostError) as err:
        journal.refuse_untrusted_folder(etc / "profile.d/rdna1-kmgr.sh")
    assert "refusing to write" in err.value.line() and "owned by" in err.value.line()
    os.chown(etc, 0, 0)
    (etc / "profile.d").rmdir()
    (etc / "profile.d").symlink_to(target)
    os.lchown(etc / "profile.d", 1000, 1000)
    with pytest.raises(HostError):
        journal.refuse_untrusted_folder(etc / "profile.d/rdna1-kmgr.sh")
    assert list(target.iterdir()) == []


def test_the_crash_switch_is_honoured_in_a_test_run_only(monkeypatch, tmp_path):
    monkeypatch.setenv(journal.ABORT_ENV, "depmod")
    monkeypatch.setattr(tool_env, "TEST_MARKER", tmp_path / "absent")
    journal.abort_point("depmod")  # would exit 137 if honoured
    assert tool_env.test_switch(journal.ABORT_ENV) is None


@pytest.mark.skipif(not (Path(sys.executable).parent / "rdna1-kmgr").is_file(), reason="the installed command")
def test_e5_the_installed_command_runs_isolated_and_never_imports_a_users_sitecustomize(tmp_path):
    launcher = Path(sys.executable).parent / "rdna1-kmgr"
    assert launcher.read_text().splitlines()[0].endswith(" -I"), "install.sh gives the command `python -I`"
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "ran"
    (site / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    subprocess.run([sys.executable, "-c", "pass"], env=env)
    assert marker.exists()
    marker.unlink()
    assert subprocess.run([str(launcher), "--version"], env=env, capture_output=True).returncode == 0
    assert not marker.exists()
