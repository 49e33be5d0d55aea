"""`follow` as one pipeline: the build's stages, the VM verdict and the install, with the source fetched and the
series rendered once (issue 41: it used to fetch and render, then call the build, which did both again).

Everything that needs a real kernel, DKMS or a VM is a fake here (test_follow_real.py does it for real); the
driver source is fake_kernel's tree and the render is the real one.
"""

import types
from pathlib import Path

import pytest
from fake_kernel import make_tree

from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.follow import kernel_follow
from rdna1_kmgr.install.install_result import InstallResult
from rdna1_kmgr.modbuild import built_module, module_build, module_checks, signing
from rdna1_kmgr.modbuild import dkms_package as dkms
from rdna1_kmgr.modbuild.package_build import PackageBuild
from rdna1_kmgr.vm import verdict

OLD, NEW = "6.1.0-56-amd64", "6.1.0-57-amd64"  # a point release


@pytest.fixture
def point_release(tmp_path, monkeypatch):
    for name, folder in (
        ("RDNA1_KMGR_ROOT", "root"),
        ("RDNA1_KMGR_STATE", "state"),
        ("RDNA1_KMGR_LOG", "log"),
        ("RDNA1_KMGR_CACHE", "cache"),
        ("RDNA1_KMGR_DKMS_SOURCE_TREE", "usr-src"),
        ("RDNA1_KMGR_DKMS_TREE", "dkms"),
    ):
        (tmp_path / folder).mkdir()
        monkeypatch.setenv(name, str(tmp_path / folder))
    (tmp_path / "root/lib/modules" / NEW / "kernel").mkdir(parents=True)
    tree = make_tree(tmp_path / "src", "6.1.193")
    calls = {"fetch": 0, "render": 0, "build": 0, "install": 0}

    def fetch(request, kernel, system):
        calls["fetch"] += 1
        return tree, {"package": "linux-source-6.1", "version": "6.1.193-1"}

    real_render = module_build.render

    def render(*args, **kwargs):
        calls["render"] += 1
        return real_render(*args, **kwargs)

    keys = signing.KeyPair(tmp_path / "mok.priv", tmp_path / "mok.der", "debian")
    module = tmp_path / "amdgpu.ko"

    def build_package(package, kernel, source_root, subtrees, series_dir, *args, **kwargs):
        calls["build"] += 1
        assert source_root == tree and (series_dir / "series").is_file()  # the one render's series
        report = module_checks.ModuleReport(module, "ab" * 32, f"{kernel} SMP", "signer", ("rdna1_quirks",), ())
        return PackageBuild(package, kernel, module, report, keys, False, 3, 1.0, None)

    def install(request):
        calls["install"] += 1
        return InstallResult(
            NEW, dkms.PACKAGE_NAME, "6.1.193+p0123456789ab", False, next_boot=("next boot: the patched amdgpu",)
        )

    passing = types.SimpleNamespace(verdict="pass", module_sha256="ab" * 32)
    installed = kernel_follow.Installed(
        OLD, dkms.Package(dkms.PACKAGE_NAME, "6.1.192+p0123456789ab"), dkms.Trees.from_env(), [], [0x731F]
    )
    monkeypatch.setattr(kernel_follow, "finished_installs", lambda: {})
    monkeypatch.setattr(kernel_follow, "current_install", lambda exclude=None: installed)
    monkeypatch.setattr(kernel_follow.signing, "resolve", lambda key, cert, platform: keys)
    monkeypatch.setattr(module_build.distro_source, "kernel_package", lambda release, system: ("6.1.193-1", None))
    monkeypatch.setattr(module_build, "source_tree", fetch)
    monkeypatch.setattr(module_build, "render", render)
    monkeypatch.setattr(module_build.prerequisites, "ensure_prerequisites", lambda *a, **k: None)
    monkeypatch.setattr(module_build.signing, "ensure", lambda keys: False)
    monkeypatch.setattr(module_build.compile_probes, "confirm", lambda release, names: False)
    monkeypatch.setattr(module_build, "build_package", build_package)
    monkeypatch.setattr(
        module_build.signing, "certificate_info", lambda cert: types.SimpleNamespace(sha1_fingerprint="00")
    )
    monkeypatch.setattr(
        built_module, "for_kernel", lambda kernel: types.SimpleNamespace(path=module, selftest_cases=())
    )
    monkeypatch.setattr(verdict, "passing_record", lambda path, kernel: passing)
    monkeypatch.setattr(kernel_follow.module_install, "run", install)
    return calls


def test_a_point_release_follow_fetches_and_renders_once(point_release, capsys):
    done = kernel_follow.follow(NEW)
    assert done.state == "patched" and done.verdict == "pass"
    assert point_release == {"fetch": 1, "render": 1, "build": 1, "install": 1}
    log = Path(done.log).read_text().splitlines()
    assert [line for line in log if line.startswith("--- ") or line.startswith("rdna1-kmgr: --- ")] == [
        f"rdna1-kmgr: --- {stage}" for stage in ("image", "source", "render", "build", "vm-test", "install")
    ]
    assert sum(line.startswith("rdna1-kmgr: source ") for line in log) == 1
    assert sum(line.startswith("rdna1-kmgr: rendered ") for line in log) == 1
    assert "rdna1-kmgr: next boot: the patched amdgpu" in log


def test_a_failing_stage_is_recorded_under_follows_stage_name(point_release, monkeypatch):
    def no_headers(*args, **kwargs):
        raise HostError("linux-headers-6.1.0-57-amd64 is missing", "install it")

    monkeypatch.setattr(module_build.prerequisites, "ensure_prerequisites", no_headers)
    with pytest.raises(kernel_follow.StageFailed) as failed:
        kernel_follow.follow(NEW)
    assert failed.value.stage == "build"  # the prerequisites are the build's, as they were inside `build`
    assert point_release["install"] == 0


def test_follows_install_plan_names_the_stages_of_installs_pipeline():
    ctx = types.SimpleNamespace(kernel=types.SimpleNamespace(release=NEW))
    (line,) = kernel_follow.InstallStage().plan(ctx)
    # install's stages as `rdna1-kmgr install --dry-run` numbers them (tests/install/test_module_install.py)
    assert "dkms-install, depmod, modprobe-conf, initramfs, verify" in line
    assert "dkms-install, depmod, modprobe-conf, stock-loader, initramfs, boot-guard, verify" in line
    assert line.endswith(f"`rdna1-kmgr install --kernel {NEW} --dry-run`")
