"""Where a variable of ROCm's environment can be set on a system, and the assignments found there.

System-wide: /etc/environment (pam_env), /etc/security/pam_env.conf, /etc/environment.d/*.conf (systemd's
user sessions), /etc/profile and /etc/profile.d/*.sh (login shells), /etc/bash.bashrc, /etc/zsh/zshenv, and the
systemd user units of every user (/etc/systemd/user/*.service). Per user: the shell start files,
~/.config/environment.d/*.conf, ~/.pam_environment, fish's config, their systemd user units; the variables of
each conda env in their home (`conda env config vars set` writes them to <env>/conda-meta/state, and
<env>/etc/conda/activate.d/*.sh runs at `conda activate`); and the launchers that set ROCm's variables for the
program they start (A1111's webui-user.sh and webui.sh, which exports HSA_OVERRIDE_GFX_VERSION=10.3.0 for Navi 1
boards itself; ComfyUI's shell scripts).

A line is read the way those files are written: every `NAME=value` of `export A=1 B=2` or `declare -x`, the
assignments before a command (`A=1 python launch.py`), `Environment=A=1 "B=2"` in a unit, `V DEFAULT=x`,
`set -gx V x`, `unset V`; nothing is executed, so a value computed at run time shows as written.
"""

from __future__ import annotations

import json
import re
import shlex
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
    ".config/systemd/user/*.service",
)
SYSTEM_UNITS = ("etc/systemd/user/*.service",)
# conda envs (a base install and its envs, up to two levels below home) and launchers, in the user's home
CONDA_STATES = ("*/conda-meta/state", "*/envs/*/conda-meta/state", ".*/envs/*/conda-meta/state")
CONDA_SCRIPTS = ("*/etc/conda/activate.d/*.sh", "*/envs/*/etc/conda/activate.d/*.sh")
LAUNCHERS = ("*/webui-user.sh", "*/webui.sh", "*/*/webui-user.sh", "ComfyUI/*.sh", "*/ComfyUI/*.sh")
_EXPORTERS = ("export", "declare", "typeset", "readonly", "local")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

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
    """The files that exist, in the order a login reads them roughly: system first, then the user's, then
    their conda envs' and launchers'."""
    found = []
    for pattern in SYSTEM_FILES + SYSTEM_UNITS:
        found += [(p, "system") for p in sorted(sysroot.glob(pattern)) if p.is_file()]
    if home is not None:
        for pattern in USER_FILES + CONDA_STATES + CONDA_SCRIPTS + LAUNCHERS:
            found += [(p, "user") for p in sorted(home.glob(pattern)) if p.is_file()]
    return found


def described(sysroot: Path, home: Path | None, user: str | None, process: bool) -> str:
    """What files() reads on this machine, counted, for a finding that says where it looked."""
    read = files(sysroot, home)
    system = sum(scope == "system" for _, scope in read)
    mine = [p for p, scope in read if scope == "user"]
    kinds = {
        "conda env files": sum(p.name == "state" or "activate.d" in p.parts for p in mine),
        "launchers": sum(p.name in ("webui-user.sh", "webui.sh") or "ComfyUI" in p.parts for p in mine),
        "systemd user units": sum(p.suffix == ".service" for p in mine),
    }
    shell = len(mine) - sum(kinds.values())
    parts = (["this process's environment"] if process else []) + [f"{system} system files"]
    if user is not None:
        parts.append(f"{user}'s {shell} shell files" + "".join(f", {n} {k}" for k, n in kinds.items() if n))
    return ", ".join(parts)


def read(path: Path, scope: str, sysroot: Path, wanted, within: Path | None = None) -> list[Assignment]:
    """Assignments in one file of the variables `wanted(name)` accepts. Read as root: a user's file only inside
    `within` (their home), none over 64 KiB (core/user_files.py); a file refused is skipped, as one unreadable."""
    try:
        text = user_files.read_text(path, within or sysroot, user_files.SHELL_FILE)
    except OSError:
        return []
    shown = Path("/") / path.relative_to(sysroot)
    if path.name == "state" and path.parent.name == "conda-meta":
        return _conda_state(text, shown, scope, wanted)
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        found += [Assignment(shown, number, n, v, scope) for n, v in line_assignments(code) if wanted(n)]
    return found


def line_assignments(code: str) -> list[tuple[str, str | None]]:
    """(name, value) for every variable one line sets, value None for one it unsets."""
    unset = _UNSET.match(code)
    if unset:
        return [(name, None) for name in unset.group(1).split()]
    unit = code.strip().startswith("Environment=")
    try:
        words = shlex.split(code.strip()[len("Environment=") :] if unit else code)
    except ValueError:  # an unclosed quote: read it the simple way below
        words = []
    if words and (unit or words[0] in _EXPORTERS):
        pairs = [w.partition("=") for w in (words if unit else words[1:]) if not w.startswith("-")]
        named: list[tuple[str, str | None]] = [(n, v) for n, eq, v in pairs if eq and _NAME.fullmatch(n)]
        if named or not unit:
            return named
    prefix: list[tuple[str, str | None]] = []
    for word in words:  # `A=1 B=2` alone, or before the command they are for
        name, eq, value = word.partition("=")
        if not (eq and _NAME.fullmatch(name)):
            break
        prefix.append((name, value))
    if prefix:
        return prefix
    match = _ASSIGN.match(code)  # pam_env's `V DEFAULT=x`, fish's `set -gx V x`, csh's `setenv V x`
    return [(match.group(1), _unquote(match.group(2)))] if match else []


def _conda_state(text: str, shown: Path, scope: str, wanted) -> list[Assignment]:
    """conda's env vars (`conda env config vars set`): the JSON object `env_vars` of <env>/conda-meta/state."""
    try:
        variables = json.loads(text).get("env_vars") or {}
    except (ValueError, AttributeError):
        return []
    lines = text.splitlines()
    found = []
    for name, value in variables.items():
        if isinstance(name, str) and wanted(name):
            number = next((n for n, line in enumerate(lines, 1) if f'"{name}"' in line), 1)
            found.append(Assignment(shown, number, name, str(value), scope))
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
