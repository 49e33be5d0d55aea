"""The owner: the user whose Python the tool runs (the experiment's probe and cells), and who it runs it as.

Root running the owner's interpreter would run as root whatever the owner (or anything running as the owner)
put in that venv: a `.pth` file in site-packages is Python run at every start. So the owner's Python runs as the
owner (the runner drops to them: `as_user`, core/process_tree.py), and only from a venv that nobody else can change.

The owner is the user who typed `sudo` (SUDO_USER, checked against SUDO_UID and the password database), this
process's own user when it is not root, and otherwise (root itself, a boot unit) the user who owns the venv.
"""

from __future__ import annotations

import os
import pwd
import re
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core.errors import HostError, UsageError
from rdna1_kmgr.core.trust import untrusted
from rdna1_kmgr.core.user_input import USER_NAME

NUMBER = re.compile(r"[0-9]{1,10}")
# The owner's programs get a PATH of a login's system folders (Debian's /etc/profile), not root's.
USER_PATH = "/usr/local/bin:/usr/bin:/bin"
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Owner:
    name: str
    uid: int
    gid: int
    home: str

    def groups(self) -> list[int]:
        """The owner's groups as a login would have them (render and video: /dev/kfd, /dev/dri)."""
        return os.getgrouplist(self.name, self.gid)

    def environment(self) -> dict[str, str]:
        """The variables that say who a process runs as: the owner's, never root's."""
        return {
            "HOME": self.home,
            "USER": self.name,
            "LOGNAME": self.name,
            "PATH": ROOT_PATH if self.uid == 0 else USER_PATH,
        }

    def to_json(self) -> dict:
        return {"name": self.name, "uid": self.uid, "gid": self.gid}

    @classmethod
    def from_json(cls, data: dict | None) -> Owner:
        """The owner a plan recorded, still that user in the password database, or a HostError in one line."""
        data = data or {}
        name, uid, gid = data.get("name"), data.get("uid"), data.get("gid")
        if not (isinstance(name, str) and USER_NAME.fullmatch(name) and type(uid) is int and type(gid) is int):
            raise HostError(
                "the experiment's plan names no valid owner to run the cells as",
                "run `rdna1-kmgr experiment stop`, then start the experiment again with sudo",
            )
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            entry = None
        if entry is None or (entry.pw_name, entry.pw_gid) != (name, gid):
            raise HostError(
                f"the experiment's owner {name} (uid {uid}, gid {gid}) is no longer that user on this machine",
                "run `rdna1-kmgr experiment stop`, then start the experiment again",
            )
        return of_entry(entry)


def of_entry(entry: pwd.struct_passwd) -> Owner:
    return Owner(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def sudo_name() -> str | None:
    """SUDO_USER, when root runs through sudo: a user name by useradd's rule (full match), or a HostError in one
    line; None when this process is not root or not run through sudo. The one place SUDO_USER is read."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("SUDO_USER")
    if name is not None and not USER_NAME.fullmatch(name):
        raise HostError(f"SUDO_USER={name!r} does not name a user", "run the command through sudo from your own login")
    return name


def invoking() -> Owner | None:
    """The user who asked: the one behind sudo (checked), or this process's user when it is not root. None for
    root not through sudo: then the venv's owner is the owner (of_python)."""
    if os.geteuid() != 0:
        return of_entry(pwd.getpwuid(os.geteuid()))
    name, uid = sudo_name(), os.environ.get("SUDO_UID")
    if name is None:
        return None
    if not (uid is not None and NUMBER.fullmatch(uid)):
        raise HostError(
            f"SUDO_USER={name!r} SUDO_UID={uid!r} do not name a user",
            "run the command through sudo from your own login",
        )
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        entry = None
    if entry is None or entry.pw_uid != int(uid):
        raise HostError(
            f"SUDO_USER={name} SUDO_UID={uid} is no user of this machine",
            "run the command through sudo from your own login",
        )
    return of_entry(entry)


def invoking_home() -> Path:
    """The home of the user who asked (invoking), root's own when root runs the tool directly."""
    who = invoking()
    return Path(who.home) if who else Path.home()


def venv_root(python: str | Path) -> Path:
    """<venv>/bin/python3 -> <venv> (/usr/bin/python3 -> /usr)."""
    return Path(os.path.abspath(python)).parent.parent


def of_python(python: str | Path, owner: Owner | None = None) -> Owner:
    """Who runs `python`: `owner` (a plan's), else the invoking user, else the venv's owner; refused in one line
    (UsageError) when the venv, its interpreter or what it loads at every start could be changed by anyone but
    root and that owner."""
    owner = owner or invoking()
    root = venv_root(python)
    if owner is None:
        try:
            owner = of_entry(pwd.getpwuid(os.stat(root).st_uid))
        except (OSError, KeyError) as err:
            raise UsageError(f"{python}: the owner of {root} is not a user of this machine ({err})") from None
    trusted = frozenset({0, owner.uid})
    paths = [Path(python), root]
    for site in sorted(root.glob("lib*/python3*/site-packages")):
        paths += [site, *sorted(site.glob("*.pth"))]
    for path in paths:
        why = untrusted(path, trusted)
        if why:
            raise UsageError(
                f"{python} is not safe to run as {owner.name}: {why}, so someone else could change what it runs",
                f"use a Python only {owner.name} and root can change (chmod go-w; your own venv)",
            )
    return owner
