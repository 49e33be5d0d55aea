"""Whether a source can be trusted before root compiles and signs it: a clearsigned sums file's signature
(gpgv against a keyring the user names), and a source tree nobody but root could have changed."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from rdna1_kmgr.core import runner
from rdna1_kmgr.core.errors import SourceError, UsageError
from rdna1_kmgr.core.trust import root_problem


def signed_text(clearsigned: bytes, keyring: Path, what: str) -> str:
    """The text a clearsigned file signs, once gpgv verified its signature against `keyring`; else SourceError."""
    keyring = Path(keyring)
    if not keyring.is_file():
        raise UsageError(f"--keyring {keyring}: no such file", "give a keyring file gpgv can read (gpg --export)")
    with tempfile.TemporaryDirectory(prefix="rdna1-kmgr-sums-") as tmp:
        signed, out = Path(tmp) / "sums.asc", Path(tmp) / "sums"
        signed.write_bytes(clearsigned)
        result = runner.run(
            ["gpgv", "--keyring", str(keyring.resolve()), "--output", str(out), str(signed)], check=False, timeout=60
        )
        if result.returncode != 0 or not out.is_file():
            reason = (
                next((ln.strip() for ln in result.stderr.splitlines() if ln.strip()), "")
                or f"gpgv exit status {result.returncode}"
            )
            raise SourceError(
                f"the signature of {what} does not verify against {keyring}: {reason}",
                "nothing was downloaded; give the right --keyring, or the tarball's --sha256",
            )
        return out.read_text(errors="replace")


def check_root_only(tree: Path) -> None:
    """Refuse (SourceError, one line) a source tree someone other than root could have changed since it was
    checked: every folder above it must pass the roots' check (core/trust.root_problem) and every entry in it
    be owned by root (the user the tool runs as) and writable by no one else (a group other than root's
    included). Cheap, links not followed, and enough: what only root can change is what root unpacked and
    checked. Run right before a build that will be signed."""
    problem = root_problem(tree)
    trusted = {0, os.geteuid()}
    for folder, dirs, files in os.walk(tree) if problem is None else ():
        for name in [".", *dirs, *files]:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            if info.st_uid not in trusted:
                problem = f"{path} is owned by uid {info.st_uid}"
            elif not stat.S_ISLNK(info.st_mode) and (
                info.st_mode & stat.S_IWOTH or (info.st_mode & stat.S_IWGRP and info.st_gid != 0)
            ):
                problem = f"{path} is writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
            if problem:
                break
        if problem:
            break
    if problem:
        raise SourceError(
            f"refusing to build and sign {tree}: {problem}, so it may have changed since it was checked",
            "give a tarball or URL (unpacked root-only), or a tree only root can write",
        )
