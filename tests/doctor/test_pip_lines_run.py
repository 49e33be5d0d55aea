"""Every pip line doctor prints works when run as printed, on the stack it was printed for (issue 50).

Six owners' machines, each a board fixture whose owner has a real venv (or a system Python's site) holding what
they installed, from wheels made at test time (wheel_index.py): TheRock's nightly without the device wheels
(Ubuntu), an A1111 venv with torch 1.13.1+rocm5.2, pytorch.org's torch 2.7.1+rocm6.3 beside AMD's apt ROCm 6.4.1,
a CUDA torch (Fedora), a conda env holding TheRock's release, and a system Python's torch. doctor runs; the
line of its torch finding is run by `sh` with real pip, every https index replaced by the test's mirror of it,
where each build sits only on the index TheRock published it to (ROCm/TheRock at 89553ce3: RELEASES.md line
107, build_tools/setup_venv.py lines 57-59, #6550). Then the venv the line names must hold the board's code, and
doctor, asked again, must say so.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from doctor_checks import GFX1030, HOST, board_root, bundle, by_check, run
from therock_fixtures import elf_library
from wheel_index import Wheel, host_only, local, publish, therock_release

pytestmark = pytest.mark.system  # real venvs and pip: seconds each

OLD_NIGHTLY = "https://rocm.nightlies.amd.com/whl-multi-arch/"  # RELEASES.md:107, the nightlies until 2026-08-22
NIGHTLY = "https://nightly.repo.amd.com/rocm/whl-next/"  # setup_venv.py:59, since #7547
OLD_STABLE = "https://repo.amd.com/rocm/whl-multi-arch/"  # #6550, the releases until 2026-08-22
STABLE = "https://stable.repo.amd.com/rocm/whl-next/"  # setup_venv.py:57, since #7547
JUNE_NIGHTLY = ("7.13.0a20260601", "2.11.0+rocm7.13.0a20260601")
NOVEMBER_NIGHTLY = ("10.2.0a20261120", "2.13.0+rocm10.2.0a20261120")
RELEASE = ("10.1.0", "2.12.0+rocm10.1.0")


@pytest.fixture(scope="module")
def mirror(tmp_path_factory) -> Path:
    """TheRock's indexes as the test's world has them: each build on the index it was published to only."""
    root = tmp_path_factory.mktemp("mirror")
    scratch = tmp_path_factory.mktemp("stage")
    publish(root, OLD_NIGHTLY, therock_release(scratch, *JUNE_NIGHTLY))
    publish(root, NIGHTLY, therock_release(scratch, *NOVEMBER_NIGHTLY))
    publish(root, OLD_STABLE, therock_release(scratch, *RELEASE))
    (root / "stable.repo.amd.com/rocm/whl-next").mkdir(parents=True)  # promotion there is for later (#7351)
    return root


def pip_env(home: Path) -> dict[str, str]:
    return {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PIP_CONFIG_FILE": os.devnull,  # only the line's indexes, never the machine's pip.conf
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
    }


def make_venv(path: Path, wheels: list[Path], home: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, env=pip_env(home))
    if wheels:
        subprocess.run(
            [str(path / "bin/python"), "-m", "pip", "install", "-q", "--no-index", "--no-deps", *map(str, wheels)],
            check=True,
            env=pip_env(home),
        )
    return path


def other_torch(scratch: Path, version: str, hip: str | None, cuda: str | None, arches: tuple[str, ...]) -> Path:
    """A torch that is not TheRock's: its version.py, and libtorch_hip.so with offload bundles for `arches`."""
    files = {"torch/version.py": f"__version__ = '{version}'\ncuda = {cuda!r}\nhip = {hip!r}\n".encode()}
    if hip:
        library = elf_library(scratch / f"lib-{version}/libtorch_hip.so", payload=bundle(HOST, *arches))
        files["torch/lib/libtorch_hip.so"] = library.read_bytes()
    return Wheel("torch", version, files).write(scratch / "wheels")


def printed_line(result: dict, check: str = "torch") -> str:
    """The first command of the first finding of `check` that has a fix: what an owner would copy."""
    return printed_lines(result, check)[0]


def printed_lines(result: dict, check: str = "torch") -> list[str]:
    """Every command of that finding: the fix and the other channel's."""
    todo = next(f["todo"] for f in by_check(result, check) if f["level"] in ("problem", "warn") and f["todo"])
    return re.findall(r"`([^`]+)`", todo)


def run_line(line: str, tree, mirror: Path) -> subprocess.CompletedProcess[str]:
    home = tree.root / "home/owner"
    command = local(line, mirror).replace("/home/owner/", f"{home}/")
    return subprocess.run(["sh", "-c", command], cwd=home, env=pip_env(home), capture_output=True, text=True)


def carries_gfx1010(venv: Path) -> bool:
    """What the wheels the test made put there for gfx1010: the device wheel's kpack archive and its dist-info."""
    (site,) = venv.glob("lib/python3*/site-packages")
    return (site / "torch/.kpack/torch_gfx1010.kpack").is_file() and any(site.glob("amd_torch_device_gfx1010-*"))


def torch_of(result: dict, venv: Path) -> dict:
    return next(f for f in by_check(result, "torch") if str(venv) in f["seen"] or venv.name in f["seen"])


