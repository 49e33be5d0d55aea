"""Errors a user sees as one line, and the exit code that says which kind they are."""


class KmgrError(Exception):
    """An error meant for the user: what is wrong, and what to do about it."""

    exit_code = 1

    def __init__(self, what: str, hint: str | None = None):
        super().__init__(what)
        self.what = what
        self.hint = hint

    def line(self) -> str:
        return f"{self.what}: {self.hint}" if self.hint else self.what


class UsageError(KmgrError):
    """Bad input on the command line (a malformed release, device id, path)."""

    exit_code = 2


class SourceError(KmgrError):
    """The kernel source lacks what a template needs, or is not the version asked for."""

    exit_code = 3


class HostError(KmgrError):
    """The host lacks something needed (headers, a tool, a permission)."""

    exit_code = 4


class BuildError(KmgrError):
    """A build or verification step failed."""

    exit_code = 5
