"""Where a variable of ROCm's environment can be set on a system, and the assignments found there.

System-wide: /etc/environment (pam_env), /etc/security/pam_env.conf, /etc/environment.d/*.conf (systemd's
user sessions), /etc/profile and /etc/profile.d/*.sh (login shells), /etc/bash.bashrc, /etc/zsh/zshenv.
Per user: the shell start files, ~/.config/environment.d/*.conf, ~/.pam_environment, fish's config.
A line is read the way those files are written (`export V=x`, `V="x"`, `V DEFAULT=x`, `set -gx V x`,
`unset V`); nothing is executed, so a value computed at run time shows as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core import user_files

SYSTEM_FILES = (
    "etc/environment",
    "etc/security/pam_env.conf",
    "etc/environment.d/*.conf",
    "etc/profile",
    "etc/profile.d/*.sh",
    "etc/bash.bashrc",
    "etc/zsh/zshenv",
    "etc/zsh/zprofile",
)
USER_FILES = (
    ".profile",
    ".bash_profile",
    ".bash_login",
    ".bashrc",
    ".zshenv",
    ".zprofile",
    ".zshrc",
    ".pam_environment",
    ".config/environment.d/*.conf",
    ".config/fish/config.fish",
)

_ASSIGN = re.compile(
    r"^\s*(?:export\s+|declare\s+-x\s+|setenv\s+|set\s+-[a-zA-Z]*x[a-zA-Z]*\s+)?"
    r"([A-Za-z_][A-Za-z0-9_]*)(?:=|\s+DEFAULT=|\s+OVERRIDE=|\s+(?=\S))(.*)$"
)
_UNSET = re.compile(r"^\s*(?:unset|set\s+-e|unsetenv)\s+(.+)$")


@dataclass(frozen=True)
class Assignment:
    path: Path  # as seen from the sysroot's /, e.g. /etc/profile.d/rocm.sh
    line: int
    name: str
    value: str | None  # None: the line unsets it
    scope: str  # "system", "user" or "process"

    def where(self) -> str:
        return "the environment of this process" if self.scope == "process" else f"{self.path}:{self.line}"

    def to_json(self) -> dict:
        return {"file": str(self.path), "line": self.line, "name": self.name, "value": self.value, "scope": self.scope}


def files(sysroot: Path, home: Path | None) -> list[tuple[Path, str]]:
    """The files that exist, in the order a login reads them roughly: system first, then the user's."""
    found = []
    for pattern in SYSTEM_FILES:
        found += [(p, "system") for p in sorted(sysroot.glob(pattern)) if p.is_file()]
    if home is not None:
        for pattern in USER_FILES:
            found += [(p, "user") for p in sorted(home.glob(pattern)) if p.is_file()]
    return found


def read(path: Path, scope: str, sysroot: Path, wanted, within: Path | None = None) -> list[Assignment]:
    """Assignments in one file of the variables `wanted(name)` accepts. Read as root: a user's file only inside
    `within` (their home), none over 64 KiB (core/user_files.py); a file refused is skipped, as one unreadable."""
    try:
        text = user_files.read_text(path, within or sysroot, user_files.SHELL_FILE)
    except OSError:
        return []
    shown = Path("/") / path.relative_to(sysroot)
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        unset = _UNSET.match(code)
        if unset:
            found += [Assignment(shown, number, n, None, scope) for n in unset.group(1).split() if wanted(n)]
            continue
        match = _ASSIGN.match(code)
        if match and wanted(match.group(1)):
            found.append(Assignment(shown, number, match.group(1), _unquote(match.group(2)), scope))
    return found


def assignments(
    sysroot: Path, home: Path | None, wanted, process_env: dict[str, str] | None = None
) -> list[Assignment]:
    """Every assignment of a wanted variable: the process's own environment first (when given), then files."""
    found = [Assignment(Path("-"), 0, k, v, "process") for k, v in sorted((process_env or {}).items()) if wanted(k)]
    for path, scope in files(sysroot, home):
        found += read(path, scope, sysroot, wanted, home if scope == "user" else sysroot)
    return found


def _unquote(raw: str) -> str:
    value = raw.strip().rstrip(";").strip()
    if value.startswith("DEFAULT="):
        value = value[len("DEFAULT=") :]
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    return value
