"""The stock-amdgpu loader's program (install/stock_loader.py), run by sh the way modprobe's `install` rule runs
it, with kmod's programs, /proc/cmdline, /dev/kmsg and /lib/modules replaced inside a private mount namespace
(fast; root). The real thing, in a whole system's initramfs with a file the real kernel refuses, is
test_boot_guard.py; this one covers each branch and what it hands to the kernel."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from rdna1_kmgr.install import initramfs, stock_loader
from rdna1_kmgr.install.target_root import TargetRoot

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare for a mount namespace"
)

KERNEL = os.uname().release
STOCK = f"/lib/modules/{KERNEL}/{stock_loader.STOCK_DIR}/amdgpu.ko"
PATCHED = f"/lib/modules/{KERNEL}/updates/dkms/amdgpu.ko"
# Where DKMS's install keeps a same-named module it moved out of the kernel's tree (dkms.in, do_install:
# "$dkms_tree/$module/original_module/$kernelver/$arch", the file's own name kept), as Debian 13's DKMS does with
# the distribution's amdgpu.ko.xz
ARCHIVED_FROM_DKMS = f"rdna1-amdgpu/original_module/{KERNEL}/{os.uname().machine}/amdgpu.ko.xz"

# Each stand-in writes its argv to the calls file; modprobe fails for amdgpu when told to.
RECORDER = """#!/bin/sh
echo "$(basename "$0") $*" >> {calls}
case "$(basename "$0") $*" in
"modinfo -F depends "*) echo "drm_ttm_helper,ttm,drm_display_helper" ;;
"modinfo -n amdgpu") echo {patched} ;;
"modprobe --ignore-install amdgpu"*) exit {modprobe_rc} ;;
esac
exit 0
"""


def run_loader(
    tmp_path: Path,
    cmdline: str,
    options: list[str],
    modprobe_rc: int = 0,
    program: str | None = None,
    stock_there: bool = True,
    archived: bool = False,
) -> tuple[list[str], list[str]]:
    """(the programs it ran, the kernel log lines it wrote), running `program` (the loader's by default)."""
    calls = tmp_path / "calls"
    calls.write_text("")
    fakes = {}
    for name in ("modprobe", "insmod", "modinfo"):
        fakes[name] = tmp_path / name
        fakes[name].write_text(RECORDER.format(calls=calls, patched=PATCHED, modprobe_rc=modprobe_rc))
        fakes[name].chmod(0o755)
    (tmp_path / "cmdline").write_text(cmdline + "\n")
    modules = tmp_path / "modules"
    (modules / KERNEL / stock_loader.STOCK_DIR).mkdir(parents=True, exist_ok=True)
    (modules / KERNEL / "modules.dep").write_text("")  # an index with nothing in it, for a real modprobe
    if stock_there:
        (modules / KERNEL / stock_loader.STOCK_DIR / "amdgpu.ko").write_bytes(b"\x7fELF")
    dkms_tree = tmp_path / "dkms"
    if archived:
        (dkms_tree / ARCHIVED_FROM_DKMS).parent.mkdir(parents=True)
        (dkms_tree / ARCHIVED_FROM_DKMS).write_bytes(b"\xfd7zXZ")
    dkms_tree.mkdir(exist_ok=True)
    loader = tmp_path / "amdgpu-loader"
    loader.write_text(stock_loader.program_text() if program is None else program)
    kmsg = tmp_path / "kmsg"
    os.mkfifo(kmsg)
    reader = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    keep_open = os.open(kmsg, os.O_WRONLY)  # no EOF between the program's writes
    binds = [
        (fakes["modprobe"], "/sbin/modprobe"),
        (fakes["insmod"], "/sbin/insmod"),
        (fakes["modinfo"], "/sbin/modinfo"),
        (tmp_path / "cmdline", "/proc/cmdline"),
        (kmsg, "/dev/kmsg"),
        (modules, "/lib/modules"),
        (dkms_tree, "/var/lib/dkms"),
    ]
    script = "".join(f'mount --bind "{src}" "{dst}" && ' for src, dst in binds) + 'exec sh "$0" "$@"'
    try:
        proc = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(loader), *options],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        try:
            written = os.read(reader, 65536).decode()
        except BlockingIOError:  # it wrote nothing
            written = ""
    finally:
        os.close(keep_open)
        os.close(reader)
    return calls.read_text().splitlines(), [line[3:] for line in written.splitlines()]  # "<4>" priority


