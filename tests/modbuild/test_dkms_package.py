"""The DKMS package: dkms.conf, assembly, the persistent kbuild tree, and real dkms add/build/remove.

The real tests package a tiny module (tests/hellomod.py) through the same code as amdgpu and build it
with the installed DKMS against the installed headers, in DKMS trees under tmp_path.
"""

import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import hellomod
import pytest
from dkms_helpers import installed_releases, make_keys, make_sandbox

from rdna1_kmgr.core.errors import BuildError
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.modbuild import module_build, module_checks


def load_kbuild_script():
    """dkms/rdna1-kbuild as a module (it has no .py suffix: DKMS runs it as a program)."""
    path = str(resources.files("rdna1_kmgr.dkms").joinpath("rdna1-kbuild"))
    loader = importlib.machinery.SourceFileLoader("rdna1_kbuild", path)
    spec = importlib.util.spec_from_loader("rdna1_kbuild", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    keys_dir = tmp_path / "keys"
    keys_dir.mkdir()
    return make_sandbox(tmp_path, monkeypatch, make_keys(keys_dir))


def series(sandbox, name: str, patches: dict[str, str]):
    out = sandbox.root / name
    manifest = hellomod.write_series(out, patches)
    return out, manifest, sandbox.package(manifest)


def assemble_and_build(sandbox, series_dir, package, jobs=2):
    dkms.assemble(package, sandbox.root / "tree", [hellomod.LOCATION], series_dir, sandbox.trees)
    dkms.add(package, sandbox.trees)
    env = {"mok_signing_key": str(sandbox.keys.key), "mok_certificate": str(sandbox.keys.cert)}
    log = sandbox.logs / f"{package.version}.log"
    return dkms.build(package, sandbox.kernel, sandbox.trees, log, jobs, env=env)


# --- unit: names, status, dkms.conf -----------------------------------------------------------------


def test_package_version_encodes_kernel_and_patch_set():
    assert dkms.package_version("6.1.192", "0123456789abcdef" * 4) == "6.1.192+p0123456789ab"
    # a build with debug info is another build of the same patch set
    assert dkms.package_version("6.1.192", "0123456789abcdef" * 4, debug_info=True) == "6.1.192+p0123456789ab+debug"
    with pytest.raises(ValueError):
        dkms.package_version("6.1.192", "not-a-hash")


def test_parse_status_reads_dkms_3_lines():
    text = (
        "rdna1-amdgpu/6.1.192+p0123456789ab, 6.1.0-56-amd64, x86_64: installed\n"
        "rdna1-amdgpu/6.1.192+pba9876543210, 6.1.0-56-amd64, x86_64: built\n"
        "rdna1-amdgpu/6.12.95+p00000000aaaa: added\n"
        "rdna1-amdgpu/6.1.192+p0123456789ab, 6.1.0-55-amd64, x86_64: installed (WARNING! Diff between built and installed module!)\n"
        "Error! something unrelated\n"
    )
    entries = dkms.parse_status(text)
    assert [(e.version, e.kernel, e.state) for e in entries] == [
        ("6.1.192+p0123456789ab", "6.1.0-56-amd64", "installed"),
        ("6.1.192+pba9876543210", "6.1.0-56-amd64", "built"),
        ("6.12.95+p00000000aaaa", None, "added"),
        ("6.1.192+p0123456789ab", "6.1.0-55-amd64", "installed"),
    ]


def test_dkms_conf_is_the_shell_dkms_sources(tmp_path, monkeypatch):
    """DKMS sources dkms.conf with bash; read it back the same way, with DKMS's own variables set."""
    monkeypatch.setenv("RDNA1_KMGR_CACHE", str(tmp_path / "cache"))
    package = dkms.Package("rdna1-amdgpu", "6.1.192+p0123456789ab")
    conf = tmp_path / "dkms.conf"
    conf.write_text(dkms.render_conf(package, ["0001-out-of-tree.patch", "0002-core.patch"], "amdgpu test"))
    script = (
        "kernelver=6.1.0-56-amd64 kernel_source_dir=/lib/modules/6.1.0-56-amd64/build parallel_jobs=3; "
        f'. "{conf}"; '
        'printf "%s\\n" "$PACKAGE_NAME" "$PACKAGE_VERSION" "${PATCH[0]}" "${PATCH[1]}" "${#PATCH[@]}" '
        '"$BUILT_MODULE_NAME" "$BUILT_MODULE_LOCATION" "$DEST_MODULE_LOCATION" "${AUTOINSTALL-unset}" "$STRIP" "$MAKE"'
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()
    tree = tmp_path / "cache/kbuild/rdna1-amdgpu/6.1.0-56-amd64"
    assert out[:10] == [
        "rdna1-amdgpu",
        "6.1.192+p0123456789ab",
        "0001-out-of-tree.patch",
        "0002-core.patch",
        "2",
        # AUTOINSTALL unset: DKMS autoinstalls on any value, and a kernel upgrade must not build this
        "amdgpu",
        "drivers/gpu/drm/amd/amdgpu/",
        "/updates/dkms",
        "unset",
        "no",
    ]
    make = out[10].split()
    # DKMS runs it as root with the tool's interpreter, isolated: no `#!/usr/bin/env python3` from DKMS's PATH
    assert make[:3] == [sys.executable, "-I", "-S"]
    make = make[3:]
    assert make[:5] == ["./rdna1-kbuild", "--tree", str(tree), "--module", "drivers/gpu/drm/amd/amdgpu/amdgpu.ko"]
    assert make[5:] == [
        "--",
        "make",
        "-j3",
        "KERNELRELEASE=6.1.0-56-amd64",
        "-C",
        "/lib/modules/6.1.0-56-amd64/build",
        f"M={tree}/drivers/gpu/drm/amd/amdgpu",
        f"FULL_AMD_PATH={tree}/drivers/gpu/drm/amd",
        "modules",
    ]
    # debug info only when asked: rdna1-kbuild then keeps the config's -g instead of adding KCFLAGS=-g0
    debug = dkms.Package("rdna1-amdgpu", "6.1.192+p0123456789ab+debug", debug_info=True)
    conf.write_text(dkms.render_conf(debug, ["0001-out-of-tree.patch"], "amdgpu test"))
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[-1].split()[3:5] == ["./rdna1-kbuild", "--debug-info"]


def test_first_compiler_error_prefers_the_compiler_over_make():
    log = (
        "  CC [M]  /x/amdgpu/amdgpu_drv.o\n"
        "/x/amdgpu/gmc_v10_0.c: In function 'gmc_v10_0_get_vm_pte':\n"
        "/x/amdgpu/gmc_v10_0.c:1044:9: warning: unused variable 'x'\n"
        "/x/amdgpu/gmc_v10_0.c:1050:2: error: expected ';' before '}' token\n"
        "/x/amdgpu/gmc_v10_0.c:1051:2: error: second error\n"
        "make[2]: *** [scripts/Makefile.build:250: /x/amdgpu/gmc_v10_0.o] Error 1\n"
    )
    assert dkms.first_compiler_error(log) == "/x/amdgpu/gmc_v10_0.c:1050:2: error: expected ';' before '}' token"
    assert dkms.first_compiler_error("make[1]: *** [Makefile:1] Error 2\n") == "make[1]: *** [Makefile:1] Error 2"
    assert dkms.first_compiler_error("all fine\n") is None


# --- the persistent kbuild tree's sync ----------------------------------------------------------------


def test_kbuild_sync_keeps_unchanged_timestamps_and_dates_changes_now(tmp_path):
    kbuild = load_kbuild_script()
    old = time.time() - 3600

    def dkms_build_dir(files: dict[str, str]) -> Path:
        build = tmp_path / f"build-{len(list(tmp_path.iterdir()))}"
        for rel, text in files.items():
            (build / rel).parent.mkdir(parents=True, exist_ok=True)
            (build / rel).write_text(text)
            os.utime(build / rel, (old, old))  # DKMS copies with cp -a: pristine files keep their old time
        (build / "patches").mkdir()
        (build / "patches/0001.patch").write_text("not source")
        (build / "dkms.conf").write_text("not source")
        return build

    tree = tmp_path / "kbuild"
    pristine = {"a/x.c": "x", "a/y.c": "y", "a/gone.c": "g"}
    assert kbuild.sync(dkms_build_dir(pristine), tree) == (3, 0, 0)
    assert not (tree / "patches").exists() and not (tree / "dkms.conf").exists()
    # objects built after the first sync
    built_at = time.time()

    # a patch set changes y.c, and gone.c leaves the tree
    patched = dkms_build_dir({"a/x.c": "x", "a/y.c": "y patched"})
    os.utime(patched / "a/y.c")  # patch writes it now
    assert kbuild.sync(patched, tree) == (0, 1, 1)
    assert (tree / "a/x.c").stat().st_mtime == pytest.approx(old)  # make leaves x.o alone
    assert (tree / "a/y.c").stat().st_mtime >= built_at  # make rebuilds y.o
    assert (tree / "a/y.c").read_text() == "y patched"
    assert not (tree / "a/gone.c").exists()

    # the same patch set again (a new DKMS build directory, the file patched anew): nothing to rebuild
    y_time = (tree / "a/y.c").stat().st_mtime_ns
    again = dkms_build_dir({"a/x.c": "x", "a/y.c": "y patched"})
    os.utime(again / "a/y.c")
    assert kbuild.sync(again, tree) == (0, 0, 0)
    assert (tree / "a/y.c").stat().st_mtime_ns == y_time

    # back to pristine: y.c carries its OLD time in the DKMS copy, yet must look newer than y.o
    reverted = dkms_build_dir({"a/x.c": "x", "a/y.c": "y"})
    before = time.time()
    assert kbuild.sync(reverted, tree) == (0, 1, 0)
    assert (tree / "a/y.c").read_text() == "y"
    assert (tree / "a/y.c").stat().st_mtime >= before - 1


def test_kbuild_sync_links_untouched_files_to_the_package_source_so_the_source_is_on_disk_once(tmp_path):
    """Issue 27: the kbuild tree shares its unpatched files with the package source (which is hard-linked to the
    tool's unpacked source), not with DKMS's `cp -a` copy, which DKMS deletes after the build: one copy on disk.
    A file the series patched is DKMS's patched copy."""
    kbuild = load_kbuild_script()
    source = tmp_path / "usr-src/rdna1-amdgpu-1"
    (source / "a").mkdir(parents=True)
    (source / "a/x.c").write_text("x")
    (source / "a/y.c").write_text("y")
    build = tmp_path / "build"
    shutil.copytree(source, build)  # DKMS: cp -a (copytree keeps the times as cp -a does)
    (build / "a/y.c").write_text("y patched")  # DKMS applied the series: new content, written now
    tree = tmp_path / "kbuild"
    assert kbuild.sync(build, tree, source) == (2, 0, 0)
    assert (tree / "a/x.c").stat().st_ino == (source / "a/x.c").stat().st_ino  # the one copy
    assert (tree / "a/y.c").stat().st_ino == (build / "a/y.c").stat().st_ino  # the patched file
    assert (tree / "a/y.c").read_text() == "y patched"
    shutil.rmtree(build)  # DKMS removes its build directory after the build
    assert (tree / "a/x.c").stat().st_nlink == 2 and (tree / "a/y.c").read_text() == "y patched"


# --- assembly ---------------------------------------------------------------------------------------


def test_assemble_mirrors_the_tree_root_with_patches_in_order(sandbox):
    series_dir, manifest, package = series(
        sandbox,
        "s",
        {
            "0001-greet.patch": hellomod.greeting_patch("first"),
            "0002-noop.patch": hellomod.greeting_patch("second").replace('"hello"', '"first"'),
        },
    )
    target = dkms.assemble(package, sandbox.root / "tree", [hellomod.LOCATION], series_dir, sandbox.trees)
    assert target == sandbox.trees.source / f"rdna1hello-{package.version}"
    assert (target / hellomod.LOCATION / "table.c").read_text() == hellomod.TABLE_C  # pristine
    assert (target / "patches/series").read_text() == "0001-greet.patch\n0002-noop.patch\n"
    conf = (target / "dkms.conf").read_text()
    assert conf.index('PATCH[0]="0001-greet.patch"') < conf.index('PATCH[1]="0002-noop.patch"')
    assert os.access(target / dkms.HOOK_SCRIPT, os.X_OK)
    assert [p.name for p in sandbox.trees.source.iterdir()] == [target.name]  # no partial directory left
    # the same package again: the directory is reused as it is
    stamp = (target / "dkms.conf").stat().st_mtime_ns
    source_inode = (target / hellomod.LOCATION / "table.c").stat().st_ino
    dkms.assemble(package, sandbox.root / "tree", [hellomod.LOCATION], series_dir, sandbox.trees)
    assert (target / "dkms.conf").stat().st_mtime_ns == stamp
    # a dkms.conf an older rdna1-kmgr wrote is brought up to date, the source left alone
    (target / "dkms.conf").write_text(conf + 'AUTOINSTALL="no"\n')
    dkms.assemble(package, sandbox.root / "tree", [hellomod.LOCATION], series_dir, sandbox.trees)
    assert (target / "dkms.conf").read_text() == conf
    assert (target / hellomod.LOCATION / "table.c").stat().st_ino == source_inode


def test_assemble_refuses_a_source_without_the_subtree_and_leaves_nothing(sandbox):
    series_dir, _, package = series(sandbox, "s", {"0001-greet.patch": hellomod.greeting_patch("x")})
    with pytest.raises(BuildError, match="has no drivers/gpu/drm/amd/"):
        dkms.assemble(package, sandbox.root / "tree", ["drivers/gpu/drm/amd"], series_dir, sandbox.trees)
    assert list(sandbox.trees.source.iterdir()) == []


# --- real dkms ----------------------------------------------------------------------------------------


def test_dkms_applies_the_series_builds_and_signs(sandbox):
    series_dir, _, package = series(sandbox, "s", {"0001-greet.patch": hellomod.greeting_patch("greetings-from-one")})
    outcome = assemble_and_build(sandbox, series_dir, package)

    assert [(e.version, e.kernel, e.state) for e in dkms.status("rdna1hello", sandbox.trees)] == [
        (package.version, sandbox.kernel, "built")
    ]
    # DKMS compresses the module when the kernel's own modules are (6.12 on Debian: .ko.xz)
    assert outcome.module.parent == package.module_dir(sandbox.trees, sandbox.kernel)
    assert outcome.module.name in ("rdna1hello.ko", "rdna1hello.ko.xz", "rdna1hello.ko.zst", "rdna1hello.ko.gz")
    elf = module_checks.read_module(outcome.module)
    assert b"greetings-from-one" in elf  # DKMS applied the patch
    assert outcome.compiled >= 2  # main.o, table.o (and the .mod.o)
    assert outcome.certificate == str(sandbox.keys.cert)
    report = module_checks.verify(outcome.module, sandbox.kernel, sandbox.keys.cert, [0x731F])
    assert report.parameters == ("rdna1_hello_enable",)
    assert report.signer == "rdna1-kmgr test key"
    assert b".debug_info" not in elf  # stripped as DKMS would
    # compiled without debug info (KCFLAGS=-g0), unless the kernel makes module BTF, which is made from it
    kept = sandbox.cache / "kbuild" / "rdna1hello" / sandbox.kernel / hellomod.LOCATION
    btf = load_kbuild_script().makes_module_btf(["make", "-C", f"/lib/modules/{sandbox.kernel}/build"])
    assert (b".debug_info" in (kept / "main.o").read_bytes()) == btf
    assert (b".BTF" in elf) == btf  # a BTF kernel's module keeps its BTF
    log = outcome.log.read_text()
    assert "CC [M]" in log and "Signing module" in log
    # the private key stayed where it was: nothing in the DKMS trees holds it
    key_bytes = sandbox.keys.key.read_bytes()
    for folder in (sandbox.trees.source, sandbox.trees.dkms):
        assert not any(p.is_file() and p.read_bytes() == key_bytes for p in folder.rglob("*"))


def test_module_btf_is_detected_from_the_headers(tmp_path):
    """kbuild makes module BTF only with CONFIG_DEBUG_INFO_BTF_MODULES and a vmlinux in the headers' tree."""
    kbuild = load_kbuild_script()
    headers = tmp_path / "headers"
    (headers / "include" / "config").mkdir(parents=True)
    (headers / "include" / "config" / "auto.conf").write_text(
        "CONFIG_DEBUG_INFO_BTF=y\nCONFIG_DEBUG_INFO_BTF_MODULES=y\n"
    )
    command = ["make", "-j3", "-C", str(headers), "M=/x", "modules"]
    assert not kbuild.makes_module_btf(command)  # Debian's 6.1 headers: no vmlinux, kbuild skips BTF
    (headers / "vmlinux").write_bytes(b"")
    assert kbuild.makes_module_btf(command)  # Debian's 6.12 headers
    (headers / "include" / "config" / "auto.conf").write_text("CONFIG_DEBUG_INFO_BTF=y\n")
    assert not kbuild.makes_module_btf(command)
    assert not kbuild.makes_module_btf(["make", "modules"])


@pytest.fixture
def sandbox_without_btf(tmp_path, monkeypatch):
    """A sandbox for a kernel whose headers make no module BTF (so -g0 applies), or skip."""
    kbuild = load_kbuild_script()
    plain = [k for k in installed_releases() if not kbuild.makes_module_btf(["make", "-C", f"/lib/modules/{k}/build"])]
    if not plain:
        pytest.skip("every installed kernel's headers make module BTF, which keeps -g")
    keys_dir = tmp_path / "keys"
    keys_dir.mkdir()
    return make_sandbox(tmp_path, monkeypatch, make_keys(keys_dir), kernel=plain[-1])


def test_debug_info_is_kept_only_when_asked_and_changes_nothing_else(sandbox_without_btf):
    """--debug-info compiles with the config's -g (for crash dumps); the module DKMS gets has the same
    vermagic, parameters and signer either way, and is stripped either way."""
    sandbox = sandbox_without_btf
    series_dir, manifest, plain = series(sandbox, "s", {"0001-greet.patch": hellomod.greeting_patch("hello-g")})
    plain_module = assemble_and_build(sandbox, series_dir, plain).module
    kept = sandbox.cache / "kbuild" / "rdna1hello" / sandbox.kernel / hellomod.LOCATION
    plain_size = (kept / "main.o").stat().st_size
    plain_report = module_checks.verify(plain_module, sandbox.kernel, sandbox.keys.cert, [0x731F])

    debug = dkms.Package(
        "rdna1hello",
        dkms.package_version(manifest["kernel_version"], manifest["patchset_sha256"], debug_info=True),
        hellomod.MODULE,
        debug_info=True,
    )
    outcome = assemble_and_build(sandbox, series_dir, debug)
    assert outcome.compiled >= 2  # other flags: kbuild compiles everything again
    assert b".debug_info" in (kept / "main.o").read_bytes()
    assert (kept / "main.o").stat().st_size > plain_size
    assert b".debug_info" in (kept / "rdna1hello.ko").read_bytes()  # the unstripped module, for crash dumps
    assert b".debug_info" not in module_checks.read_module(outcome.module)
    report = module_checks.verify(outcome.module, sandbox.kernel, sandbox.keys.cert, [0x731F])
    assert (report.vermagic, report.parameters, report.signer) == (
        plain_report.vermagic,
        plain_report.parameters,
        plain_report.signer,
    )


def test_another_patch_set_recompiles_only_what_it_changes(sandbox):
    first_dir, _, first = series(sandbox, "s1", {"0001-greet.patch": hellomod.greeting_patch("greetings-from-one")})
    assemble_and_build(sandbox, first_dir, first)
    second_dir, _, second = series(sandbox, "s2", {"0001-greet.patch": hellomod.greeting_patch("greetings-from-two")})
    assert second.version != first.version

    outcome = assemble_and_build(sandbox, second_dir, second)
    assert outcome.compiled == 1  # table.c only; main.o is reused from the kbuild tree
    assert "table.o" in next(line for line in outcome.log.read_text().splitlines() if "CC [M]" in line)
    assert b"greetings-from-two" in module_checks.read_module(outcome.module)
    module_checks.verify(outcome.module, sandbox.kernel, sandbox.keys.cert, [0x731F])

    # and back: the first text comes back although that source file is older than the object built last
    dkms.remove(first, sandbox.trees)
    outcome = assemble_and_build(sandbox, first_dir, first)
    assert outcome.compiled == 1
    assert b"greetings-from-one" in module_checks.read_module(outcome.module)


def headers_of(kernel: str) -> tuple[Path, Path]:
    """The headers package's object tree (/lib/modules/R/build) and the source tree its Makefile includes."""
    objtree = Path(f"/lib/modules/{kernel}/build").resolve()
    include = (objtree / "Makefile").read_text().split()[-1]
    return objtree, (objtree / include).parent.resolve()


def test_the_kbuild_tree_names_the_kernel_config_once_and_the_kernel_headers_by_one_stamp(sandbox):
    """fixdep writes one `$(wildcard include/config/SYMBOL)` prerequisite per config symbol an object's sources
    name and one line per header it includes (scripts/basic/fixdep.c); the tree keeps auto.conf for the symbols
    and one stamp for the kernel's headers, and the module's own header stays a prerequisite of its own."""
    series_dir, _, package = series(sandbox, "s", {"0001-greet.patch": hellomod.greeting_patch("greetings")})
    outcome = assemble_and_build(sandbox, series_dir, package)
    assert "config prerequisites folded into auto.conf" in outcome.log.read_text()
    objtree, srctree = headers_of(sandbox.kernel)
    assert (objtree / "include/config/auto.conf").is_file()
    root = sandbox.cache / "kbuild" / "rdna1hello" / sandbox.kernel
    stamp = root / ".rdna1-kbuild-headers"
    listed = stamp.read_text().splitlines()
    # main.c and table.c include <linux/module.h>, table.c <linux/pci.h>: the headers' source tree has them
    assert {str(srctree / "include/linux/module.h"), str(srctree / "include/linux/pci.h")} <= set(listed)
    assert all(Path(path).is_file() and not path.startswith(str(root)) for path in listed)
    assert stamp.stat().st_mtime_ns == max(os.stat(path).st_mtime_ns for path in listed)
    for name in ("main", "table"):
        lines = (root / hellomod.LOCATION / f".{name}.o.cmd").read_text().splitlines()
        deps = lines.index(next(line for line in lines if line.startswith("deps_")))
        block = lines[deps + 1 : lines.index("", deps)]
        assert block[0].strip() == "$(wildcard include/config/auto.conf) \\"
        assert [line.strip() for line in block if "include/config/" in line] == [block[0].strip()]
        assert [line.strip() for line in block].count(f"{stamp} \\") == 1
        assert not any("include/linux/" in line for line in block)
        assert any(line.strip().endswith("rdna1hello/include/rdna1hello.h \\") for line in block)


def test_a_kernel_header_newer_than_the_objects_rebuilds_them_and_one_gone_rebuilds_them_once(sandbox, tmp_path):
    """The stamp stands for every header it lists: one the headers package rewrote after the build (here a file
    added to the list, dated now) makes make compile every object again; one that is gone too, and the build
    after that finds nothing to do."""
    series_dir, _, package = series(sandbox, "s", {"0001-greet.patch": hellomod.greeting_patch("greetings")})
    compiled = assemble_and_build(sandbox, series_dir, package).compiled  # main.o, table.o and the .mod.o
    stamp = sandbox.cache / "kbuild" / "rdna1hello" / sandbox.kernel / ".rdna1-kbuild-headers"

    def build_again() -> int:
        dkms.remove(package, sandbox.trees)
        return assemble_and_build(sandbox, series_dir, package).compiled

    assert build_again() == 0
    header = tmp_path / "rewritten.h"
    header.write_text("/* as a headers package would rewrite it */\n")
    dated = stamp.stat().st_mtime_ns
    stamp.write_text(stamp.read_text() + f"{header}\n")
    os.utime(stamp, ns=(dated, dated))  # as the fold left it: older than the objects, and than the header
    assert build_again() == compiled
    assert build_again() == 0
    header.unlink()
    assert build_again() == compiled
    assert str(header) not in stamp.read_text()
    assert build_again() == 0


def test_compile_error_names_the_first_compiler_error_and_the_log(sandbox):
    series_dir, _, package = series(sandbox, "s", {"0001-broken.patch": hellomod.BROKEN_C_PATCH})
    with pytest.raises(BuildError) as caught:
        assemble_and_build(sandbox, series_dir, package)
    err = caught.value
    assert err.what.startswith("compile error: ")
    assert "table.c:13:" in err.what and "error: expected" in err.what
    log = Path(err.hint.split("whole log: ", 1)[1])
    assert log.is_file() and "error: expected" in log.read_text()


def test_patch_that_does_not_apply_is_named(sandbox):
    series_dir, _, package = series(sandbox, "s", {"0001-stale.patch": hellomod.NOT_APPLYING_PATCH})
    with pytest.raises(BuildError, match=r"patch 0001-stale.patch does not apply to the source"):
        assemble_and_build(sandbox, series_dir, package)


DATA = Path(__file__).parent / "data"


def test_patch_that_does_not_apply_under_dkms_3_2_names_the_hunk_from_make_log(tmp_path, monkeypatch):
    """Debian 13's DKMS 3.2 writes patch's own words only to make.log (3.0 let them through to its output); the
    error still says which hunk failed. The fake dkms replays what the real 3.2.2 printed (tests/modbuild/data)."""
    package = dkms.Package("probe", "1.0")
    trees = dkms.Trees(source=tmp_path / "src", dkms=tmp_path / "tree")
    make_log = package.version_dir(trees) / "build" / "make.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "dkms"
    fake.write_text(
        "#!/bin/sh\n"
        f"mkdir -p '{make_log.parent}'\n"
        f"cat '{DATA / 'dkms-3.2.2-patch-failed.make.log'}' > '{make_log}'\n"
        f"cat '{DATA / 'dkms-3.2.2-patch-failed.out'}'\n"
        "exit 6\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    with pytest.raises(BuildError) as caught:
        dkms.build(package, "6.12.118+deb13-amd64", trees, tmp_path / "log" / "build.log", jobs=1)
    assert caught.value.what == "patch 0001-stale.patch does not apply to the source (Hunk #1 FAILED at 1.)"
    assert caught.value.hint.endswith(str(tmp_path / "log" / "build.log"))


def test_remove_takes_the_version_and_its_source_away(sandbox):
    series_dir, _, package = series(sandbox, "s", {"0001-greet.patch": hellomod.greeting_patch("bye")})
    assemble_and_build(sandbox, series_dir, package)
    dkms.remove(package, sandbox.trees)
    assert dkms.status("rdna1hello", sandbox.trees) == []
    assert not package.source_dir(sandbox.trees).exists()
    assert not package.version_dir(sandbox.trees).exists()


def test_assemble_links_a_cached_source_and_copies_a_users_tree(sandbox):
    series_dir, _, package = series(sandbox, "s", {"0001-greet.patch": hellomod.greeting_patch("x")})
    rel = f"{hellomod.LOCATION}/main.c"

    users = dkms.assemble(package, sandbox.root / "tree", [hellomod.LOCATION], series_dir, sandbox.trees)
    assert (users / rel).stat().st_ino != (sandbox.root / "tree" / rel).stat().st_ino  # an editor may change it
    dkms.remove(package, sandbox.trees)

    cached = hellomod.write_tree(sandbox.cache / "src" / "6.1.192-2")
    linked = dkms.assemble(package, cached, [hellomod.LOCATION], series_dir, sandbox.trees)
    assert (linked / rel).stat().st_ino == (cached / rel).stat().st_ino  # our own cache: no second copy


def test_a_kernel_upgrade_does_not_build_the_package_on_its_own(sandbox):
    """What a kernel package's postinst runs (`dkms autoinstall`) must leave this package alone."""
    series_dir, _, package = series(sandbox, "s", {"0001-greet.patch": hellomod.greeting_patch("x")})
    dkms.assemble(package, sandbox.root / "tree", [hellomod.LOCATION], series_dir, sandbox.trees)
    dkms.add(package, sandbox.trees)
    install_tree = sandbox.root / "lib-modules"
    (install_tree / sandbox.kernel).mkdir(parents=True)  # DKMS wants it there already
    result = subprocess.run(
        ["dkms", "autoinstall", "-k", sandbox.kernel, *sandbox.trees.cli_args(), f"--installtree={install_tree}"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert [(e.version, e.state) for e in dkms.status("rdna1hello", sandbox.trees)] == [(package.version, "added")]
    assert list((install_tree / sandbox.kernel).rglob("*.ko*")) == []


@pytest.mark.skipif(shutil.which("ccache") is None or shutil.which("gcc") is None, reason="needs ccache and gcc")
def test_ccache_key_leaves_out_the_build_salt_and_keeps_the_rest_of_the_configuration(tmp_path, monkeypatch):
    """The build's ccache settings with the real ccache, on a file that includes autoconf.h the way kbuild's
    objects do (-I./include, -Wp,-MMD): a changed CONFIG_BUILD_SALT alone is a direct hit (no preprocessor run);
    any other changed option compiles again."""
    kbuild = load_kbuild_script()
    obj, view, cache = tmp_path / "obj", tmp_path / "view", tmp_path / "ccache"
    (obj / "include/generated").mkdir(parents=True)
    view.mkdir()
    (obj / "a.c").write_text("#include <generated/autoconf.h>\nint f(void) { return CONFIG_X; }\n")
    monkeypatch.setenv("CCACHE_DIR", str(cache))

    def compile_with(salt: str, x: int) -> dict[str, int]:
        (obj / kbuild.AUTOCONF).write_text(f'{kbuild.SALT}"{salt}"\n#define CONFIG_X {x}\n')
        # the build's own settings (module_build.ccache_env), then what rdna1-kbuild adds in the view
        env = {**os.environ, **module_build.ccache_env(), "CCACHE_DIR": str(cache)}
        env.update(kbuild.ccache_view_env(view, obj))
        subprocess.run(["ccache", "-z"], env=env, check=True, capture_output=True)
        compile_a = ["ccache", "gcc", "-Wp,-MMD,./.a.o.d", "-I./include", "-c", "a.c"]  # kbuild's dependency file
        subprocess.run(compile_a, cwd=obj, env=env, check=True)
        out = subprocess.run(["ccache", "--print-stats"], env=env, check=True, capture_output=True, text=True).stdout
        return {k: int(v) for k, v in (line.split("\t") for line in out.splitlines()) if v.isdigit()}

    assert compile_with("6.1.0-55-amd64", 1)["cache_miss"] == 1
    assert compile_with("6.1.0-56-amd64", 1)["direct_cache_hit"] == 1  # another release, same configuration
    assert compile_with("6.1.0-56-amd64", 2)["cache_miss"] == 1  # an option changed: compiled again
    assert (view / "autoconf-without-salt.h").read_text() == "#define CONFIG_X 2\n"


def test_the_kbuild_view_reads_debian_7x_headers_makefile_that_names_its_object_tree(tmp_path):
    # Debian's headers Makefiles as the packages ship them: 6.12.118+deb13 one line, 7.3.4+deb13 two
    kbuild = load_kbuild_script()
    src = tmp_path / "usr/src/linux-headers-7.3.4+deb13-common"
    src.mkdir(parents=True)
    (src / "Makefile").write_text("# the kernel's top Makefile\n")
    obj = tmp_path / "usr/src/linux-headers-7.3.4+deb13-amd64"
    obj.mkdir()
    (obj / "Makefile").write_text(f"KBUILD_OUTPUT={obj}\ninclude {src}/Makefile\n")
    assert kbuild.headers_trees(["make", "-C", str(obj)]) == (obj, src)
    (obj / "Makefile").write_text(f"include {src}/Makefile\n")
    assert kbuild.headers_trees(["make", "-C", str(obj)]) == (obj, src)
    (obj / "Makefile").write_text(f"KBUILD_OUTPUT=/elsewhere\ninclude {src}/Makefile\n")
    assert "more than" in kbuild.headers_trees(["make", "-C", str(obj)])
