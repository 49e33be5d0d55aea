"""How the runner starts a program: through sh (sh 2.x, https://sh.readthedocs.io), behind subprocess.Popen's
face (pid, stdin/stdout/stderr, returncode, poll, wait, communicate), so that core/runner.py's stop, watchdog,
streams and sessions work on it as they did on Popen. Only core/runner.py uses it (tests/core/test_layout.py).

What sh carries: finding the program (on the PATH of the environment given, as Popen did) and exec'ing it with
the argument list as it is (`sh.Command(path)(*args)`: no shell, no splitting); `_new_session` (os.setsid), or
none for a program on the user's terminal; `_preexec_fn` (the parent death signal, core/keeper.py); `_env`,
`_cwd`; `_close_fds` (its default, True); `_bg=True` and `_bg_exc=False` (the runner waits itself); `_ok_code`
every exit, signals included (the runner judges exits); `_in`/`_out`/`_err` given file descriptors. sh forks
in the calling thread, which the parent death signal needs (it fires when the thread that started the child
ends).

What sh cannot carry, so it stays the runner's (sh's special kwargs page: docs/source/sections/
special_arguments.rst, https://sh.readthedocs.io/en/latest/sections/special_arguments.html):
- The pipes. sh's own (`_out`/`_err` callbacks, `_iter`, `_piped`) are read by sh's threads and stored
  ("How much of STDOUT/ERR your command will store internally", under `_internal_bufsize`): no byte stream a caller
  reads at its own pace (tar reading a .deb), and (sh's source, OProc._process_exit_cleanup, not its docs)
  sh stops reading 2 s after the program ends while a child still holds the pipe. The keeper must be handed
  the read ends while the program runs, and sh closes its own when it sees their end, after which the fd
  number may name another file. So the pipes are made here and given as descriptors ("_out: ... an int
  (representing a file descriptor, like the result of os.pipe)").
- Timeouts. "_timeout: ... it will be sent the signal defined by _timeout_signal", "the signal to be sent to
  the process": the process alone, not its group, no grace before SIGKILL, no sweep of the session.
- `_fg`, sh's way to a terminal: "side-steps a lot of sh's functionality. You will not be returned a process
  object and most (likely all) other special kwargs will not work". The runner's interactive program starts
  as sh's docs advise instead (`_in`/`_out`/`_err` this process's own), with neither session nor group of
  its own: sh 2.4 makes a group only with `_new_group` (its docs' note under `_new_session` says os.setpgrp;
  its source does not), and a program outside the terminal's foreground group stops at its first read.
- sh execs the path it found as the program's argv[0] (`/usr/sbin/dkms`, not `dkms`): a program sees its
  full path as $0.
"""

from __future__ import annotations

import errno
import io
import os
import re
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

import sh

_EVERY_EXIT = list(range(-64, 256))  # sh's _ok_code: the runner judges exits itself (a signal's is -N)


class Program:
    """A program started through sh, with subprocess.Popen's face (pid, stdin/stdout/stderr, returncode, poll,
    wait, communicate): stop, the watchdog and the streams work on it as they did on Popen."""

    def __init__(self, command, stdin: IO | None, stdout: IO | None, stderr: IO | None):
        self._command = command  # sh's RunningCommand
        self.pid: int = command.pid
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not self._command.is_alive():
            self.wait()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self._command.wait(timeout=timeout)
            except sh.TimeoutException:
                raise subprocess.TimeoutExpired(self._command.ran, timeout) from None
            self.returncode = self._command.exit_code
        return self.returncode

    def communicate(self, input: str | bytes | None = None) -> tuple:
        """Feed `input` and read stdout and stderr to their ends at once (neither pipe may fill and stall the
        program), then wait for it."""
        errors: list = []
        helpers = []
        if self.stderr is not None:
            helpers.append(threading.Thread(target=lambda: errors.append(self.stderr.read()), daemon=True))
        if self.stdin is not None:
            helpers.append(threading.Thread(target=self._feed, args=(input,), daemon=True))
        for helper in helpers:
            helper.start()
        out = self.stdout.read() if self.stdout is not None else None
        for helper in helpers:
            helper.join()
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()
        return out, errors[0] if errors else None

    def _feed(self, data: str | bytes | None) -> None:
        try:
            if data:
                self.stdin.write(data)
            self.stdin.close()
        except BrokenPipeError:
            pass