def test_therock_nightly_without_its_device_wheel_gets_it_in_the_same_venv_from_its_own_index(tmp_path, mirror):
    tree = board_root(tmp_path)
    home = tree.root / "home/owner"
    wheels = [w.write(tmp_path / "wheels") for w in host_only(therock_release(tmp_path, *JUNE_NIGHTLY))]
    venv = make_venv(home / "venv", wheels, home)
    line = printed_line(run(tree))
    assert line.startswith(f"/home/owner/venv/bin/python -m pip install --index-url {OLD_NIGHTLY} "), line
    first = run(tree)
    done = run_line(line, tree, mirror)
    assert done.returncode == 0, done.stdout + done.stderr
    assert carries_gfx1010(venv)
    assert torch_of(run(tree), venv)["level"] == "ok"
    # the release channel instead: a new venv (the nightly's venv would keep its torch)
    (other,) = printed_lines(first)[1:]
    assert other.startswith("python3 -m venv ~/therock-venv && "), other
    done = run_line(other, tree, mirror)
    assert done.returncode == 0, done.stdout + done.stderr
    assert carries_gfx1010(home / "therock-venv")


def test_a_venv_holding_another_torch_gets_a_new_venv_that_carries_the_boards_code(tmp_path, mirror):
    """The A1111 venv (torch 1.13.1+rocm5.2, gfx1030 code only) and pytorch.org's 2.7.1+rocm6.3 beside AMD's
    apt ROCm 6.4.1: `torch[device-gfx1010]` asked of either venv installs nothing (pip: "does not provide the
    extra"), so the line makes ~/therock-venv and leaves the owner's venv as it was."""
    for name, version, hip in (
        ("stable-diffusion-webui/venv", "1.13.1+rocm5.2", "5.2.21151"),
        ("rocm63", "2.7.1+rocm6.3", "6.3.42131"),
    ):
        tree = board_root(tmp_path / name.split("/")[0])
        tree.file("opt/rocm-6.4.1/lib/libamdhip64.so.6", "")
        home = tree.root / "home/owner"
        venv = make_venv(home / name, [other_torch(tmp_path, version, hip, None, (GFX1030,))], home)
        before = sorted(p.name for p in venv.glob("lib/python3*/site-packages/*"))
        first = run(tree)
        assert torch_of(first, venv)["level"] == "problem"
        line = printed_line(first)
        assert line.startswith("python3 -m venv ~/therock-venv && ~/therock-venv/bin/python -m pip install "), line
        done = run_line(line, tree, mirror)
        assert done.returncode == 0, done.stdout + done.stderr
        assert carries_gfx1010(home / "therock-venv")
        assert sorted(p.name for p in venv.glob("lib/python3*/site-packages/*")) == before
        assert torch_of(run(tree), home / "therock-venv")["level"] == "ok"
        # the release channel's line beside it works too (a release on the index it was promoted to)
        (other,) = printed_lines(first)[1:]
        shutil.rmtree(home / "therock-venv")
        done = run_line(other, tree, mirror)
        assert done.returncode == 0, done.stdout + done.stderr
        assert carries_gfx1010(home / "therock-venv")


def test_a_cuda_torch_on_an_amd_only_machine_is_a_problem_whose_line_works(tmp_path, mirror):
    tree = board_root(tmp_path)
    home = tree.root / "home/owner"
    make_venv(home / "venv", [other_torch(tmp_path, "2.5.1+cu124", None, "12.4", ())], home)
    first = run(tree)
    torch = torch_of(first, home / "venv")
    assert torch["level"] == "problem" and "a CUDA 12.4 build, no HIP" in torch["seen"], torch
    assert "no NVIDIA GPU" in torch["why"]
    done = run_line(printed_line(first), tree, mirror)
    assert done.returncode == 0, done.stdout + done.stderr
    assert carries_gfx1010(home / "therock-venv")


def test_a_conda_env_gets_its_own_python_and_a_release_found_on_the_index_it_was_published_to(tmp_path, mirror):
    tree = board_root(tmp_path)
    home = tree.root / "home/owner"
    wheels = [w.write(tmp_path / "wheels") for w in host_only(therock_release(tmp_path, *RELEASE))]
    env = make_venv(home / "miniconda3/envs/sd", wheels, home)
    (env / "conda-meta").mkdir()
    (env / "conda-meta/history").write_text("")
    line = printed_line(run(tree))
    assert line.startswith(
        f"/home/owner/miniconda3/envs/sd/bin/python -m pip install --index-url {STABLE} --extra-index-url {OLD_STABLE} "
    ), line
    done = run_line(line, tree, mirror)
    assert done.returncode == 0, done.stdout + done.stderr
    assert carries_gfx1010(env)


def test_a_system_pythons_torch_gets_a_new_venv_never_break_system_packages(tmp_path, mirror):
    tree = board_root(tmp_path)
    site = tree.root / "usr/lib/python3/dist-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch/version.py").write_text("__version__ = '2.6.0'\ncuda = None\nhip = None\n")
    first = run(tree)
    line = printed_line(first)
    todo = next(f["todo"] for f in by_check(first, "torch") if f["todo"])
    assert line.startswith("python3 -m venv ~/therock-venv && ") and "--break-system-packages" not in todo
    done = run_line(line, tree, mirror)
    assert done.returncode == 0, done.stdout + done.stderr
    assert carries_gfx1010(tree.root / "home/owner/therock-venv")


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs sh")
def test_the_mirror_refuses_a_nightly_pin_on_the_index_it_was_not_published_to(tmp_path, mirror):
    """The test's world can tell a wrong index: the June nightly's device wheel is not on today's nightly index."""
    tree = board_root(tmp_path)
    home = tree.root / "home/owner"
    wheels = [w.write(tmp_path / "wheels") for w in host_only(therock_release(tmp_path, *JUNE_NIGHTLY))]
    make_venv(home / "venv", wheels, home)
    wrong = (
        f'/home/owner/venv/bin/python -m pip install --index-url {NIGHTLY} "torch[device-gfx1010]=={JUNE_NIGHTLY[1]}"'
    )
    assert run_line(wrong, tree, mirror).returncode != 0
