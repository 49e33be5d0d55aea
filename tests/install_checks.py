"""What install, rollback and follow tests check on a system, shared by tests/install and tests/follow.

"Nothing changed" is a hash of what an install touches (the kernel's /lib/modules/KREL: paths, types, link
targets, modes, contents; /etc/modprobe.d; the initramfs's file list), taken before and compared after.
"""

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from rdna1_kmgr.follow import hooks
from rdna1_kmgr.install import journal as jr
from rdna1_kmgr.install.install_begin import InstallBegin
from rdna1_kmgr.install.journal_records import Commit, Done
from rdna1_kmgr.install.target_root import ROOT_ENV
from rdna1_kmgr.vm import verdict


def tree_digest(top: Path) -> dict[str, str]:
    """Every entry below `top`: its type, mode and content hash (or link target). Links are not followed."""
    found = {}
    if not top.exists():
        return found
    for folder, dirs, files in os.walk(top):
        base = Path(folder)
        for name in sorted(dirs + files):
            path = base / name
            rel = str(path.relative_to(top))
            st = path.lstat()
            if path.is_symlink():
                found[rel] = f"link {os.readlink(path)}"
            elif path.is_dir():
                found[rel] = f"dir {st.st_mode & 0o7777:o}"
            else:
                digest = hashlib.sha256()
                with open(path, "rb") as handle:
                    for block in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(block)
                found[rel] = f"file {st.st_mode & 0o7777:o} {digest.hexdigest()}"
        dirs[:] = [d for d in dirs if not (base / d).is_symlink()]
    return found


def initramfs_list(image: Path) -> list[str] | None:
    if not image.exists():
        return None
    out = subprocess.run(["lsinitramfs", str(image)], capture_output=True, text=True, check=True).stdout
    return sorted(out.splitlines())


def system_hash(root: Path, kernel: str) -> dict:
    return {
        "modules": tree_digest(root / "lib/modules" / kernel),
        "modprobe.d": tree_digest(root / "etc/modprobe.d"),
        "initramfs": initramfs_list(root / "boot" / f"initrd.img-{kernel}"),
    }


def assert_same_system(before: dict, after: dict) -> None:
    """Equal, or a readable list of what differs (the dicts are thousands of entries on a real kernel)."""
    problems = []
    for part in before:
        b, a = before[part], after[part]
        if b == a:
            continue
        if isinstance(b, dict) and isinstance(a, dict):
            for key in sorted(set(b) | set(a)):
                if b.get(key) != a.get(key):
                    problems.append(f"{part}: {key}: {b.get(key)} -> {a.get(key)}")
        else:
            problems.append(
                f"{part}: {len(b or [])} entries -> {len(a or [])} "
                f"(+{sorted(set(a or []) - set(b or []))[:5]} -{sorted(set(b or []) - set(a or []))[:5]})"
            )
    assert not problems, "the system differs:\n" + "\n".join(problems[:40])


def verdict_record(sha256: str, kernel: str, result: str = "pass") -> verdict.Record:
    return verdict.Record(
        verdict=result,
        reason="all checks passed" if result == "pass" else "selftest: 0 passed",
        mode="emulated",
        kernel=kernel,
        module="(test)",
        module_sha256=sha256,
        accel="tcg",
        checks=[],
        selftest={"passed": 4, "failed": 0, "required": 4},
        console_log=None,
        seconds=1.0,
        started="2025-01-01T00:00:00",
        tool_version="test",
    )


def ensure_image_installed(kernel: str) -> bool:
    """The kernel's image package installed, as on a user's machine (its postinst makes the initramfs); True
    when this call installed it (whoever did should purge it again: see purge_image)."""
    package = f"linux-image-{kernel}"
    query = subprocess.run(
        ["dpkg-query", "--show", "--showformat=${db:Status-Abbrev}", package], capture_output=True, text=True
    )
    if query.returncode == 0 and query.stdout.startswith("ii"):
        return False
    if os.geteuid() != 0:
        pytest.skip(f"installing {package} needs root")
    proc = subprocess.run(
        ["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", "-q", "--no-install-recommends", package],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )
    if proc.returncode != 0:
        pytest.fail(f"apt-get install {package} failed: {proc.stderr[-2000:]}")
    return True


def purge_image(kernel: str, scratch: Path) -> None:
    """Purge the image package a test installed, so that the machine is left as the tests found it (a kernel
    whose image is not installed is what tests/vm/test_fresh_machine.py needs).

    The kernel's postrm runs rdna1-kmgr's own hook, which drops what rdna1-kmgr keeps for a removed kernel,
    the DKMS build included; here that build is the session's shared one, still wanted by later tests, so the
    hook is pointed at scratch trees (dpkg passes the environment on to the kernel hooks)."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for name in (
        "RDNA1_KMGR_STATE",
        "RDNA1_KMGR_CACHE",
        "RDNA1_KMGR_LOG",
        "RDNA1_KMGR_DKMS_TREE",
        "RDNA1_KMGR_DKMS_SOURCE_TREE",
    ):
        env[name] = str(scratch / name.lower())
        Path(env[name]).mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["apt-get", "-o", "DPkg::Lock::Timeout=600", "purge", "-y", "-q", f"linux-image-{kernel}"],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    assert proc.returncode == 0, f"apt-get purge linux-image-{kernel} failed: {proc.stderr[-2000:]}"


def modinfo_resolves(kernel: str) -> Path:
    out = subprocess.run(["modinfo", "-k", kernel, "-n", "amdgpu"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def snapshot_hooks() -> dict[Path, bytes | str | None]:
    """The kernel and apt hooks as they are on this machine, for restore_hooks once a test placed its own."""
    saved = {}
    for hook in hooks.HOOKS:
        path = Path("/") / hook.where
        saved[path] = os.readlink(path) if path.is_symlink() else path.read_bytes() if path.exists() else None
    return saved


def restore_hooks(saved: dict) -> None:
    for path, was in saved.items():
        path.unlink(missing_ok=True)
        if isinstance(was, str):
            path.symlink_to(was)
        elif was is not None:
            path.write_bytes(was)
            path.chmod(0o755 if "/etc/kernel/" in str(path) else 0o644)


# Fixtures of the tests of several kernels' installs (rollback's order, the shared files): imported by name.


@pytest.fixture
def journal_root(tmp_path, monkeypatch):
    """A scratch target root, with the tool's state, caches and DKMS trees beside it."""
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("RDNA1_KMGR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("RDNA1_KMGR_DKMS_SOURCE_TREE", str(tmp_path / "usr-src"))
    monkeypatch.setenv("RDNA1_KMGR_DKMS_TREE", str(tmp_path / "dkms"))
    root = tmp_path / "root"
    (root / "etc/modprobe.d").mkdir(parents=True)
    monkeypatch.setenv(ROOT_ENV, str(root))
    return root


@pytest.fixture
def install_writing(monkeypatch):
    """`install_writing(kernel, at, path, content)`: one kernel's install as its journal has it, begun at `at`: it
    writes `path` (the stock loader's modprobe rule, say: a file every kernel's install shares), backing up what
    was there."""

    def install(kernel: str, at: str, path, content: str) -> None:
        monkeypatch.setattr(jr, "_now", lambda: at)
        journal = jr.Journal(kernel)
        journal.begin(InstallBegin(kernel=kernel, root=os.environ[ROOT_ENV]))  # no DKMS package to remove
        journal.record_intent("stock-loader", None, [path], [])
        path.write_text(content)
        journal.append(Done("stock-loader"))
        journal.append(Commit())

    return install