def start(
    argv: list[str],
    *,
    new_session: bool,
    preexec: Callable[[], None] | None = None,
    stdin=None,
    stdout=None,
    stderr=None,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    text: bool = False,
    errors: str | None = None,
) -> Program:
    """Start argv through sh with subprocess's stdin/stdout/stderr choices (PIPE, DEVNULL, STDOUT, a file, an
    fd). The pipes are the runner's own, handed to sh as file descriptors: sh's reader threads never see the
    output, so the keeper can be given the read ends while the program runs (sh closes its own when it sees
    their end, and an fd number sent after that could name another file). A program that cannot be started is
    an OSError, as from Popen."""
    try:
        program = sh.Command(argv[0], search_paths=os.get_exec_path(env))
    except sh.CommandNotFound:
        code = errno.EACCES if os.sep in argv[0] and os.path.exists(argv[0]) else errno.ENOENT
        raise OSError(code, os.strerror(code), argv[0]) from None
    opened: list[int] = []  # the child's ends, closed here once sh has started it
    ours: list[IO] = []

    def child_end(choice, reading: bool, inherited: int):
        if choice is None:
            return inherited  # Popen's None: the program shares this process's own
        if isinstance(choice, int) and choice >= 0:
            return choice
        if choice == subprocess.DEVNULL:
            fd = os.open(os.devnull, os.O_RDONLY if reading else os.O_WRONLY)
            opened.append(fd)
            return fd
        if choice == subprocess.PIPE:
            read_end, write_end = os.pipe()
            child, parent = (read_end, write_end) if reading else (write_end, read_end)
            opened.append(child)
            stream = open(parent, "wb" if reading else "rb")
            if text:
                stream = (
                    io.TextIOWrapper(stream, errors=errors, write_through=True)
                    if reading
                    else io.TextIOWrapper(stream, errors=errors)
                )
            ours.append(stream)
            return child
        return choice  # a file object: sh hands its fd to the program

    try:
        child_in = child_end(stdin, True, 0)
        parent_in = ours[-1] if stdin == subprocess.PIPE else None
        child_out = child_end(stdout, False, 1)
        parent_out = ours[-1] if stdout == subprocess.PIPE else None
        child_err = child_out if stderr == subprocess.STDOUT else child_end(stderr, False, 2)
        parent_err = ours[-1] if stderr == subprocess.PIPE else None
        command = program(
            *argv[1:],
            _in=child_in,
            _out=child_out,
            _err=child_err,
            _env=env,
            _cwd=str(cwd) if cwd is not None else None,
            _new_session=new_session,
            _preexec_fn=_child_setup(preexec),
            _bg=True,
            _bg_exc=False,
            _return_cmd=True,
            _ok_code=_EVERY_EXIT,
            _tty_out=False,
        )
    except sh.ForkException as err:
        for stream in ours:
            stream.close()
        # the child's exec failed; sh hands back its traceback, whose last line holds the errno
        found = re.search(r"\[Errno (\d+)\]", str(err))
        code = int(found.group(1)) if found else errno.ENOEXEC
        raise OSError(code, os.strerror(code), argv[0]) from None
    except BaseException:
        for stream in ours:
            stream.close()
        raise
    finally:
        for fd in opened:
            os.close(fd)
    return Program(command, parent_in, parent_out, parent_err)


def _child_setup(preexec: Callable[[], None] | None) -> Callable[[], None]:
    """Between fork and exec, the signals as Popen left them, then the caller's step. Popen's restore_signals
    reset SIGXFSZ (Python ignores it) as well as SIGPIPE (sh resets that one); and sh's `_bg=True` makes the
    child ignore SIGHUP, which its programs would inherit: SIGHUP goes back to what this process has (ignored
    under nohup, else the default)."""
    hangup = signal.SIG_IGN if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN else signal.SIG_DFL

    def setup() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, hangup)
        if preexec is not None:
            preexec()

    return setup