def test_stock_loader_fallback_boot_never_opens_the_rdna1_kmgr_file(tmp_path):
    calls, said = run_loader(tmp_path, "ro amdgpu.rdna1_quirks=0 rdna1_kmgr.boot=fallback", ["rdna1_quirks=0", "dc=1"])
    assert calls == [
        f"modinfo -F depends {STOCK}",
        "modprobe --ignore-install -a drm_ttm_helper ttm drm_display_helper",
        f"insmod {STOCK} dc=1",  # the stock module has no rdna1_quirks
    ]
    assert len(said) == 1 and said[0].startswith(f"rdna1-kmgr: loading the distribution's amdgpu ({STOCK})")


def test_stock_loader_fallback_boot_loads_the_file_dkms_moved_aside(tmp_path):
    calls, said = run_loader(
        tmp_path, "ro rdna1_kmgr.boot=fallback", ["rdna1_quirks=0"], stock_there=False, archived=True
    )
    archived = f"/var/lib/dkms/{ARCHIVED_FROM_DKMS}"
    assert calls == [
        f"modinfo -F depends {archived}",
        "modprobe --ignore-install -a drm_ttm_helper ttm drm_display_helper",
        f"insmod {archived}",
    ]
    assert said[0].startswith(f"rdna1-kmgr: loading the distribution's amdgpu ({archived})")


def test_stock_loader_other_boots_load_what_the_index_gives(tmp_path):
    calls, said = run_loader(tmp_path, "ro amdgpu.rdna1_quirks=0x3 rdna1_kmgr.boot=confirmed", ["rdna1_quirks=0x3"])
    assert calls == ["modprobe --ignore-install amdgpu rdna1_quirks=0x3"] and said == []


def test_stock_loader_a_refused_file_is_followed_by_the_stock_one(tmp_path):
    calls, said = run_loader(tmp_path, "ro rdna1_kmgr.boot=trial", ["rdna1_quirks=0x3"], modprobe_rc=1)
    assert calls[0] == "modprobe --ignore-install amdgpu rdna1_quirks=0x3"
    assert calls[-1] == f"insmod {STOCK}"
    assert said[0] == f"rdna1-kmgr: {stock_loader.REFUSED} ({PATCHED}, modprobe exit status 1)"
    assert said[1].startswith("rdna1-kmgr: loading the distribution's amdgpu")
    assert "the kernel refused" in said[1]


def test_stock_loader_rule_names_the_program_and_passes_the_options():
    rule = stock_loader.rule_text()
    (line,) = [line for line in rule.splitlines() if line.startswith("install amdgpu ")]
    assert f"then exec /{stock_loader.LOADER} $CMDLINE_OPTS;" in line
    root = TargetRoot(Path("/x"))
    files = stock_loader.files(root, initramfs.InitramfsTools(root))
    assert files[Path("/x") / stock_loader.LOADER][1] == 0o755
    hook = files[Path("/x/etc/initramfs-tools/hooks/rdna1-kmgr")][0]
    assert f"copy_exec /{stock_loader.LOADER}" in hook and f"/{stock_loader.STOCK_DIR}/amdgpu.ko*" in hook


def rule_command(loader: Path, options: str) -> str:
    """The rule's command as modprobe hands it to sh (kmod's system(): $CMDLINE_OPTS replaced by the module's
    options), with the loader at a scratch path."""
    (line,) = [line for line in stock_loader.rule_text().splitlines() if line.startswith("install amdgpu ")]
    command = line.removeprefix("install amdgpu ").replace("$CMDLINE_OPTS", options)
    return "#!/bin/sh\n" + command.replace(f"/{stock_loader.LOADER}", str(loader)) + "\n"


