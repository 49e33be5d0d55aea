"""`rdna1-kmgr build`: the package half with real DKMS on a tiny module, the command's refusals (each one line,
a non-zero exit, nothing left behind), and the real amdgpu builds (marked realbuild)."""

import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import replace
from pathlib import Path

import fake_kernel
import hellomod
import pytest
from dkms_helpers import make_keys, make_sandbox

from rdna1_kmgr.core import progress
from rdna1_kmgr.core.errors import BuildError
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.modbuild import module_build, module_checks, package_build

# real dkms, apt/dpkg, a CPU PyTorch or killed process trees on fixtures: seconds each, out of the fast tier
pytestmark = pytest.mark.system

CLI = str(Path(sys.executable).parent / "rdna1-kmgr")


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    keys_dir = tmp_path / "keys"
    keys_dir.mkdir()
    return make_sandbox(tmp_path, monkeypatch, make_keys(keys_dir))


def hello_build(sandbox, word: str, keys=None, patch: str | None = None):
    out = sandbox.root / f"series-{word}"
    if not out.exists():
        hellomod.write_series(out, {"0001-greet.patch": patch or hellomod.greeting_patch(word)})
    manifest = json.loads((out / "manifest.json").read_text())
    package = sandbox.package(manifest)
    with open(os.devnull, "w") as quiet, progress.reporting_to(quiet):
        return package_build.build_package(
            package,
            sandbox.kernel,
            sandbox.root / "tree",
            [hellomod.LOCATION],
            out,
            keys or sandbox.keys,
            [0x731F],
            ["rdna1_hello_enable"],
            jobs=2,
            trees=sandbox.trees,
        )


# --- the package half, real DKMS ----------------------------------------------------------------------


def test_the_same_build_again_is_reused(sandbox):
    first = hello_build(sandbox, "greetings-reused")
    assert not first.reused and first.compiled >= 2 and first.log.is_file()
    again = hello_build(sandbox, "greetings-reused")
    assert again.reused and again.compiled == 0 and again.log is None
    assert again.module == first.module and again.report.sha256 == first.report.sha256


def ccache_stats(folder: Path) -> dict[str, int]:
    """ccache's own counters for `folder` (`--print-stats`: one `name<TAB>value` a line)."""
    out = subprocess.run(
        ["ccache", "--print-stats"], env={**os.environ, "CCACHE_DIR": str(folder)}, capture_output=True, text=True
    ).stdout
    return {k: int(v) for k, v in (line.split("\t") for line in out.splitlines()) if v.isdigit()}


def test_a_fresh_kbuild_tree_takes_the_unchanged_objects_from_the_compiler_cache(sandbox):
    """What a point release's build gets (issue 27): its kbuild tree starts empty, and main.c is the same as in
    the last build, so its object comes from ccache; table.c, which the new patch changes, is compiled."""
    hello_build(sandbox, "greetings-cold")
    folder = sandbox.cache / "ccache"
    # the cap and the compression level, written once; ccache reads them as its own settings
    assert (folder / "ccache.conf").read_text() == "max_size = 1.0G\ncompression_level = 8\n"
    shown = subprocess.run(
        ["ccache", "--show-config"], env={**os.environ, "CCACHE_DIR": str(folder)}, capture_output=True
    )
    assert b"(" + bytes(folder / "ccache.conf") + b") compression_level = 8" in shown.stdout
    before = ccache_stats(folder)
    shutil.rmtree(sandbox.cache / "kbuild")  # a new kernel release's tree: nothing to reuse in place
    warm = hello_build(sandbox, "greetings-warm")
    after = ccache_stats(folder)
    assert warm.compiled >= 2  # main.o and table.o both compiled by kbuild again, in the fresh tree
    hits = after["direct_cache_hit"] - before["direct_cache_hit"]
    misses = after["cache_miss"] - before["cache_miss"]
    assert hits >= 1 and misses == 1, (hits, misses)  # main.o from the cache; only table.o (changed) compiled
    again = hello_build(sandbox, "greetings-warm")
    assert again.reused and ccache_stats(folder) == after  # reused whole: ccache not even asked
    from rdna1_kmgr.follow.status import Certificate, StatusReport, compiler_cache, text_lines

    held = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    line = next(
        x
        for x in text_lines(StatusReport("?", Certificate("c", "e"), [], {}, None, compiler_cache()))
        if x.startswith("ccache")
    )
    assert line == f"ccache        {held / 1e6:.0f} MB of 1.0G in {folder}"  # what `status` prints


