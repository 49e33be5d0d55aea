"""Ubuntu end to end as far as this Debian machine allows: `rdna1-kmgr build --dry-run --json` on an
Ubuntu-shaped sysroot finds the kernel's source package through apt (a local file:// repository serving
noble, noble-updates and noble-security, named by APT_CONFIG as a system's sources would), downloads it with
real apt, checks its version is the kernel's, unpacks the amd subset, renders and applies the series, and
names the MOK it signs with. The package is Ubuntu's layout around the real Debian amd subset (see
tests/ubuntu_fixtures.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from apt_fixtures import apt_config, build_repository
from conftest import persistent_cache_root
from ubuntu_fixtures import ubuntu_linux_source_deb, ubuntu_sysroot

from rdna1_kmgr.source import kernel_source

SUITES = ("noble", "noble-updates", "noble-security")
ABI = "42"  # a made-up Ubuntu ABI: the fixture's build of the real Linux version Debian's tree has


@pytest.fixture(scope="module")
def ubuntu_source_deb(real_source_61) -> tuple[Path, str, str]:
    """(the .deb, its Ubuntu version, the Linux version) — built once per machine into the test cache."""
    upstream = str(kernel_source.kernel_version(real_source_61))
    base = ".".join(upstream.split(".")[:2]) + ".0"
    version = f"{base}-{ABI}.{ABI}"
    out = persistent_cache_root() / "fixtures" / "ubuntu" / real_source_61.name
    out.mkdir(parents=True, exist_ok=True)
    return ubuntu_linux_source_deb(real_source_61, out, base, version), version, upstream


@pytest.fixture
def ubuntu_host(tmp_path, ubuntu_source_deb):
    """The sysroot, the environment naming its apt sources, and the fixture's versions."""
    deb, version, upstream = ubuntu_source_deb
    repo = tmp_path / "repo"
    build_repository(repo, "noble-updates", [deb])  # the upload sits in -updates, like a current GA kernel
    for suite in ("noble", "noble-security"):
        build_repository(repo, suite, [])
    sources = "".join(f"deb [trusted=yes] file://{repo} {suite} main restricted\n" for suite in SUITES)
    # The repository lives in pytest's root-only folder: let apt read it as root, not as _apt.
    conf = apt_config(tmp_path, sources_list=sources, extra='APT::Sandbox::User "root";\n')
    release = f"{version.split('.')[0]}.{version.split('.')[1]}.0-{ABI}-generic"
    root = ubuntu_sysroot(tmp_path / "sysroot", release, version, upstream, update_secureboot_policy=True)
    env = {**os.environ, "APT_CONFIG": str(conf), "RDNA1_KMGR_CACHE": str(tmp_path / "cache")}
    return {
        "root": root,
        "env": env,
        "release": release,
        "version": version,
        "upstream": upstream,
        "deb": deb,
        "cache": tmp_path / "cache",
    }


def cli(*args, env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "rdna1-kmgr"), *args], capture_output=True, text=True, env=env, timeout=1200
    )


