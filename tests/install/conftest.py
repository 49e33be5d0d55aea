"""Fixtures of the tests of several kernels' installs (rollback's order, the shared files)."""

import pytest

from rdna1_kmgr.install import journal as jr
from rdna1_kmgr.install.target_root import ROOT_ENV


@pytest.fixture
def root(tmp_path, monkeypatch):
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
        journal.begin("install", kernel=kernel)
        journal.record_intent("stock-loader", None, [path], [])
        path.write_text(content)
        journal.append("done", step="stock-loader")
        journal.append("commit")

    return install