def test_the_rule_runs_the_loader_when_it_is_there(tmp_path):
    loader = tmp_path / "loader"
    loader.write_text(f'#!/bin/sh\necho "loader $*" > {tmp_path / "loader-calls"}\n')
    loader.chmod(0o755)
    calls, said = run_loader(tmp_path, "ro", [], program=rule_command(loader, "rdna1_quirks=0x3 dc=1"))
    assert (tmp_path / "loader-calls").read_text() == "loader rdna1_quirks=0x3 dc=1\n"
    assert calls == [] and said == []


def test_the_rule_loads_the_stock_module_when_the_loader_is_gone(tmp_path):
    """The review: with the loader file gone the rule must still load amdgpu, and the safe one: the
    distribution's file, its dependencies first, without the option only the rdna1-kmgr build has."""
    program = rule_command(tmp_path / "deleted-loader", "rdna1_quirks=0x3 dc=1")
    calls, said = run_loader(tmp_path, "ro rdna1_kmgr.boot=confirmed", [], program=program)
    assert calls == [
        f"modinfo -F depends {STOCK}",
        "modprobe --ignore-install -a drm_ttm_helper ttm drm_display_helper",
        f"insmod {STOCK} dc=1",
    ]
    assert len(said) == 1 and said[0].startswith(f"rdna1-kmgr: loading the distribution's amdgpu ({STOCK})")
    assert "amdgpu-loader is missing" not in said[0] and "deleted-loader is missing" in said[0]


def test_the_rule_without_loader_or_stock_file_loads_what_the_index_gives(tmp_path):
    """An initramfs that carries only the rdna1-kmgr file and lost the loader: a display driver still."""
    program = rule_command(tmp_path / "deleted-loader", "rdna1_quirks=0x3")
    calls, said = run_loader(tmp_path, "ro", [], program=program, stock_there=False)
    assert calls == ["modprobe --ignore-install amdgpu rdna1_quirks=0x3"]
    assert len(said) == 1 and "loading what the module index gives" in said[0]


def test_kmods_own_modprobe_runs_the_rule_to_the_stock_module(tmp_path):
    """The rule as kmod runs it: kmod's real modprobe (a copy, since /sbin/modprobe is the recording stand-in)
    reads it from modprobe.d, puts the module's options (an `options` line here) in for $CMDLINE_OPTS and
    hands it to sh; with the loader gone the distribution's file loads, without rdna1_quirks."""
    real = shutil.which("modprobe") or shutil.which("modprobe", path="/usr/sbin:/sbin")
    if real is None:
        pytest.skip("kmod's modprobe is not installed")
    (tmp_path / "bin").mkdir()
    shutil.copy(os.path.realpath(real), tmp_path / "bin/modprobe")  # kmod acts by the name it is called by
    rule = stock_loader.rule_text().replace(f"/{stock_loader.LOADER}", str(tmp_path / "deleted-loader"))
    (tmp_path / "rule.conf").write_text(rule + "options amdgpu rdna1_quirks=0x3 dc=1\n")
    program = f"#!/bin/sh\nexec {tmp_path}/bin/modprobe -C {tmp_path}/rule.conf amdgpu\n"
    calls, said = run_loader(tmp_path, "ro", [], program=program)
    assert calls[-1] == f"insmod {STOCK} dc=1", calls
    assert said and "deleted-loader is missing" in said[0]


def test_kmod_reads_the_rule(tmp_path):
    """kmod's own parser takes the line whole: `modprobe --show-config` gives the command back as written."""
    modprobe = shutil.which("modprobe") or shutil.which("modprobe", path="/usr/sbin:/sbin")
    if modprobe is None:
        pytest.skip("kmod's modprobe is not installed")
    (tmp_path / "rule.conf").write_text(stock_loader.rule_text())
    shown = subprocess.run(
        [modprobe, "-C", str(tmp_path / "rule.conf"), "--showconfig"], capture_output=True, text=True
    )
    (line,) = [line for line in stock_loader.rule_text().splitlines() if line.startswith("install amdgpu ")]
    assert line in shown.stdout.splitlines(), shown.stdout + shown.stderr