def test_ubuntu_build_dry_run_names_the_source_package_its_version_and_the_mok(ubuntu_host):
    h = ubuntu_host
    proc = cli("build", "--dry-run", "--json", "--sysroot", str(h["root"]), env=h["env"])
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["system"]["family"] == "ubuntu" and result["system"]["codename"] == "noble"
    assert result["kernel"] == {"release": h["release"], "package_version": h["version"], "upstream": h["upstream"]}
    source = result["source"]
    assert (source["package"], source["version"], source["suite"]) == (
        f"linux-source-{h['release'].split('-')[0]}",
        h["version"],
        "noble-updates",
    )
    assert source["version"] == result["kernel"]["package_version"]
    assert result["signing"]["key"] == "/var/lib/shim-signed/mok/MOK.priv"
    assert result["signing"]["cert"] == "/var/lib/shim-signed/mok/MOK.der"
    assert result["signing"]["convention"] == "ubuntu"
    rendered = result["render"]
    assert rendered["applies"] and rendered["patches"] >= 2 and rendered["kernel_version"] == h["upstream"]
    assert "drivers/gpu/drm/amd/amdgpu/gmc_v10_0.c" in rendered["files"]
    # Downloaded with apt into the (test's) cache, unpacked there as the package's version, the .deb then deleted.
    tree = Path(source["tree"])
    assert tree == h["cache"] / "src" / h["version"]
    assert not (h["cache"] / "debs" / h["deb"].name).exists()  # unpacked, so deleted (issue 27)
    origin = kernel_source.source_origin(tree)
    assert origin["package"] == source["package"] and origin["debian_version"] == h["version"]
    assert origin["archive"] == h["deb"].name and origin["kernel_version"] == h["upstream"]
    assert "from noble-updates" in proc.stderr or "downloading" in proc.stderr
    text = "\n".join(result["plan"])
    assert f"from {source['package']} {h['version']}, noble-updates" in text
    assert "not checked (sysroot" in text and f"linux-headers-{h['release']}" in text
    # The fixture's tree has no exact CWSR check (as Ubuntu 24.04's 6.8 has none): nothing is on by default.
    assert "no kernel change needed by default" in text


def test_ubuntu_build_dry_run_refuses_a_build_the_archive_does_not_have(ubuntu_host, tmp_path):
    h = ubuntu_host
    other = h["version"].replace(f"-{ABI}.{ABI}", f"-{ABI}.{int(ABI) + 1}")  # same ABI, a later upload
    root = ubuntu_sysroot(tmp_path / "other", h["release"], other, h["upstream"])
    proc = cli("build", "--dry-run", "--json", "--sysroot", str(root), env=h["env"])
    assert proc.returncode == 3, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("rdna1-kmgr: error: Ubuntu's archive has no linux-source-")
    assert f" {other} (searched noble-security, noble-updates, noble)" in last
    assert not (h["cache"] / "src" / other).exists()


def test_ubuntu_keys_status_and_enrolment_follow_ubuntus_mok(tmp_path):
    h = {
        "root": ubuntu_sysroot(
            tmp_path / "sysroot", "6.8.0-48-generic", "6.8.0-48.48", "6.8.12", update_secureboot_policy=True
        ),
        "env": {**os.environ, "RDNA1_KMGR_CACHE": str(tmp_path / "cache")},
    }
    proc = cli("keys", "status", "--json", "--sysroot", str(h["root"]), env=h["env"])
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    assert (status["key"], status["cert"], status["convention"]) == (
        "/var/lib/shim-signed/mok/MOK.priv",
        "/var/lib/shim-signed/mok/MOK.der",
        "ubuntu",
    )
    assert status["key_exists"] is False and status["enroll_command"] == ["update-secureboot-policy", "--enroll-key"]
    proc = cli("keys", "enroll", "--dry-run", "--sysroot", str(h["root"]), env=h["env"])
    assert proc.returncode == 0 and proc.stdout.splitlines()[0] == "update-secureboot-policy --enroll-key"
    # Without shim-signed's program: mokutil on Ubuntu's certificate.
    (h["root"] / "usr/sbin/update-secureboot-policy").unlink()
    proc = cli("keys", "enroll", "--dry-run", "--sysroot", str(h["root"]), env=h["env"])
    assert proc.stdout.splitlines()[0] == "mokutil --import /var/lib/shim-signed/mok/MOK.der"
    refused = cli("keys", "enroll", "--sysroot", str(h["root"]), env=h["env"])
    assert refused.returncode == 2 and "--sysroot is for --dry-run" in refused.stderr
    refused = cli("build", "--sysroot", str(h["root"]), env=h["env"])
    assert refused.returncode == 2 and "--sysroot is for --dry-run" in refused.stderr
