"""The environment of every program the tool starts: an allow-list, as sudo's env_reset keeps one (issue 49).

`su` without `-` hands root the caller's whole environment and `sudo -E` all but a short list, so root's own
environment is not root's to trust. A program root starts gets only:

- PATH (root's folders only: core/program_path.py trims it at start), the locale (LANG, LANGUAGE, LC_*), TERM,
  TZ and the terminal's size, and HOME of the user the tool runs as (/root under root);
- the tool's own marker of a passthrough run (vm/vfio_journal.RUN_ENV), which it sets itself;
- what the caller names for that one program (`extra`: DEBIAN_FRONTEND for apt, ccache's and the signing
  variables for a DKMS build, vng's PATH).

Nothing else passes: not OPENSSL_CONF (openssl would load the caller's provider), APT_CONFIG, MODPROBE_OPTIONS,
BASH_ENV (dkms is a bash script), PYTHONPATH, LD_PRELOAD, nor a token in root's shell.

The owner's Python gets the owner's environment, never root's (docs/security.md): started through sudo, what
sudo kept (that is the owner's) less what names root; from a root login, the same allow-list. Then the owner's
HOME, USER, LOGNAME and PATH (core/process_tree.py), and what the experiment sets for the cell.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping

from rdna1_kmgr.core import tool_env

KEPT = frozenset({"PATH", "LANG", "LANGUAGE", "TERM", "TZ", "COLUMNS", "LINES", "NO_COLOR", "RDNA1_KMGR_VFIO_RUN"})
KEPT_PREFIXES = ("LC_",)
# What the owner's PyTorch reads of its environment besides those: its venv and what it loads beside it, and the
# ROCm and PyTorch stacks' own settings. It runs as the owner: none of it reaches root's programs.
OWNER_NAMES = frozenset({"HOME", "USER", "LOGNAME", "VIRTUAL_ENV", "PYTHONPATH", "CUDA_VISIBLE_DEVICES"})
OWNER_PREFIXES = ("HSA_", "ROCM_", "ROCR_", "MIOPEN_", "HIP_", "PYTORCH_", "TORCH_", "AMD_", "GPU_")
# What sudo adds that names root or sudo itself, never the owner's
ROOTS_ADDITIONS = frozenset({"MAIL", "SHELL", "HOME", "USER", "LOGNAME", "USERNAME", "PATH"})


def allowed(environ: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed variables of `environ`."""
    return {k: v for k, v in environ.items() if k in KEPT or k.startswith(KEPT_PREFIXES)}


def for_program(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A program's environment under the tool: the allow-list of this process's, HOME of the user the tool runs
    as, and `extra`."""
    env = allowed(os.environ)
    if tool_env.test_run():  # the tests' apt configuration and stand-ins, in a test run root set up only
        env.update(
            {k: v for k, v in os.environ.items() if k in tool_env.TEST_PASSED or k.startswith(tool_env.TEST_PREFIX)}
        )
    try:
        env["HOME"] = pwd.getpwuid(os.geteuid()).pw_dir
    except KeyError:
        env.pop("HOME", None)
    env.update(extra or {})
    return env


def owners_stack(environ: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed variables of `environ` and the owner's PyTorch and ROCm settings in it."""
    stack = {k: v for k, v in environ.items() if k in OWNER_NAMES or k.startswith(OWNER_PREFIXES)}
    return {**allowed(environ), **stack}


def for_owner(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The owner's program's environment before their identity is added: through sudo, what sudo kept for them
    (less what names root and sudo's own SUDO_*); from a root login, the allow-list and the stacks' settings
    (`owners_stack`), never a token of root's shell; then `extra`."""
    if "SUDO_UID" in os.environ:
        env = {k: v for k, v in os.environ.items() if k not in ROOTS_ADDITIONS and not k.startswith("SUDO_")}
    else:
        env = owners_stack(os.environ)
    env.update(extra or {})
    return env
