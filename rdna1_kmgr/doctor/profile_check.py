"""The installed user-space profile (`rdna1-kmgr profile install`) and the profile variables set elsewhere."""

from __future__ import annotations

from pathlib import Path

from rdna1_kmgr.doctor.finding import Finding
from rdna1_kmgr.install import user_profile
from rdna1_kmgr.install.profile_journal import ProfileJournal
from rdna1_kmgr.userspace import environment_files, profiles

OURS = {f"/{user_profile.ENVIRONMENT_D}", f"/{user_profile.PROFILE_D}"}


def _profile_variable(name: str) -> bool:
    """A variable some profile sets (the override aside: gfx-override reports it wherever it is)."""
    if name == profiles.OVERRIDE:
        return False
    return name.startswith(profiles.SOLVER_PREFIX) or any(name in p.set for p in profiles.load().values())


def findings(sysroot: Path, home: Path | None, board: bool = True) -> list[Finding]:
    on_host = sysroot.resolve() == Path("/")
    named = {
        f"/{rel}": user_profile.named_in(sysroot / rel) for rel in (user_profile.ENVIRONMENT_D, user_profile.PROFILE_D)
    }
    names = {n for n in named.values() if n is not None}
    # The journal is this machine's; under --sysroot the files alone say what is installed, and so they do for
    # the owner, who runs doctor and cannot read root's journal (0700).
    journal = ProfileJournal() if on_host else None
    unread = "not read (sysroot)"
    try:
        journaled = journal is not None and journal.exists()
    except PermissionError:
        journal, journaled, unread = None, False, "not read (root's alone; `sudo rdna1-kmgr status` shows it)"
    installed = next(iter(names)) if journal is None and len(names) == 1 else None
    if journal is not None and journaled:
        installed = user_profile.installed_by(journal.state())
    facts = {"files": named, "journaled": installed if journal is not None else unread}
    result = []
    if not names and installed is None:
        result.append(
            Finding(
                "profile",
                "info",
                "no rdna1-kmgr user-space profile installed",
                "",
                "find what your board needs with `rdna1-kmgr experiment` (on this desktop, no "
                "reboot), then `rdna1-kmgr experiment apply`"
                if board
                else "",
                facts,
            )
        )
    elif names == {installed} and None not in named.values():
        result.append(
            Finding(
                "profile",
                "ok",
                f"profile {installed} installed ({', '.join(named)})",
                profiles.get(installed).summary if installed in profiles.load() else "",
                "log in again for a desktop session to pick it up",
                facts,
            )
        )
    else:
        result.append(
            Finding(
                "profile",
                "warn",
                f"profile files and journal disagree: files {named}, " f"journal {installed or 'none'}",
                "a file was changed or removed by hand since `profile install`",
                "run `rdna1-kmgr profile install NAME` again, or `rdna1-kmgr profile remove`",
                facts,
            )
        )
    elsewhere = [a for a in environment_files.assignments(sysroot, home, _profile_variable) if str(a.path) not in OURS]
    if elsewhere:
        shown = "; ".join(f"{a.name}={a.value} in {a.where()}" for a in elsewhere[:5])
        result.append(
            Finding(
                "profile",
                "warn",
                f"profile variables also set outside rdna1-kmgr's files: {shown}",
                "whichever file is read last wins: the experiment's result may not be what runs",
                "keep these settings in one place",
                {"assignments": [a.to_json() for a in elsewhere]},
            )
        )
    return result
