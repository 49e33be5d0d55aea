"""Root trusts none of the caller's environment (issue 49). Each attack is driven for real, as root, through the
installed command, in a private mount namespace whose /etc, /var and /usr/src are overlays (tests/private_namespace.py):
first without the tool where that is possible (so the test shows the attack works on this machine), then through
the tool, where nothing of the attacker's may run:

- e1: RDNA1_KMGR_DKMS_TREE naming a folder a user owns, its dkms.conf bash that `dkms status` sources: `status`
  refuses it in one line;
- e2: RDNA1_KMGR_ROOT naming a user's tree; and a folder swapped for a link between `profile install` and
  `profile remove`: neither writes through it;
- e3: OPENSSL_CONF loading a provider built here (`keys status`), APT_CONFIG, MODPROBE_OPTIONS;
- e4: BASH_ENV, read by dkms (a bash script);
- e5: PYTHONPATH with a sitecustomize, for the installed command (`python -I`);
- e6: a token in root's environment never reaches the owner's Python (`experiment --python`);
- a spread of programs (dkms, openssl, apt, modprobe, qemu, the owner's Python) each sees the allow-list only;
- the test switch RDNA1_KMGR_TEST_ABORT_AFTER is honoured only while root's test-run marker exists.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import private_namespace
import pytest

from rdna1_kmgr.core import program_env, runner, tool_env
from rdna1_kmgr.install import journal

HOSTILE = {
    "OPENSSL_CONF": "/nonexistent/openssl.cnf",
    "APT_CONFIG": "/nonexistent/apt.conf",
    "MODPROBE_OPTIONS": "-C /nonexistent",
    "BASH_ENV": "/nonexistent/bashrc",
    "PYTHONPATH": "/nonexistent/site",
    "LD_LIBRARY_PATH": "/nonexistent/lib",
    "API_TOKEN": "s3cret-token",
}


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


def test_the_crash_switch_is_honoured_in_a_test_run_only(monkeypatch, tmp_path):
    monkeypatch.setenv(journal.ABORT_ENV, "depmod")
    monkeypatch.setattr(tool_env, "TEST_MARKER", tmp_path / "absent")
    journal.abort_point("depmod")  # would exit 137 if honoured
    assert tool_env.test_switch(journal.ABORT_ENV) is None


# --- the attacks, driven for real through the installed command, each in a private mount namespace ---

NOBODY_UID = 65534  # the attacker and the owner: a user of every machine


def attacked(**planted: str) -> dict[str, str]:
    """A root shell's environment (`su` without `-`: no SUDO_*) with the attacker's variables added."""
    return {**private_namespace.base_env(), **planted}


def users_folder(name: str, uid: int) -> Path:
    """A folder `uid` owns, that a user can reach (a test's tmp_path is in root's 0700 folder)."""
    folder = Path(tempfile.mkdtemp(prefix=f"rdna1-kmgr-{name}-", dir="/tmp"))
    folder.chmod(0o755)
    os.chown(folder, uid, uid)
    return folder


@pytest.fixture
def user_tmp():
    made: list[Path] = []

    def make(name: str, uid: int = NOBODY_UID) -> Path:
        made.append(users_folder(name, uid))
        return made[-1]

    yield make
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


def as_user(uid: int, script: str) -> subprocess.CompletedProcess[str]:
    """A shell script run as `uid`, as that user would run it (no root left)."""
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/bin/sh", "-c", script],
        capture_output=True,
        text=True,
        check=True,
    )


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1, (proc.returncode, proc.stderr)
    return lines[0]


def planted_dkms_tree(folder: Path, marker: Path) -> Path:
    """A DKMS tree whose rdna1-amdgpu 1.0 is built for a kernel, so that `dkms status` sources its dkms.conf."""
    tree = folder / "dkms"
    (tree / "rdna1-amdgpu/1.0/6.1.0-99-amd64/x86_64/module").mkdir(parents=True)
    (tree / "rdna1-amdgpu/1.0/source").mkdir(parents=True)
    (tree / "rdna1-amdgpu/1.0/source/dkms.conf").write_text(
        f"PACKAGE_NAME=rdna1-amdgpu\nPACKAGE_VERSION=1.0\ntouch {marker}\n"
    )
    return tree


NEEDS_DKMS = pytest.mark.skipif(shutil.which("dkms") is None, reason="needs dkms")


@private_namespace.NEEDS
@NEEDS_DKMS
def test_e1_status_refuses_a_dkms_tree_a_user_owns_before_dkms_sources_its_dkms_conf(tmp_path, user_tmp):
    folder = user_tmp("e1")
    marker = folder / "ran-as-root"
    tree = planted_dkms_tree(folder, marker)
    subprocess.run(["chown", "-R", f"{NOBODY_UID}:{NOBODY_UID}", str(tree)], check=True)
    env = attacked(**{tool_env.DKMS_TREE: str(tree)})
    # without the tool: root's `dkms status` on that tree runs the user's file
    private_namespace.run(["dkms", "status", f"--dkmstree={tree}"], env, tmp_path / "direct")
    assert marker.exists(), "dkms did not source the planted dkms.conf: the test would prove nothing"
    marker.unlink()
    proc = private_namespace.run([*private_namespace.tool_command(), "status"], env, tmp_path / "tool")
    line = one_error_line(proc)
    assert line.startswith(f"rdna1-kmgr: refusing {tree} as a folder of the tool: ") or f"refusing {tree}" in line
    assert "owned by" in line and tool_env.DKMS_TREE in line
    assert not marker.exists()


@private_namespace.NEEDS
def test_e2_profile_commands_never_write_through_a_users_tree_or_a_folder_swapped_for_a_link(tmp_path, user_tmp):
    tool = private_namespace.tool_command()
    scratch = tmp_path / "ns"
    # a user's tree as the target root: refused in one line, nothing written anywhere
    user_root = user_tmp("e2-root")
    (user_root / "etc/profile.d").mkdir(parents=True)
    subprocess.run(["chown", "-R", f"{NOBODY_UID}:{NOBODY_UID}", str(user_root)], check=True)
    proc = private_namespace.run(
        [*tool, "profile", "install", "find-fast"], attacked(RDNA1_KMGR_ROOT=str(user_root)), scratch
    )
    assert "owned by" in one_error_line(proc) and tool_env.ROOT in proc.stderr
    assert private_namespace.written(scratch, "/etc") == [] and list((user_root / "etc/profile.d").iterdir()) == []

    # root's own tree, installed; then a folder on the way becomes a user's, who swaps it for a link to the real
    # /etc/profile.d before `profile remove` restores
    tree = user_tmp("e2-tree", 0) / "root"
    for sub in ("etc/profile.d", "etc/environment.d"):
        (tree / sub).mkdir(parents=True)
    env = attacked(RDNA1_KMGR_ROOT=str(tree))
    installed = private_namespace.run([*tool, "profile", "install", "find-fast"], env, scratch)
    assert installed.returncode == 0, installed.stderr
    assert (tree / "etc/profile.d/rdna1-kmgr.sh").is_file()
    os.chown(tree / "etc", NOBODY_UID, NOBODY_UID)
    as_user(NOBODY_UID, f"cd {tree}/etc && mv profile.d profile.d.was && ln -s /etc/profile.d profile.d")
    proc = private_namespace.run([*tool, "profile", "remove"], env, scratch)
    line = one_error_line(proc)
    assert "refusing to write" in line and "profile.d" in line, line
    # the real /etc/profile.d (the namespace's overlay) got nothing
    assert not [p for p in private_namespace.written(scratch, "/etc") if p.startswith("profile.d")]


@private_namespace.NEEDS
@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("openssl") is None, reason="needs gcc and openssl")
def test_e3_keys_status_never_loads_the_openssl_provider_a_user_names(tmp_path, user_tmp):
    folder = user_tmp("e3")
    marker = folder / "ran-as-root"
    conf = folder / "openssl.cnf"
    conf.write_text(
        "openssl_conf = init\n[init]\nproviders = providers\n[providers]\nevil = evil\n"
        f"[evil]\nmodule = {provider(folder, marker)}\nactivate = 1\n"
    )
    key, cert = tmp_path / "mok.key", tmp_path / "mok.der"
    subprocess.run(
        ["openssl", "req", "-new", "-x509", "-nodes", "-subj", "/CN=e3", "-newkey", "rsa:2048", "-keyout", str(key),
         "-outform", "DER", "-out", str(cert)],
        check=True, capture_output=True, env=private_namespace.base_env(),
    )  # fmt: skip
    env = attacked(OPENSSL_CONF=str(conf))
    private_namespace.run(["openssl", "x509", "-inform", "DER", "-in", str(cert), "-noout"], env, tmp_path / "direct")
    assert marker.exists(), "the planted provider did not load: the test would prove nothing"
    marker.unlink()
    tool = [*private_namespace.tool_command(), "keys", "status", "--key", str(key), "--cert", str(cert)]
    proc = private_namespace.run(tool, env, tmp_path / "tool")
    assert proc.returncode == 0 and "'e3'" in proc.stdout, proc.stdout + proc.stderr  # openssl did read the cert
    assert not marker.exists()


@private_namespace.NEEDS
@NEEDS_DKMS
def test_e4_the_dkms_status_runs_never_sources_bash_env(tmp_path, user_tmp):
    folder = user_tmp("e4")
    marker = folder / "ran-as-root"
    rc = folder / "bashrc"
    rc.write_text(f"touch {marker}\n")
    env = attacked(BASH_ENV=str(rc))
    private_namespace.run(["dkms", "status"], env, tmp_path / "direct")
    assert marker.exists(), "dkms did not read BASH_ENV: the test would prove nothing"
    marker.unlink()
    proc = private_namespace.run([*private_namespace.tool_command(), "status"], env, tmp_path / "tool")
    assert "dkms" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert not marker.exists()


@private_namespace.NEEDS
@pytest.mark.skipif(not (Path(sys.executable).parent / "rdna1-kmgr").is_file(), reason="the installed command")
def test_e5_the_installed_command_never_imports_a_users_sitecustomize(tmp_path, user_tmp):
    launcher = Path(sys.executable).parent / "rdna1-kmgr"
    assert launcher.read_text().splitlines()[0].endswith(" -I"), "install.sh gives the command `python -I`"
    site = user_tmp("e5")
    marker = site / "ran-as-root"
    (site / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    env = attacked(PYTHONPATH=str(site))
    private_namespace.run([sys.executable, "-c", "pass"], env, tmp_path / "direct")
    assert marker.exists()
    marker.unlink()
    proc = private_namespace.run([str(launcher), "status"], env, tmp_path / "tool")
    assert "dkms" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert not marker.exists()


def owners_venv(folder: Path, dump: Path) -> Path:
    """A venv of the owner's whose `python` writes the environment and uid it was started with to `dump`."""
    python = folder / "venv/bin/python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\n{{ id -u; /usr/bin/env; }} > {dump}\nexit 1\n")
    python.chmod(0o755)
    subprocess.run(["chown", "-R", f"{NOBODY_UID}:{NOBODY_UID}", str(folder / "venv")], check=True)
    return python


