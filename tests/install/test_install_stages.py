"""Install's stages, planned and run on a scratch root with a fake initramfs tool and a journal that records what
it is told: the plan numbers them in the documented order, each stage's intent is on disk before it changes
anything, a failing stage rolls back and says where, verify journals nothing. (test_module_install runs them all
for real: DKMS, depmod, modinfo, rollback bit for bit.)"""

import hashlib
import io
import lzma
import subprocess
from pathlib import Path

import pytest

from rdna1_kmgr.core import progress, runner
from rdna1_kmgr.core.errors import BuildError, HostError
from rdna1_kmgr.install import boot_guard, install_stages
from rdna1_kmgr.install.initramfs import InitramfsTool
from rdna1_kmgr.install.install_gate import Candidate
from rdna1_kmgr.install.install_result import Verified
from rdna1_kmgr.install.install_stages import InstallContext
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.modbuild import module_checks
from rdna1_kmgr.render.quirk_mask import QuirkMask

KERNEL = "6.1.0-57-amd64"
VERSION = "6.1.192+p0123456789ab"


class FakeJournal:
    """Records each intent and `done` in order, as (kind, step, command)."""

    kernel = KERNEL
    path = Path("/nonexistent/journal.jsonl")
    backups = Path("/nonexistent/backups")

    def __init__(self):
        self.records: list[tuple] = []

    def record_intent(self, step, command, replaces, dirs, undo=None):
        self.records.append(("intent", step, command))

    def append(self, record):
        self.records.append((record.KIND, record.step, None))  # a stage appends its `done`


class FakeTool(InitramfsTool):
    name = "fake-initramfs"
    supported = True

    def __init__(self, root, journal, fail=False):
        super().__init__(root)
        self.journal, self.fail, self.made = journal, fail, []

    def image(self, kernel):
        return self.root.boot_dir / f"initrd.img-{kernel}"

    def regenerate_command(self, kernel):
        return ["make-image", kernel]

    def regenerate(self, kernel):
        self.made.append(list(self.journal.records))  # what the journal held when the image was made
        if self.fail:
            raise HostError("make-image failed (exit 1)", "see its log")


@pytest.fixture
def ctx(tmp_path, monkeypatch):
    monkeypatch.setenv("RDNA1_KMGR_STATE", str(tmp_path / "state"))  # no other kernel's install in modprobe.d
    root = TargetRoot(tmp_path / "root")
    (root.modules_dir(KERNEL) / "kernel").mkdir(parents=True)
    root.boot_dir.mkdir()
    (root.boot_dir / f"vmlinuz-{KERNEL}").write_bytes(b"kernel")
    package = dkms.Package(dkms.PACKAGE_NAME, VERSION)
    candidate = Candidate(package, KERNEL, tmp_path / "amdgpu.ko", "ab" * 32, QuirkMask(3))
    journal = FakeJournal()
    trees = dkms.Trees(tmp_path / "usr-src", tmp_path / "dkms")
    context = InstallContext(candidate, root, trees, FakeTool(root, journal), tmp_path / "mok.der", journal, None)
    context.work_out_changes()
    return context


def numbered(lines: list[str]) -> list[str]:
    return [line for line in lines if line[:1].isdigit()]


def test_the_stages_run_in_the_documented_order_the_guarded_ones_only_with_the_boot_guard():
    # install_stages' docstring (and module_install's steps before they were stages)
    assert install_stages.GUARDED.names == [
        "dkms-install",
        "depmod",
        "modprobe-conf",
        "stock-loader",
        "initramfs",
        "boot-guard",
        "verify",
    ]
    assert install_stages.UNGUARDED.names == ["dkms-install", "depmod", "modprobe-conf", "initramfs", "verify"]


