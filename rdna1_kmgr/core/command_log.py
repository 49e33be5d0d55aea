"""The log of what a command ran: every external program's command line, exit and output (core.runner logs
them), appended to log_dir()/commands.log with the command that caused them.

Written only where that folder already exists and is writable (install.sh makes it 0700, root owns it),
0600 and never through a link: a user
running `install --dry-run` or a bad command line leaves no trace on the system.
"""

import logging
import os
import sys

from rdna1_kmgr.core.files import open_private_log
from rdna1_kmgr.core.paths import log_dir

_FORMAT = "%(asctime)s %(process)d %(levelname)s %(message)s"


def start() -> None:
    """Attach the file to the `rdna1_kmgr` loggers, once, and note the command line."""
    folder = log_dir()
    logger = logging.getLogger("rdna1_kmgr")
    if logger.handlers or not folder.is_dir() or not os.access(folder, os.W_OK):
        return
    try:
        handler = logging.StreamHandler(open_private_log(folder / "commands.log"))
    except OSError:
        return  # a link planted at its name, or a file another user made there: no log rather than through it
    handler.setFormatter(logging.Formatter(_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    # sys.argv is the command line when run as rdna1-kmgr, not when a program calls the CLI in-process
    run_as_command = os.path.basename(sys.argv[0]) == "rdna1-kmgr"
    logger.info("command: %s", " ".join(["rdna1-kmgr", *sys.argv[1:]]) if run_as_command else "rdna1-kmgr (in-process)")
