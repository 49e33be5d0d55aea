"""KFD as ROCm sees it: the topology nodes (which processor each GPU node reports, its VRAM banks) and
whether the invoking user may open /dev/kfd and the board's render node.

ROCm's runtime enumerates GPUs from /sys/class/kfd/kfd/topology/nodes/N/properties and opens /dev/kfd
plus /dev/dri/renderD<minor>; Debian and Ubuntu give both to the groups `render` (and `video`), so a user
outside them sees no GPU, with no error worth the name.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core import owner as owners
from rdna1_kmgr.doctor import code_objects
from rdna1_kmgr.doctor.finding import Finding

TOPOLOGY = "sys/class/kfd/kfd/topology/nodes"
HEAP_TYPES = {
    0: "system",
    1: "FB_PUBLIC (host-visible VRAM)",
    2: "FB_PRIVATE",
    3: "GPU GDS",
    4: "GPU LDS",
    5: "GPU scratch",
}
GPU_GROUPS = ("render", "video")


@dataclass(frozen=True)
class KfdNode:
    index: int
    properties: dict[str, int]
    heap_types: tuple[int, ...]

    @property
    def is_gpu(self) -> bool:
        return self.properties.get("simd_count", 0) > 0 or self.properties.get("gfx_target_version", 0) > 0

    @property
    def processor(self) -> str | None:
        version = self.properties.get("gfx_target_version", 0)
        return code_objects.from_kfd_version(version) if version else None

    @property
    def drm_render_minor(self) -> int | None:
        minor = self.properties.get("drm_render_minor")
        return minor if minor is not None and minor >= 0 else None

    def to_json(self) -> dict:
        return {
            "node": self.index,
            "processor": self.processor,
            "gfx_target_version": self.properties.get("gfx_target_version"),
            "device_id": self.properties.get("device_id"),
            "drm_render_minor": self.drm_render_minor,
            "heap_types": list(self.heap_types),
        }


def read_nodes(sysroot: Path) -> list[KfdNode]:
    root = sysroot / TOPOLOGY
    if not root.is_dir():
        return []
    nodes = []
    for entry in sorted(root.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        if not entry.name.isdigit():
            continue
        banks = []
        for bank in sorted((entry / "mem_banks").glob("*/properties")):
            banks.append(read_properties(bank).get("heap_type", -1))
        nodes.append(KfdNode(int(entry.name), read_properties(entry / "properties"), tuple(banks)))
    return nodes


def read_properties(path: Path) -> dict[str, int]:
    """A KFD properties file: `name value` per line, values decimal."""
    values: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return values
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and words[1].lstrip("-").isdigit():
            values[words[0]] = int(words[1])
    return values


# --- the user ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: Path  # inside the sysroot
    groups: tuple[int, ...]  # every gid: primary and supplementary
    group_names: tuple[str, ...]


def invoking_home(sysroot: Path) -> Path | None:
    """The home folder of the user doctor speaks for (SUDO_USER under sudo), None when unknown."""
    user = invoking_user(sysroot)
    return user.home if user is not None else None


def invoking_user(sysroot: Path, name: str | None = None) -> User | None:
    """The user doctor speaks for: `name`, else SUDO_USER under sudo, else who runs it. Read from the
    sysroot's /etc/passwd and /etc/group (on / the system's databases, which may be LDAP too)."""
    on_host = sysroot.resolve() == Path("/")
    if name is None and on_host:
        who = owners.invoking()  # sudo's user, checked against SUDO_UID and the password database
        name = who.name if who else pwd.getpwuid(os.getuid()).pw_name
    elif name is None:
        name = owners.sudo_name()  # a fixture tree: looked up in its own /etc/passwd below
        if name is None:
            return None
    if on_host:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            return None
        groups = {g.gr_gid: g.gr_name for g in grp.getgrall() if name in g.gr_mem}
        try:
            groups[entry.pw_gid] = grp.getgrgid(entry.pw_gid).gr_name
        except KeyError:
            groups[entry.pw_gid] = str(entry.pw_gid)
        return User(
            name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir), tuple(sorted(groups)), tuple(sorted(groups.values()))
        )
    passwd = _colon_file(sysroot / "etc/passwd")
    row = next((r for r in passwd if r[0] == name and len(r) >= 6), None)
    if row is None:
        return None
    uid, gid = int(row[2]), int(row[3])
    groups = {}
    for g in _colon_file(sysroot / "etc/group"):
        if len(g) >= 4 and (name in g[3].split(",") or (g[2].isdigit() and int(g[2]) == gid)):
            groups[int(g[2])] = g[0]
    return User(name, uid, gid, sysroot / row[5].lstrip("/"), tuple(sorted(groups)), tuple(sorted(groups.values())))


def group_id(sysroot: Path, name: str) -> int | None:
    if sysroot.resolve() == Path("/"):
        try:
            return grp.getgrnam(name).gr_gid
        except KeyError:
            return None
    row = next((r for r in _colon_file(sysroot / "etc/group") if r[0] == name and len(r) >= 3), None)
    return int(row[2]) if row and row[2].isdigit() else None


def _colon_file(path: Path) -> list[list[str]]:
    try:
        return [line.split(":") for line in path.read_text().splitlines() if line and not line.startswith("#")]
    except OSError:
        return []


def may_open(path: Path, user: User) -> tuple[bool, str]:
    """Whether `user` may open `path` read-write by its mode bits, and the mode as ls shows it.
    (ACLs that logind adds for the seat's user are not read: a desktop session may have more.)"""
    info = path.stat()
    mode = stat.filemode(info.st_mode)
    if user.uid == 0:
        return True, mode
    if info.st_uid == user.uid:
        bits = info.st_mode >> 6
    elif info.st_gid in user.groups:
        bits = info.st_mode >> 3
    else:
        bits = info.st_mode
    return bits & 0o6 == 0o6, mode


# --- findings ---------------------------------------------------------------------------------------------


def findings(sysroot: Path, nodes: list[KfdNode], user: User | None, board_present: bool) -> list[Finding]:
    result = []
    gpus = [n for n in nodes if n.is_gpu]
    facts = {"nodes": [n.to_json() for n in nodes]}
    if not nodes:
        level = "problem" if board_present else "info"
        result.append(
            Finding(
                "kfd",
                level,
                f"no KFD topology ({sysroot / TOPOLOGY} is absent)",
                "ROCm finds GPUs only through KFD",
                "load amdgpu for the board (KFD is part of it)" if board_present else "",
                facts,
            )
        )
    elif not gpus:
        level = "problem" if board_present else "info"
        result.append(
            Finding(
                "kfd",
                level,
                f"KFD lists {len(nodes)} node(s), none of them a GPU",
                "ROCm will report no GPU agent",
                "check the kernel log for amdgpu/KFD errors (see probe-errors)" if board_present else "",
                facts,
            )
        )
    for node in gpus:
        processor = node.processor or "unknown"
        heaps = ", ".join(HEAP_TYPES.get(h, str(h)) for h in node.heap_types) or "none"
        level = "ok" if processor == "gfx1010" else "warn"
        result.append(
            Finding(
                "kfd",
                level,
                f"KFD node {node.index}: {processor} (gfx_target_version "
                f"{node.properties.get('gfx_target_version')}), VRAM heaps: {heaps}",
                "ROCm loads code for the processor KFD reports (unless HSA_OVERRIDE_GFX_VERSION "
                "says otherwise); heap FB_PUBLIC means a large BAR as ROCm sees it (see bar)",
                "" if level == "ok" else "this is not the RX 5600 XT's gfx1010",
                facts,
            )
        )
    result += _access(sysroot, gpus, user)
    return result


def _access(sysroot: Path, gpus: list[KfdNode], user: User | None) -> list[Finding]:
    if user is None:
        return [
            Finding(
                "access",
                "warn",
                "cannot tell which user to check device access for",
                "ROCm opens /dev/kfd and the render node as the user who runs PyTorch",
                "run as that user, through sudo (SUDO_USER), or give --user NAME",
            )
        ]
    devices = [sysroot / "dev/kfd"]
    devices += [sysroot / f"dev/dri/renderD{n.drm_render_minor}" for n in gpus if n.drm_render_minor is not None]
    if not gpus:
        devices += sorted((sysroot / "dev/dri").glob("renderD*"))
    opened: dict[str, dict | None] = {}
    facts = {"user": user.name, "groups": list(user.group_names), "devices": opened}
    blocked = []
    for device in devices:
        if not device.exists():
            opened[str(device)] = None
            continue
        ok, mode = may_open(device, user)
        opened[str(device)] = {"mode": mode, "read_write": ok}
        if not ok:
            blocked.append(f"{device.relative_to(sysroot)} ({mode})")
    missing = [g for g in GPU_GROUPS if g not in user.group_names and group_id(sysroot, g) is not None]
    groups = f"groups {' '.join(user.group_names) or '(none)'}"
    if blocked:
        return [
            Finding(
                "access",
                "problem",
                f"user {user.name} ({groups}) cannot open {', '.join(blocked)}",
                "ROCm then sees no GPU at all (hipErrorNoDevice, torch.cuda.is_available() False)",
                f"add the user to the {' and '.join(missing or GPU_GROUPS)} group(s): "
                f"`sudo usermod -aG {','.join(missing or GPU_GROUPS)} {user.name}`, then log in again",
                facts,
            )
        ]
    present = [str(d.relative_to(sysroot)) for d in devices if d.exists()]
    if not present:
        return [
            Finding(
                "access", "info", f"user {user.name} ({groups}): no /dev/kfd or render node to check", "", "", facts
            )
        ]
    return [Finding("access", "ok", f"user {user.name} ({groups}) may open {', '.join(present)}", "", "", facts)]
