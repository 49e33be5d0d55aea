"""Where state lives, and the check that root may write there.

Each root can be moved with an environment variable (tests do; core/tool_env.py reads it). Every root is
checked before its first use, moved or not (M4 of issue 40): an absolute path, no symbolic link on the way,
every existing folder on the way owned by root (or by the user running the tool, when that is not root: it can
only harm itself) and not writable by group or others, a sticky root-owned folder above it (/tmp) excepted:
core/trust.py's check_root, the same as for the commands root runs. A folder that does not exist yet is made
by the tool, root's, under a checked parent.

State and log roots are private: make_dirs creates them and every folder under them 0700 (journals, backups,
plans and logs are root's alone); the cache stays 0755 (apt's sandbox user writes below it).
"""

from pathlib import Path

from rdna1_kmgr.core import tool_env


def state_dir() -> Path:
    return tool_env.moved_root(tool_env.STATE, "/var/lib/rdna1-kmgr", check_default=True)


def cache_dir() -> Path:
    return tool_env.moved_root(tool_env.CACHE, "/var/cache/rdna1-kmgr", check_default=True)


def log_dir() -> Path:
    return tool_env.moved_root(tool_env.LOG, "/var/log/rdna1-kmgr", check_default=True)


def private_roots() -> list[Path]:
    """The roots whose folders are root's alone (0700)."""
    return [state_dir(), log_dir()]
