"""Errors a user sees as one line, and every exit code the tool gives (README: the Errors paragraph)."""

from enum import IntEnum


class Exit(IntEnum):
    """The exit codes, in one place: an error class says its kind by one of these."""

    FAILED = 1  # an error of no kind below
    USAGE = 2  # bad input
    SOURCE = 3  # the kernel source lacks what a template needs
    HOST = 4  # the host lacks something (a tool, headers, a permission, the board)
    BUILD = 5  # a build, a VM verdict or a follow-up stage failed; no experiment cell passed
    JOURNAL = 6  # the journal is corrupted or unfinished
    BUSY = 7  # another run holds the lock
    REFUSED = 8  # install's gate said no
    GPU_LOST = 9  # `experiment` stopped: the GPU did not come back (it shared 6 with the journal before issue 41)
    INTERRUPTED = 130  # 128 + SIGINT: a signal stopped a passthrough run after giving the devices back


class KmgrError(Exception):
    """An error meant for the user: what is wrong, and what to do about it."""

    exit_code = Exit.FAILED

    def __init__(self, what: str, hint: str | None = None):
        super().__init__(what)
        self.what = what
        self.hint = hint

    def line(self) -> str:
        return f"{self.what}: {self.hint}" if self.hint else self.what


class UsageError(KmgrError):
    """Bad input on the command line (a malformed release, device id, path)."""

    exit_code = Exit.USAGE


class SourceError(KmgrError):
    """The kernel source lacks what a template needs, or is not the version asked for."""

    exit_code = Exit.SOURCE


class HostError(KmgrError):
    """The host lacks something needed (headers, a tool, a permission)."""

    exit_code = Exit.HOST


class BuildError(KmgrError):
    """A build or verification step failed."""

    exit_code = Exit.BUILD
