"""A real PyTorch (the CPU build from PyPI) for the experiment's workload: `torch_python`."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import persistent_cache_root

TORCH = "torch==2.13.0"


def _has_torch(python: Path) -> bool:
    return python.is_file() and subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode == 0


def _on_this_python(venv: Path) -> bool:
    """The venv stands on the Python this test run's own venv stands on (the system's python3 for the suite's
    /opt venv), so that the whole-system image, which gets the tool's venv and this one copied in, can run it:
    a venv made from another Python (pyenv's, say) links to a file the image does not have."""
    try:
        config = dict(line.split(" = ", 1) for line in (venv / "pyvenv.cfg").read_text().splitlines() if " = " in line)
    except OSError:
        return False
    return Path(config.get("home", "")) == Path(sys._base_executable).parent


@pytest.fixture(scope="session")
def torch_python() -> str:
    named = os.environ.get("RDNA1_KMGR_TORCH_PYTHON")
    if named:
        return named
    root = persistent_cache_root()
    venv = root / "torch-venv-2.13.0"
    python = venv / "bin" / "python"
    with open(root / "torch-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # sessions share it; one makes it
        if not (_has_torch(python) and _on_this_python(venv)):
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            made = subprocess.run([str(python), "-m", "pip", "install", "-q", TORCH], capture_output=True, text=True)
            if made.returncode != 0:
                pytest.skip(
                    f"cannot install {TORCH} ({made.stderr.strip().splitlines()[-1:]}); set "
                    "RDNA1_KMGR_TORCH_PYTHON to a Python with torch"
                )
    return str(python)