@pytest.mark.realbuild
def test_a_point_release_build_takes_its_objects_from_the_compiler_cache(sandbox, headers_61_point_release):
    """Issue 27, the real upgrade pair: Debian's 6.1.0-55 and 6.1.0-56 are the same Linux 6.1.192 under two ABI
    names. Their headers differ in names only (read by hand in the two packages: CONFIG_BUILD_SALT, the release,
    LINUX_PACKAGE_ID, and the -common folder's name in every include path). So the newer kernel's build of the
    same patch set compiles, in a fresh kbuild tree, only what carries the release: the module's .mod.c (its
    vermagic); main.o and table.o come from the cache, by direct lookup (no preprocessor run: rdna1-kbuild keeps
    the build salt out of ccache's key)."""
    older, newer = headers_61_point_release
    first = hello_build(replace(sandbox, kernel=older), "greetings-point")
    assert "building in the version-neutral view" in first.log.read_text()
    folder = sandbox.cache / "ccache"
    before = ccache_stats(folder)
    second = hello_build(replace(sandbox, kernel=newer), "greetings-point")
    after = ccache_stats(folder)
    assert second.kernel == newer and not second.reused and second.compiled >= 2
    direct = after["direct_cache_hit"] - before.get("direct_cache_hit", 0)
    misses = after["cache_miss"] - before["cache_miss"]
    assert misses == 1 and direct >= 2, (direct, misses, after)
    assert (
        f"vermagic:       {newer} "
        in subprocess.run(["modinfo", str(second.module)], capture_output=True, text=True, check=True).stdout
    )  # the module is the newer kernel's, not the older one's object taken whole


def test_a_new_patch_set_replaces_the_older_build_for_that_kernel(sandbox):
    old = hello_build(sandbox, "greetings-old")
    new = hello_build(sandbox, "greetings-new")
    assert new.removed == [old.package.version]
    versions = [(e.version, e.kernel, e.state) for e in dkms.status("rdna1hello", sandbox.trees)]
    assert versions == [(new.package.version, sandbox.kernel, "built")]
    assert not old.package.source_dir(sandbox.trees).exists()
    assert new.compiled == 1  # incremental: only the patched file


def test_a_build_signed_with_another_key_is_built_again(sandbox):
    first = hello_build(sandbox, "greetings-rekey")
    other_dir = sandbox.root / "other-keys"
    other_dir.mkdir()
    other = make_keys(other_dir, subject="another key")
    again = hello_build(sandbox, "greetings-rekey", keys=other)
    assert not again.reused
    assert again.report.signer == "another key"
    module_checks.verify_signature(again.module, other.cert)
    with pytest.raises(BuildError):
        module_checks.verify_signature(again.module, first.keys.cert)


def test_a_failed_build_leaves_nothing_in_the_dkms_trees_or_the_cache(sandbox):
    with pytest.raises(BuildError, match=r"^compile error: .*table\.c:13:\d+: error: expected"):
        hello_build(sandbox, "broken", patch=hellomod.BROKEN_C_PATCH)
    assert sandbox.leftovers() == []
    logs = list(sandbox.logs.iterdir())
    assert len(logs) == 1 and "error: expected" in logs[0].read_text()


def test_a_failure_after_an_earlier_good_build_keeps_that_build(sandbox):
    good = hello_build(sandbox, "greetings-good")
    with pytest.raises(BuildError, match="does not apply"):
        hello_build(sandbox, "stale", patch=hellomod.NOT_APPLYING_PATCH)
    versions = [(e.version, e.state) for e in dkms.status("rdna1hello", sandbox.trees)]
    assert versions == [(good.package.version, "built")]
    assert [p.name for p in sandbox.trees.source.iterdir()] == [good.package.source_dir(sandbox.trees).name]
    module_checks.verify(good.module, sandbox.kernel, sandbox.keys.cert, [0x731F])