def test_the_plan_numbers_each_stage_with_its_command_and_the_parameters_it_writes(ctx):
    lines = ctx.pipeline.plan(ctx)
    steps = numbered(lines)
    assert [s.split(":")[0] for s in steps] == [
        "1. dkms-install",
        "2. depmod",
        "3. modprobe-conf",
        "4. initramfs",
        "5. verify",
    ]
    assert steps[0].startswith(f"1. dkms-install: dkms install -m rdna1-amdgpu -v {VERSION} -k {KERNEL} ")
    assert steps[1] == f"2. depmod: depmod -b {ctx.root.path} {KERNEL}"
    assert steps[3] == f"4. initramfs: make-image {KERNEL}"
    assert "    options amdgpu rdna1_quirks=0x3" in lines  # modprobe.d(5): options <module> <parameter>=<value>
    assert f"    create {ctx.root.path / 'etc/modprobe.d/rdna1-kmgr.conf'}" in lines
    assert f"    create the directory {ctx.root.path / 'etc'}" in lines
    assert f"    create {ctx.root.boot_dir / f'initrd.img-{KERNEL}'}" in lines


def test_a_stage_journals_its_intent_before_it_changes_anything_and_done_after(ctx):
    said = io.StringIO()
    with progress.reporting_to(said):
        install_stages.INITRAMFS.run(ctx)
    assert ctx.tool.made == [[("intent", "initramfs", ["make-image", KERNEL])]]
    assert ctx.journal.records[-1] == ("done", "initramfs", None)
    assert said.getvalue() == f"rdna1-kmgr: initramfs: make-image {KERNEL}\n"


def test_a_failing_stage_rolls_back_what_was_done_and_says_where(ctx, monkeypatch):
    replayed = []

    def replay(journal, keep_build, reason):
        replayed.append((journal, keep_build, reason))
        return ["undo initramfs: restored"]

    monkeypatch.setattr(install_stages.rollback, "replay", replay)
    ctx.tool.fail = True
    said = io.StringIO()
    with progress.reporting_to(said), pytest.raises(HostError) as failed:
        install_stages.INITRAMFS.run(ctx)
    assert failed.value.what == "install failed at initramfs: make-image failed (exit 1)"
    assert failed.value.hint == "see its log; everything it changed was rolled back"
    assert replayed == [(ctx.journal, True, "install failed at initramfs")]  # the build kept
    assert ctx.journal.records == [("intent", "initramfs", ["make-image", KERNEL])]  # no `done`
    assert "rdna1-kmgr: undo initramfs: restored" in said.getvalue().splitlines()


def test_a_kernel_without_its_image_plans_the_initramfs_as_skipped_journals_it_and_makes_none(ctx):
    (ctx.root.boot_dir / f"vmlinuz-{KERNEL}").unlink()
    (ctx.root.modules_dir(KERNEL) / "kernel").rmdir()
    ctx.work_out_changes()
    lines = ctx.pipeline.plan(ctx)
    at = lines.index("4. initramfs")
    assert lines[at + 1].startswith(f"    skipped: {ctx.root.boot_dir}/vmlinuz-{KERNEL} is not installed")
    with progress.reporting_to(io.StringIO()):
        install_stages.INITRAMFS.run(ctx)
    assert ctx.tool.made == []
    assert ctx.journal.records == [("intent", "initramfs", None), ("done", "initramfs", None)]


def test_verify_changes_nothing_so_journals_nothing_and_keeps_what_it_found(ctx, monkeypatch):
    found = Verified(str(ctx.root.modules_dir(KERNEL) / "updates/dkms/amdgpu.ko"), "ab" * 32, "initrd", None)
    monkeypatch.setattr(install_stages, "verify", lambda candidate, root, tool, cert: found)
    with progress.reporting_to(io.StringIO()):
        install_stages.VERIFY.run(ctx)
    assert ctx.verified == found
    assert ctx.journal.records == []