@private_namespace.NEEDS
def test_e6_a_token_in_roots_environment_never_reaches_the_owners_python(tmp_path, user_tmp):
    folder = user_tmp("e6")
    dump = folder / "seen"
    python = owners_venv(folder, dump)
    env = attacked(API_TOKEN="s3cret-token", OPENSSL_CONF="/nonexistent/openssl.cnf", HIP_VISIBLE_DEVICES="0")
    proc = private_namespace.run(
        [*private_namespace.tool_command(), "experiment", "--python", str(python)], env, tmp_path
    )
    assert "is not a Python with torch" in one_error_line(proc)
    uid, *lines = dump.read_text().splitlines()
    seen = environment_of("\n".join(lines))
    assert uid == str(NOBODY_UID)  # the owner's Python runs as its owner
    assert "API_TOKEN" not in seen and "OPENSSL_CONF" not in seen
    assert seen["HOME"] == "/nonexistent" and seen["HIP_VISIBLE_DEVICES"] == "0"  # the owner's stack settings pass


# Each program, where the runner finds it, gets a wrapper that writes its environment before it runs.
SPREAD = {
    "dkms": ["dkms", "status"],
    "openssl": ["openssl", "version"],
    "apt-get": ["apt-get", "-s", "check"],
    "modprobe": ["modprobe", "--showconfig"],
    "qemu-system-x86_64": ["qemu-system-x86_64", "--version"],
}
DRIVER = """
import sys
from pathlib import Path
from rdna1_kmgr.core import program_env, runner
from rdna1_kmgr.core.owner import Owner
spread, python, log = sys.argv[1], sys.argv[2], Path(sys.argv[3])
import json
for argv in json.loads(spread):
    if argv[0] == "qemu-system-x86_64":
        runner.run_session(argv, log / "qemu.out", timeout=60)
    else:
        runner.run(argv, check=False, env={"DEBIAN_FRONTEND": "noninteractive"} if argv[0] == "apt-get" else None)
owner = Owner("nobody", 65534, 65534, "/nonexistent")
runner.run([python, "-c", "pass"], check=False, env=program_env.for_owner(), as_user=owner, cwd="/")
"""