def test_installed_older_versions_are_left_to_install(monkeypatch):
    """Unit (fake DKMS status): only built versions for the same kernel go."""
    entries = [
        dkms.StatusEntry("rdna1-amdgpu", "6.1.192+pnew", "K", "x86_64", "built"),
        dkms.StatusEntry("rdna1-amdgpu", "6.1.192+pold1", "K", "x86_64", "built"),
        dkms.StatusEntry("rdna1-amdgpu", "6.1.192+pold2", "K", "x86_64", "installed"),
        dkms.StatusEntry("rdna1-amdgpu", "6.1.192+pold3", "OTHER", "x86_64", "built"),
        dkms.StatusEntry("rdna1-amdgpu", "6.1.192+pold4", None, None, "added"),
    ]
    removed = []
    monkeypatch.setattr(dkms, "status", lambda name, trees: entries)
    monkeypatch.setattr(dkms, "remove", lambda package, trees, kernel=None: removed.append((package.version, kernel)))
    result = package_build._remove_older(dkms.Package("rdna1-amdgpu", "6.1.192+pnew"), "K", dkms.Trees())
    assert result == (["6.1.192+pold1"], ["6.1.192+pold2"])
    assert removed == [("6.1.192+pold1", "K")]


def test_series_parameters_come_from_the_patches(tmp_path):
    hellomod.write_series(
        tmp_path / "s",
        {
            "0001-a.patch": "--- a/x.c\n+++ b/x.c\n@@ -1 +1,2 @@\n x\n+module_param_named(rdna1_quirks, q, uint, 0444);\n",
            "0002-b.patch": "--- a/y.c\n+++ b/y.c\n@@ -1 +1,2 @@\n module_param(rdna1_old, x, int, 0);\n+module_param(rdna1_selftest, t, bool, 0444);\n",
        },
    )
    assert module_build.series_parameters(tmp_path / "s") == ["rdna1_quirks", "rdna1_selftest"]


def test_headers_installed_by_the_prerequisites_give_the_kernel_its_version_and_upstream(monkeypatch, tmp_path):
    # Ubuntu says the Linux version in the headers' version_signature: known only once they are installed, and
    # then kept with the package version (the source check compares the tree against it).
    monkeypatch.setattr(module_build.prerequisites, "ensure_prerequisites", lambda *a, **k: None)
    monkeypatch.setattr(module_build.distro_source, "kernel_package", lambda release, system: ("6.8.0-48.48", "6.8.12"))
    kernel = module_build.Kernel("6.8.0-48-generic", None, note="chosen for you")
    ctx = module_build.BuildContext(module_build.BuildRequest(kernel=kernel), None, kernel, None, tmp_path)
    module_build.PrerequisitesStage().run(ctx)
    assert ctx.kernel == module_build.Kernel("6.8.0-48-generic", "6.8.0-48.48", "chosen for you", "6.8.12")


# --- the command's refusals -----------------------------------------------------------------------------


def run_cli(sandbox, *args: str) -> subprocess.CompletedProcess:
    key_args = ["--key", str(sandbox.keys.key), "--cert", str(sandbox.keys.cert)]
    return subprocess.run(
        [CLI, "build", *args, *key_args], capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL
    )


