"""`rdna1-kmgr profile install|remove`: a user-space profile written system-wide, journaled, undone exactly.

Two files carry it, because desktops and shells read different ones:

    /etc/environment.d/90-rdna1-kmgr.conf   systemd's user manager: what a graphical session's programs get
    /etc/profile.d/rdna1-kmgr.sh            login shells; also unsets what the profile unsets

environment.d cannot unset a variable, so an HSA_OVERRIDE_GFX_VERSION set elsewhere for a desktop session
stays; doctor names every place it is still set. Each write is a journal step with a backup first
(install/journal.py); `rollback` (or `profile remove`) replays it backwards.
"""

from __future__ import annotations

from pathlib import Path

from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.install import rollback
from rdna1_kmgr.install.journal import locked, refuse_if_busy
from rdna1_kmgr.install.journal_records import Commit, ProfileBegin
from rdna1_kmgr.install.journal_state import State
from rdna1_kmgr.install.profile_journal import (
    PROFILE_ENVIRONMENT_D,
    PROFILE_PROFILE_D,
    ProfileJournal,
    write_files,
)
from rdna1_kmgr.install.profile_result import ProfileInstalled, ProfileRemoved
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.userspace import environment_files, profiles

ENVIRONMENT_D = PROFILE_ENVIRONMENT_D
PROFILE_D = PROFILE_PROFILE_D
MARK = "# rdna1-kmgr profile "  # first line of both files: "# rdna1-kmgr profile NAME: summary"


def file_contents(profile: profiles.Profile) -> dict[str, bytes]:
    """What each file holds for `profile`, relative path -> bytes."""
    head = (
        f"{MARK}{profile.name}: {profile.summary}\n"
        "# written by `rdna1-kmgr profile install`; undo with `rdna1-kmgr profile remove` or `rollback`\n"
    )
    env_d = head + "".join(f"{k}={v}\n" for k, v in sorted(profile.set.items()))
    if profile.unset:
        env_d += f"# not expressible here, done in /{PROFILE_D}: unset {' '.join(profile.unset)}\n"
    shell = head + "".join(f"unset {name}\n" for name in profile.unset)
    shell += "".join(f"export {k}={v}\n" for k, v in sorted(profile.set.items()))
    return {ENVIRONMENT_D: env_d.encode(), PROFILE_D: shell.encode()}


def shell_conflicts(profile: profiles.Profile, root: Path, home: Path | None) -> list[str]:
    """Warnings for every line of another file that sets a variable this profile sets or unsets to something
    else. The profile cannot win over them: an `export` in ~/.bashrc runs after /etc/profile.d in a login
    shell, and environment.d reaches only systemd user units; the owner has to edit that line."""
    ours = {Path("/") / ENVIRONMENT_D, Path("/") / PROFILE_D}
    touched = set(profile.set) | set(profile.unset)
    found = environment_files.assignments(root, home, lambda name: name in touched)
    return [
        f"warning: {a.path}:{a.line} sets {a.name}={a.value}; this profile cannot undo it (a shell file runs "
        f"after /etc/profile.d, environment.d reaches only systemd user units): edit that line"
        for a in found
        if a.path not in ours and a.value is not None and a.value != profile.set.get(a.name)
    ]


def plan(profile: profiles.Profile, root: TargetRoot, home: Path | None = None) -> list[str]:
    """The steps, and a warning for each line of a shell file (the system's, `home`'s) the profile cannot undo."""
    lines = []
    current = ProfileJournal()
    if current.exists():
        lines.append("first roll back the installed profile:")
        lines += [f"  {line}" for line in rollback.plan_for(current, keep_build=True)]
    lines.append(f"install the user-space profile {profile.name} ({profile.summary}):")
    for rel, data in file_contents(profile).items():
        path = root.path / rel
        verb = "replace" if path.exists() else "create"
        lines.append(f"  {verb} {path} (backed up in the journal first):")
        lines += [f"      {line}" for line in data.decode().splitlines() if not line.startswith("#")]
    lines.append(f"  journal: {current.path}")
    return lines + shell_conflicts(profile, root.path, home)


def install(name: str, dry_run: bool = False, home: Path | None = None) -> ProfileInstalled:
    """`home`: the owner's home folder, whose shell files are checked for lines the profile cannot undo."""
    profile = profiles.installable(name)
    if profile.changes_nothing:
        raise UsageError(f"profile {name!r} changes nothing", "choose a profile that sets or unsets something")
    root = TargetRoot.from_env()
    refuse_if_busy()
    lines = plan(profile, root, home)
    if dry_run:
        return ProfileInstalled(profile, True, tuple(lines))
    said = []
    with locked(f"profile install {name}"):
        journal = ProfileJournal()
        if journal.exists():
            said += rollback.replay(journal, keep_build=True, reason=f"replaced by profile {name}")
            journal = ProfileJournal()
        journal.begin(ProfileBegin(name, str(root.path)))
        said += write_files(journal, {root.path / rel: data for rel, data in file_contents(profile).items()})
        journal.append(Commit())
    warnings = [line for line in lines if line.startswith("warning: ")]
    return ProfileInstalled(profile, False, tuple(lines), done=tuple(said + warnings))


def remove(dry_run: bool = False) -> ProfileRemoved:
    journal = ProfileJournal()
    refuse_if_busy()
    if not journal.exists():
        return ProfileRemoved(False, dry_run, message="no user-space profile is installed")
    lines = tuple(rollback.plan_for(journal, keep_build=True))
    if dry_run:
        return ProfileRemoved(True, True, plan=lines)
    with locked("profile remove"):
        said = rollback.replay(journal, keep_build=True, reason="rdna1-kmgr profile remove")
    return ProfileRemoved(True, False, plan=lines, done=tuple(said))


def status() -> dict:
    """The installed profile as its journal and its files say; for `status` and `doctor`."""
    journal = ProfileJournal()
    root = TargetRoot.from_env()
    files = {f"/{rel}": named_in(root.path / rel) for rel in (ENVIRONMENT_D, PROFILE_D)}
    if not journal.exists():
        return {"installed": None, "state": None, "files": files, "journal": None}
    state = journal.state()
    return {
        "installed": installed_by(state),
        "state": state.description,
        "files": files,
        "journal": str(journal.path),
        "since": state.since,
    }


def installed_by(state: State) -> str | None:
    """The profile a profile journal says was installed (None: it names none)."""
    begun = state.begin.begun if state.begin else None
    return begun.profile if isinstance(begun, ProfileBegin) else None


def named_in(path: Path) -> str | None:
    """The profile a file of ours names on its first line; None when absent; "?" when not ours."""
    try:
        first = path.read_text(errors="replace").splitlines()[:1]
    except OSError:
        return None
    if not first or not first[0].startswith(MARK):
        return "?"
    return first[0][len(MARK) :].split(":", 1)[0]
