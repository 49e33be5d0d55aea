"""What on this machine names its owner or the machine itself, and the one function that takes it out of a text
before the owner shares it (`rdna1-kmgr report`).

Collected from the machine, not guessed from the text: the names and homes of real users (passwd entries with
uid 1000-65533, and their full names), the host name (socket.gethostname() on the running system, /etc/hostname,
the kernel's), DMI serial numbers and the product UUID (/sys/class/dmi/id, root's alone to read), the machine ids
(/etc/machine-id, D-Bus's) and network addresses (/sys/class/net/*/address). A value is replaced only where it
stands alone (not inside a longer word, name or path component), longest first, so /home/alice goes before alice
and alice-desktop before either. A user's name (three letters or more) also goes wherever it stands inside a
component of a path (`<home>/alice_sd/venv`, `/opt/alice-torch`): owners name their folders after themselves.
"""

from __future__ import annotations

import pwd
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core import owner

REAL_UIDS = range(1000, 65534)  # Debian's and Fedora's first user up to nobody (65534)
# What firmware writes when it has no serial: common words, never worth hiding, some of them short.
PLACEHOLDERS = {
    "default string",
    "to be filled by o.e.m.",
    "not specified",
    "not applicable",
    "system serial number",
    "chassis serial number",
    "none",
    "n/a",
    "0123456789",
}
NOT_HOSTS = {"localhost", "localhost.localdomain"}
MAC = re.compile(r"(?<![0-9A-Fa-f:])(?:[0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}(?![0-9A-Fa-f:])")
_AROUND = "A-Za-z0-9_.-"  # a value is replaced only where none of these touches it
# Secrets a log line may carry whatever the machine: a URL's user and password (a pip index with credentials), and
# the value of a variable named as a secret (HF_TOKEN=..., GITHUB_TOKEN, *_PASSWORD, *_API_KEY)
URL_CREDENTIALS = re.compile(r"(?<=://)[^/\s@:]+(?::[^/\s@]*)?@")
SECRET_VALUE = re.compile(r"\b([A-Za-z0-9_]*(?:TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY)[A-Za-z0-9_]*)=(\S+)", re.I)
PATH_LIKE = re.compile(r"(?:/[^\s/`'\"(),;:<>|]+)+/?")


@dataclass(frozen=True)
class PrivateValues:
    values: tuple[tuple[str, str], ...]  # (value, what replaces it), longest value first
    unreadable: tuple[str, ...] = ()  # files that may hold a private value and could not be read
    user_names: tuple[str, ...] = ()  # replaced inside path components too, longest first

    def redact(self, text: str) -> str:
        """`text` without any of the values, and without anything shaped like a MAC address, a URL's credentials or
        a secret variable's value."""
        if self.values:
            replacement = dict(self.values)
            pattern = re.compile(
                f"(?<![{_AROUND}])(" + "|".join(re.escape(v) for v, _ in self.values) + f")(?![{_AROUND}])"
            )
            text = pattern.sub(lambda m: replacement[m.group(1)], text)
        if self.user_names:
            inside = re.compile("|".join(re.escape(n) for n in self.user_names))
            text = PATH_LIKE.sub(lambda m: inside.sub("<user>", m.group(0)), text)
        text = URL_CREDENTIALS.sub("<credentials>@", text)
        text = SECRET_VALUE.sub(lambda m: f"{m.group(1)}=<secret>", text)
        return MAC.sub("<mac>", text)

    def redact_value(self, value):
        """A JSON value (dicts, lists, strings) with redact applied to every string in it, keys included."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {self.redact(str(k)): self.redact_value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.redact_value(v) for v in value]
        return value


def collect(sysroot: Path = Path("/")) -> PrivateValues:
    on_host = sysroot.resolve() == Path("/")
    found: dict[str, str] = {}
    unreadable: list[str] = []
    names = set()
    for name, gecos, home in _real_users(sysroot, on_host):
        if len(name) >= 3:
            names.add(name)
        found.setdefault(home, "<home>")
        if not on_host:
            found.setdefault(str(sysroot / home.lstrip("/")), "<home>")
        found.setdefault(name, "<user>")
        full = gecos.split(",")[0].strip()
        if len(full) >= 3:
            found.setdefault(full, "<user>")
    hosts = [socket.gethostname()] if on_host else []
    for rel in ("etc/hostname", "proc/sys/kernel/hostname"):
        hosts.append(_read(sysroot, rel, unreadable))
    for host in hosts:
        for name in {host, host.split(".")[0]}:
            if name and name not in NOT_HOSTS:
                found.setdefault(name, "<host>")
    dmi = sysroot / "sys/class/dmi/id"
    for path in sorted(dmi.glob("*serial*")) + [dmi / "product_uuid"]:
        _secret(_read(sysroot, str(path.relative_to(sysroot)), unreadable), "<serial>", found)
    for rel in ("etc/machine-id", "var/lib/dbus/machine-id"):
        _secret(_read(sysroot, rel, unreadable), "<machine-id>", found)
    for path in sorted(sysroot.glob("sys/class/net/*/address")):
        address = _read(sysroot, str(path.relative_to(sysroot)), unreadable)
        if address and address.strip("0:"):
            found.setdefault(address, "<mac>")
    ordered = tuple(sorted(found.items(), key=lambda item: (-len(item[0]), item[0])))
    return PrivateValues(ordered, tuple(unreadable), tuple(sorted(names, key=lambda n: (-len(n), n))))


def _real_users(sysroot: Path, on_host: bool) -> list[tuple[str, str, str]]:
    """(name, full name, home) of every real user, from the system's databases or the sysroot's passwd."""
    if on_host:
        entries = [(e.pw_name, e.pw_uid, e.pw_gecos, e.pw_dir) for e in pwd.getpwall()]
    else:
        entries = []
        try:
            lines = (sysroot / "etc/passwd").read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        for line in lines:
            fields = line.split(":")
            if len(fields) >= 6 and fields[2].isdigit():
                entries.append((fields[0], int(fields[2]), fields[4], fields[5]))
    sudo = owner.sudo_name() if on_host else None
    return [
        (name, gecos, home)
        for name, uid, gecos, home in entries
        if (uid in REAL_UIDS or name == sudo) and len(name) >= 2 and home not in ("", "/")
    ]


def _secret(value: str, label: str, found: dict[str, str]) -> None:
    if len(value) >= 4 and value.lower() not in PLACEHOLDERS:
        found.setdefault(value, label)


def _read(sysroot: Path, rel: str, unreadable: list[str]) -> str:
    """A file's text under the sysroot, stripped; "" when absent; its path noted when not readable (not root)."""
    try:
        return (sysroot / rel).read_text(errors="replace").strip()
    except PermissionError:
        unreadable.append(f"/{rel}")
        return ""
    except OSError:
        return ""
