"""The log of what a command ran: every external program's command line, exit and output (core.runner logs
them), appended to log_dir()/commands.log with the command that caused them.

Written only where that folder already exists and is writable (install.sh makes it, root owns it): a user
running `install --dry-run` or a bad command line leaves no trace on the system.
"""

import logging
import os
import sys

from rdna1_kmgr.core.paths import log_dir

_FORMAT = "%(asctime)s %(process)d %(levelname)s %(message)s"


def start() -> None:
    """Attach the file to the `rdna1_kmgr` loggers, once, and note the command line."""
    folder = log_dir()
    logger = logging.getLogger("rdna1_kmgr")
    if logger.handlers or not folder.is_dir() or not os.access(folder, os.W_OK):
        return
    handler = logging.FileHandler(folder / "commands.log")
    handler.setFormatter(logging.Formatter(_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.info("command: %s", " ".join(["rdna1-kmgr", *sys.argv[1:]]))