@private_namespace.NEEDS
def test_a_spread_of_programs_root_starts_each_sees_the_allow_list_only(tmp_path, user_tmp):
    found = {name: shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin") for name in SPREAD}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        pytest.skip(f"not installed here: {' '.join(missing)}")
    log = tmp_path / "log"
    log.mkdir()
    binds = []
    for name, path in found.items():
        real = tmp_path / "real" / name  # the program itself, reachable under its own name
        real.parent.mkdir(exist_ok=True)
        real.touch()
        wrapper = tmp_path / "wrappers" / name
        wrapper.parent.mkdir(exist_ok=True)
        wrapper.write_text(f'#!/bin/sh\n/usr/bin/env > {log / name}.env\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
        binds += [(Path(os.path.realpath(str(path))), str(real)), (wrapper, str(path))]
    folder = user_tmp("spread")
    python = owners_venv(folder, folder / "seen")
    env = attacked(**HOSTILE, MAIL="/var/mail/root")
    driver = [sys.executable, "-I", "-c", DRIVER, json.dumps(list(SPREAD.values())), str(python), str(log)]
    proc = private_namespace.run(driver, env, tmp_path / "ns", binds=tuple(binds))
    assert proc.returncode == 0, proc.stderr
    seen = {name: environment_of((log / f"{name}.env").read_text()) for name in SPREAD}
    seen["the owner's python"] = environment_of("\n".join((folder / "seen").read_text().splitlines()[1:]))
    for name, env_seen in seen.items():
        assert not set(HOSTILE) - {"PYTHONPATH", "LD_LIBRARY_PATH"} & set(env_seen), (name, env_seen)
        assert "MAIL" not in env_seen, name
        if name != "the owner's python":
            assert not set(HOSTILE) & set(env_seen) and env_seen["HOME"] == "/root", (name, env_seen)
            assert set(env_seen) <= {"PATH", "HOME", "LANG", "TERM", "PWD", "SHLVL", "_", "DEBIAN_FRONTEND"} | {
                k for k in env_seen if k.startswith("LC_")
            }, (name, sorted(env_seen))
    assert seen["apt-get"]["DEBIAN_FRONTEND"] == "noninteractive"  # what the caller names for that program passes
    assert seen["the owner's python"]["HOME"] == "/nonexistent"
