"""Where state lives. Each root can be moved with an environment variable (tests do)."""

import os
from pathlib import Path


def _root(env: str, default: str) -> Path:
    return Path(os.environ.get(env, default))


def state_dir() -> Path:
    return _root("RDNA1_KMGR_STATE", "/var/lib/rdna1-kmgr")


def cache_dir() -> Path:
    return _root("RDNA1_KMGR_CACHE", "/var/cache/rdna1-kmgr")


def log_dir() -> Path:
    return _root("RDNA1_KMGR_LOG", "/var/log/rdna1-kmgr")