def assert_refused(result, code: int, *needles: str):
    """Refused with one error line, the last thing said (progress lines, e.g. of apt, may come before)."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, result.stderr
    errors = [line for line in lines if "error" in line.lower()]
    assert errors == [lines[-1]], result.stderr
    assert lines[-1].startswith("rdna1-kmgr: error: ")
    for needle in needles:
        assert needle in lines[-1]
    assert result.stdout == ""


@pytest.mark.parametrize("release", ["6.1/../x", "../../etc", "6.1.0-56-amd64/", "..", "not a release"])
def test_a_release_with_a_slash_or_dots_is_refused(sandbox, release):
    assert_refused(run_cli(sandbox, "--kernel", release, "--no-install"), 2, "invalid kernel release")
    assert sandbox.leftovers() == []


def test_an_unknown_kernel_release_is_refused(sandbox):
    assert_refused(run_cli(sandbox, "--kernel", "9.9.9-1-amd64", "--no-install"), 4, "linux-headers-9.9.9-1-amd64")
    assert sandbox.leftovers() == []


def test_missing_headers_with_no_install_name_the_package(sandbox):
    abi = sandbox.kernel.rsplit("-", 1)[0]  # 6.1.0-56-amd64 -> 6.1.0-56
    release = f"{abi}-cloud-amd64"  # same ABI, a flavour this machine does not have
    if Path(f"/lib/modules/{release}/build").exists():
        pytest.skip(f"{release} headers are installed here")
    assert_refused(
        run_cli(sandbox, "--kernel", release, "--no-install"), 4, f"missing packages: linux-headers-{release}"
    )
    assert sandbox.leftovers() == []


def test_source_of_another_version_is_refused_with_both_versions(sandbox):
    tree = fake_kernel.make_tree(sandbox.root / "other", version="6.1.191")
    result = run_cli(sandbox, "--kernel", sandbox.kernel, "--no-install", "--source", str(tree))
    assert sandbox.kernel_version != "6.1.191"
    assert_refused(result, 3, "Linux 6.1.191", f"Linux {sandbox.kernel_version}")
    assert sandbox.leftovers() == []


def _tarball(sandbox, name: str) -> Path:
    top = f"linux-{sandbox.kernel_version}"
    tree = fake_kernel.make_tree(sandbox.root / "t" / top, version=sandbox.kernel_version)
    path = sandbox.root / name
    with tarfile.open(path, "w:xz") as tar:
        tar.add(tree, arcname=top)
    return path


def test_a_tarball_with_a_wrong_sha256_is_refused(sandbox):
    tarball = _tarball(sandbox, "linux-6.1.192.tar.xz")
    result = run_cli(
        sandbox, "--kernel", sandbox.kernel, "--no-install", "--source", str(tarball), "--sha256", "0" * 64
    )
    assert_refused(result, 3, "SHA-256", "0" * 64)
    assert sandbox.leftovers() == []


def test_a_truncated_tarball_is_refused(sandbox):
    tarball = _tarball(sandbox, "linux-6.1.192.tar.xz")
    cut = sandbox.root / "cut-6.1.192.tar.xz"
    cut.write_bytes(tarball.read_bytes()[: tarball.stat().st_size // 2])
    result = run_cli(sandbox, "--kernel", sandbox.kernel, "--no-install", "--source", str(cut))
    assert_refused(result, 3, "cut-6.1.192.tar.xz")
    assert sandbox.leftovers() == []


def test_a_source_the_series_does_not_fit_is_refused(sandbox):
    tree = fake_kernel.make_tree(sandbox.root / "src", version=sandbox.kernel_version, omit="gmc_v10_0_get_vm_pte")
    # asked for by id, the opt-in quirk must fit (left to the default it would be left out, see test_patch_series)
    result = run_cli(
        sandbox, "--kernel", sandbox.kernel, "--no-install", "--source", str(tree), "--quirk", "coarse-mtype"
    )
    assert_refused(result, 3, "gmc_v10_0_get_vm_pte")
    assert sandbox.leftovers() == []


def test_a_compile_error_prints_the_first_compiler_error_and_the_log(sandbox):
    """The fake tree renders and patches, then fails in the compiler: real DKMS, real kbuild."""
    tree = fake_kernel.make_tree(sandbox.root / "src", version=sandbox.kernel_version)
    result = run_cli(sandbox, "--kernel", sandbox.kernel, "--no-install", "--source", str(tree), "-j", "2")
    err = result.stderr.strip().splitlines()
    assert result.returncode == 5, result.stderr
    # a 6.1-shaped tree: its KFD has no CWSR size check, so cwsr-size is left out in one line and the build goes on
    assert [line for line in err if "left out" in line] == [
        "rdna1-kmgr: quirk cwsr-size left out: nothing to fix on this kernel: "
        "drivers/gpu/drm/amd/amdkfd/kfd_queue.c not found",
        "rdna1-kmgr: quirk topology-sizes left out: nothing to fix on this kernel: "
        "drivers/gpu/drm/amd/amdkfd/kfd_queue.c not found",
    ]
    # and with it no bit is on by default: said in one line before the compile (issue 37)
    nothing = [line for line in err if "changes nothing" in line]
    assert nothing == [NOTHING_ON_61] and err.index(nothing[0]) < err.index(next(x for x in err if "building" in x))
    # progress lines first (a pipe: plain lines), then the one error line
    assert err[-1].startswith("rdna1-kmgr: error: compile error: ")
    assert ": error: " in err[-1] and "whole log: " in err[-1]
    log = Path(err[-1].split("whole log: ", 1)[1])
    assert log.is_file() and log.parent == sandbox.logs
    assert sandbox.leftovers() == []


# The catalog's opt-in bits (kmod/quirks/*/quirk.toml: crat-mem bit 1, coarse-mtype's classes bits 2 and 3);
# cwsr-size, the one default-on bit, has nothing to fix on 6.1.
NOTHING_ON_61 = (
    "rdna1-kmgr: no kernel change needed by default: the patched module changes nothing here until you switch "
    "an opt-in bit on: crat-mem (0x2), coarse-mtype-vram (0x4), coarse-mtype-host (0x8) "
    "(`rdna1-kmgr install --quirks MASK`; `rdna1-kmgr doctor` says what to check)"
)


def test_dry_run_prints_the_exact_plan_and_changes_nothing(sandbox):
    tree = fake_kernel.make_tree(sandbox.root / "src", version=sandbox.kernel_version)
    result = run_cli(sandbox, "--kernel", sandbox.kernel, "--no-install", "--source", str(tree), "--dry-run")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    plan = text.splitlines()
    # this machine has no RDNA1 board: the RX 5600 XT's id, said so; on 6.1 nothing is on by default, said
    # before the steps that do the work
    assert plan[1] == "devices 0x731F (no RDNA1 board found here: the RX 5600 XT's; --device names others)"
    assert plan[2].startswith("quirk cwsr-size left out: nothing to fix on this kernel: ")
    assert plan[3].startswith("quirk topology-sizes left out: nothing to fix on this kernel: ")
    assert plan[4] == NOTHING_ON_61.removeprefix("rdna1-kmgr: ")
    assert f"kernel {sandbox.kernel}" in text
    assert f"dkms add -m rdna1-amdgpu -v {sandbox.kernel_version}+p" in text
    assert f"-k {sandbox.kernel} -j" in text and f"--dkmstree={sandbox.trees.dkms}" in text
    assert f"sign with {sandbox.keys.key}" in text
    assert sandbox.leftovers() == []


def test_contradicting_options_are_refused(sandbox):
    assert_refused(run_cli(sandbox, "--yes", "--no-install"), 2, "contradict")
    assert_refused(run_cli(sandbox, "-j", "0"), 2, "job count")
    assert_refused(run_cli(sandbox, "--sha256", "0" * 64), 2, "--sha256 needs --source")
    assert_refused(
        run_cli(
            sandbox,
            "--device",
            "0x1234",
            "--no-install",
            "--kernel",
            sandbox.kernel,
            "--source",
            str(fake_kernel.make_tree(sandbox.root / "s", version=sandbox.kernel_version)),
        ),
        2,
        "0x1234",
    )


# --- the real amdgpu builds ------------------------------------------------------------------------------


def check_real_module(result: dict, release: str) -> None:
    """What a user checks, with the tools a user has: modinfo, sha256sum, openssl against the JSON's certificate."""
    for key in (
        "kernel",
        "module",
        "sha256",
        "certificate",
        "signer",
        "package_version",
        "quirks",
        "devices",
        "seconds",
    ):
        assert key in result
    module, cert = Path(result["module"]), Path(result["certificate"])
    assert result["kernel"] == release and module.is_file() and cert.is_file()
    assert (
        subprocess.run(["sha256sum", str(module)], capture_output=True, text=True).stdout.split()[0] == result["sha256"]
    )

    def modinfo(field):
        return subprocess.run(["modinfo", "-F", field, str(module)], capture_output=True, text=True).stdout.split("\n")

    assert modinfo("vermagic")[0].split()[0] == release
    params = {line.split(":", 1)[0] for line in modinfo("parm") if line}
    assert {"rdna1_quirks", "rdna1_selftest"} <= params
    assert "pci:v00001002d0000731Fsv*sd*bc*sc*i*" in modinfo("alias")
    assert modinfo("signer")[0] == result["signer"]
    assert result["devices"] == ["0x731F"] and result["quirks"]
    assert result["package_version"].startswith(result["kernel_version"] + "+p")

    # The appended signature, checked with openssl (struct module_signature: sig_len is the last 4 bytes).
    # DKMS compresses the module like the kernel's own (6.12 on Debian: .ko.xz); the signature is inside.
    if module.suffix == ".xz":
        data = subprocess.run(["xz", "-dc", str(module)], capture_output=True, check=True).stdout
    else:
        data = module.read_bytes()
    magic = b"~Module signature appended~\n"
    assert data.endswith(magic)
    sig_len = struct.unpack(">I", data[-len(magic) - 4 : -len(magic)])[0]
    sig_end = len(data) - len(magic) - 12
    with tempfile.TemporaryDirectory() as folder:
        check_signature_with_openssl(Path(folder), data, sig_end, sig_len, cert)


