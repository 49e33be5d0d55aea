"""Whether a path root runs or loads could be changed by someone it does not trust.

A file is only as safe as every folder above it: whoever can write to a folder can rename the file away and put
their own in its place. So the file and each folder up to / must be owned by a trusted user and writable by no
group and no other. One exception, as systemd's and OpenSSH's checks make it: a folder above the path that root
owns with the sticky bit (/tmp, /var/tmp) lets only an entry's owner rename or remove that entry, so its being
writable by all gives nobody a hold on what a trusted user keeps there; the path itself never. Symbolic links on
the way are checked where they are (their owner) and where they lead (the real path), or refused.

What root's units, kernel hooks and apt's Post-Invoke line call is checked so too, for root alone
(`this_command`, `trusted_command`): a copy of the tool in a user's venv or in /tmp is no command for root.
"""

from __future__ import annotations

import os
import pwd
import stat
import sys
from pathlib import Path

from rdna1_kmgr.core.errors import HostError

ROOT = frozenset({0})


def untrusted(
    path: str | Path,
    uids: frozenset[int],
    *,
    links: bool = True,
    missing_ok: bool = False,
    folder: bool = False,
) -> str | None:
    """Why someone outside `uids` could change `path` (a file or a folder), in a few words naming the culprit
    folder; None when nobody can. The one walk every such check makes (the owner's venv, root's commands, the
    roots the tool writes under, the signing key's folder), from / down, its callers differing only in:

    - `links`: a symbolic link on the way is checked where it is (its owner) and where it leads (the real
      path); with links=False it is refused outright (a root the tool writes under);
    - `missing_ok`: a part that does not exist yet passes (the tool makes it, under the folders checked);
    - `folder`: `path` itself must be a folder (every part above it always must).
    """
    path = Path(os.path.abspath(path))
    chains = [path, Path(os.path.realpath(path))] if links else [path]
    seen: set[Path] = set()
    for chain in chains:
        for current in (*reversed(chain.parents), chain):
            if current in seen:
                continue
            seen.add(current)
            try:
                info = os.lstat(current)
            except FileNotFoundError as err:
                if missing_ok:
                    break  # nor is anything below it
                return f"{current}: {err.strerror}"
            except OSError as err:
                return f"{current}: {err.strerror}"
            if stat.S_ISLNK(info.st_mode) and not links:
                return f"{current} is a symbolic link"
            if info.st_uid not in uids:
                return f"{current} is owned by {user_name(info.st_uid)}"
            if stat.S_ISLNK(info.st_mode):
                continue  # a link's own mode means nothing; where it leads is the real path's check
            if (current != chain or folder) and not stat.S_ISDIR(info.st_mode):
                return f"{current} is not a folder"
            sticky_ancestor = current != chain and info.st_mode & stat.S_ISVTX and info.st_uid == 0
            if info.st_mode & 0o022 and not sticky_ancestor:
                who = "all users" if info.st_mode & 0o002 else "its group"
                return f"{current} is writable by {who} (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def command_untrusted(command: Path) -> str | None:
    """Why root running `command` (a console script) at every boot or kernel update would run what someone else
    could change, or None: the script, the interpreter its #! line names, and what that interpreter loads the
    tool from (its venv's site-packages and their .pth files; this running copy's package folder when the
    interpreter is this one's)."""
    try:
        with open(command, "rb") as script:
            first = script.readline(4096)
    except OSError as err:
        return f"{command}: {err.strerror}"
    paths = [command]
    if first.startswith(b"#!"):
        interpreter = Path(first[2:].decode(errors="replace").split()[0])
        venv = interpreter.parent.parent
        paths.append(interpreter)
        for site in sorted(venv.glob("lib*/python3*/site-packages")):
            paths += [site, *sorted(site.glob("*.pth"))]
        if os.path.realpath(interpreter) == os.path.realpath(sys.executable):
            paths.append(Path(__file__).parent.parent)  # the package itself (an editable install's checkout)
    for path in paths:
        why = untrusted(path, ROOT)
        if why:
            return why
    return None


def this_command() -> Path:
    """This installation's rdna1-kmgr (its venv's console script), which root's units, kernel hooks and apt's
    line call by absolute path; a HostError in one line when anyone but root could change what it runs."""
    command = Path(sys.executable).parent / "rdna1-kmgr"
    return trusted_command(command)


def trusted_command(command: Path) -> Path:
    """`command`, or a HostError in one line when root's units and hooks must not call it."""
    why = command_untrusted(command)
    if why:
        raise HostError(
            f"root would run {command} at every boot or kernel update, but {why}",
            "install rdna1-kmgr with install.sh (root's /opt/rdna1-kmgr) and run `/usr/local/bin/rdna1-kmgr`",
        )
    return command


def root_problem(path: Path) -> str | None:
    """What makes `path` unsafe as a root the tool writes under, or None: untrusted(), trusting root and the
    caller, refusing links, passing what the tool will make."""
    if not path.is_absolute():
        return "not an absolute path"
    if ".." in path.parts:
        return "it holds '..'"
    return untrusted(path, frozenset({0, os.geteuid()}), links=False, missing_ok=True, folder=True)


def check_root(path: Path, env: str) -> None:
    """Refuse, in one line, a root folder someone other than root (or the caller) could change under the tool."""
    problem = root_problem(path)
    if problem:
        raise HostError(
            f"refusing {path} as a folder of the tool: {problem}",
            f"make it and its parents root's and not writable by group or others, or unset {env}",
        )