def test_with_the_boot_guard_the_loader_goes_into_the_image_and_grub_gives_the_mask(ctx):
    ctx.guard = boot_guard.Settings(QuirkMask(3), confirm_after=90, target="graphical.target")
    ctx.work_out_changes()
    lines = ctx.pipeline.plan(ctx)
    assert [s.split(":")[0] for s in numbered(lines)] == [
        "1. dkms-install",
        "2. depmod",
        "3. modprobe-conf",
        "4. stock-loader",
        "5. initramfs",
        "6. boot-guard",
        "7. verify",
    ]
    assert not any("rdna1_quirks=" in line for line in lines[: lines.index("4. stock-loader")])  # not in modprobe.d
    guard = lines[lines.index("6. boot-guard") : lines.index("7. verify")]
    assert "    update-grub" in guard
    assert any("trial with rdna1_quirks=0x3" in line and "90 s with graphical.target" in line for line in guard)


# --- verify: the initramfs's copy of a compressed module ------------------------------------------------------------

# What mkinitramfs (initramfs-tools 0.142, /usr/sbin/mkinitramfs: "decompress modules for boot speed, if possible")
# does to an installed amdgpu.ko.xz: `xz -d`, so the image holds amdgpu.ko, other bytes, the same module.
ELF = b"\x7fELF a signed module\n~Module signature appended~\n"


class ImageWith(FakeTool):
    """An initramfs whose unpacked tree holds `carried` at lib/modules/KREL/updates/dkms/ (its index resolving
    amdgpu there, as modinfo -b would say)."""

    def __init__(self, root, journal, carried: bytes, name: str):
        super().__init__(root, journal)
        self.carried, self.carried_name = carried, name
        self.image(KERNEL).write_bytes(b"an image")

    def list_files(self, image):
        return [f"usr/lib/modules/{KERNEL}/updates/dkms/{self.carried_name}"]

    def extract(self, image, dest):
        folder = dest / "main/lib/modules" / KERNEL / "updates/dkms"
        folder.mkdir(parents=True)
        (folder / self.carried_name).write_bytes(self.carried)


def _verify_against(ctx, monkeypatch, tmp_path, carried: bytes, carried_name: str) -> Verified:
    installed = tmp_path / "installed" / "amdgpu.ko.xz"  # DKMS compressed it as 6.12's own modules are
    installed.parent.mkdir()
    installed.write_bytes(lzma.compress(ELF))
    candidate = Candidate(
        ctx.candidate.package, KERNEL, installed, hashlib.sha256(installed.read_bytes()).hexdigest(), None
    )
    monkeypatch.setattr(install_stages, "installed_path", lambda candidate, root: installed)
    monkeypatch.setattr(install_stages, "resolved_module", lambda kernel, module, root: installed)
    monkeypatch.setattr(module_checks, "verify_signature", lambda module, cert: None)

    def modinfo(argv, **kw):  # `modinfo -b <unpacked> -k KREL -n amdgpu`: the image's own index
        unpacked = Path(argv[argv.index("-b") + 1])
        return subprocess.CompletedProcess(
            argv, 0, f"{unpacked}/lib/modules/{KERNEL}/updates/dkms/{carried_name}\n", ""
        )

    monkeypatch.setattr(runner, "run", modinfo)
    tool = ImageWith(ctx.root, ctx.journal, carried, carried_name)
    return install_stages.verify(candidate, ctx.root, tool, ctx.cert)


def test_verify_takes_the_images_decompressed_copy_of_an_installed_ko_xz_as_the_same_module(ctx, monkeypatch, tmp_path):
    """The Debian 12 follow of bookworm-backports' 6.12 (the power-cut test's) failed here: install refused its own
    module because the initramfs held it decompressed."""
    verified = _verify_against(ctx, monkeypatch, tmp_path, ELF, "amdgpu.ko")
    assert verified.initramfs_module == f"lib/modules/{KERNEL}/updates/dkms/amdgpu.ko"


def test_verify_still_refuses_an_image_whose_module_has_other_elf_bytes(ctx, monkeypatch, tmp_path):
    with pytest.raises(BuildError, match=r"resolves amdgpu to lib/modules/.*/updates/dkms/amdgpu.ko \(sha256 "):
        _verify_against(ctx, monkeypatch, tmp_path, ELF.replace(b"signed", b"stale!"), "amdgpu.ko")