def check_signature_with_openssl(tmp: Path, data: bytes, sig_end: int, sig_len: int, cert: Path) -> None:
    (tmp / "content").write_bytes(data[: sig_end - sig_len])
    (tmp / "sig").write_bytes(data[sig_end - sig_len : sig_end])
    subprocess.run(["openssl", "x509", "-inform", "DER", "-in", str(cert), "-out", str(tmp / "cert.pem")], check=True)
    verify = [
        "openssl",
        "cms",
        "-verify",
        "-binary",
        "-inform",
        "DER",
        "-in",
        str(tmp / "sig"),
        "-certfile",
        str(tmp / "cert.pem"),
        "-noverify",
        "-out",
        "/dev/null",
    ]
    assert subprocess.run(verify + ["-content", str(tmp / "content")], capture_output=True).returncode == 0
    tampered = bytearray((tmp / "content").read_bytes())
    tampered[len(tampered) // 2] ^= 1
    (tmp / "content").write_bytes(bytes(tampered))
    assert subprocess.run(verify + ["-content", str(tmp / "content")], capture_output=True).returncode != 0


@pytest.mark.realbuild
def test_real_build_for_debian_6_1(built_module_61, headers_61):
    check_real_module(built_module_61, headers_61)


@pytest.mark.realbuild
def test_real_build_for_bookworm_backports_6_12(built_module_612, headers_612):
    check_real_module(built_module_612, headers_612)


@pytest.mark.realbuild
def test_building_the_same_again_reuses_it(built_module_61, headers_61):
    from build_fixtures import run_build

    again = run_build(headers_61)
    assert again["reused"] is True
    assert again["sha256"] == built_module_61["sha256"] and again["module"] == built_module_61["module"]


def test_an_installed_build_failing_a_check_is_not_rebuilt_behind_installs_back(sandbox, monkeypatch):
    """Unit (fake DKMS state): the module is installed and signed with another key than asked for now."""
    good = hello_build(sandbox, "greetings-installed")
    monkeypatch.setattr(dkms, "is_installed", lambda package, kernel, trees: True)
    removed = []
    monkeypatch.setattr(dkms, "remove", lambda *args, **kwargs: removed.append(args))
    other_dir = sandbox.root / "other-keys"
    other_dir.mkdir()
    with pytest.raises(BuildError, match="is installed for .* and fails a check"):
        hello_build(sandbox, "greetings-installed", keys=make_keys(other_dir, subject="another key"))
    assert removed == []
    assert good.module.is_file()


def test_the_devices_are_every_id_of_the_rdna1_chips_found_here(sandbox):
    """An RX 5500 XT (1002:7340, navi14) in the machine: the build is for navi14's ids (amdgpu's pciidlist,
    host/rdna1_boards.py: 0x7340 0x7341 0x7347 0x734F), named before the source is known."""
    from sysfs_fixtures import FakeSysroot

    root = FakeSysroot(sandbox.root / "sysroot").kernel(sandbox.kernel)
    root.os_release("debian", "12", "Debian GNU/Linux 12 (bookworm)")
    root.pci_device("0000:03:00.0", 0x1002, 0x7340, 0x030000, driver="amdgpu", boot_vga=True)
    root.pci_device("0000:03:00.1", 0x1002, 0xAB38, 0x040300, driver="snd_hda_intel")
    navi14 = (
        "devices 0x7340 0x7341 0x7347 0x734F (every id of the RDNA1 chips found here: navi14 0x7340 at 0000:03:00.0)"
    )
    # before the source is known (no --source, no headers in the sysroot): named all the same
    early = run_cli(sandbox, "--kernel", sandbox.kernel, "--dry-run", "--sysroot", str(root.root))
    assert early.returncode == 0, early.stderr
    assert navi14 in early.stdout.splitlines()
    tree = fake_kernel.make_tree(sandbox.root / "src", version=sandbox.kernel_version)
    args = ["--kernel", sandbox.kernel, "--source", str(tree), "--dry-run", "--sysroot", str(root.root), "--json"]
    result = run_cli(sandbox, *args)
    assert result.returncode == 0, result.stderr
    planned = json.loads(result.stdout)
    assert planned["devices"] == planned["render"]["devices"] == ["0x7340", "0x7341", "0x7347", "0x734F"]
    assert navi14 in planned["plan"]
    # --device names them instead
    given = run_cli(sandbox, *args[:-1], "--device", "0x731F")
    assert "devices 0x731F (as given)" in given.stdout.splitlines(), given.stderr
