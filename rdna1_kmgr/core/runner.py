"""The one place rdna1-kmgr runs external programs.

Argument lists only, never a shell string; every run has a time limit; the command line and what it printed
go to the log; a failure becomes one of the project's error kinds carrying the program's last stderr line.

- `run`: a program to its end (a one-shot `modinfo`, or a DKMS build whose lines feed live progress).
- `pipe_from` / `pipe_into`: a program streaming bytes to or from this process (a .deb's tarball into tar).
- `interactive`: a program that talks to the user on the terminal (mokutil asking for a password).
- `run_session`: a tree of processes (vng, virtme-run, qemu) with its output in a file, killed whole.

Every program but an interactive one starts through core/process_tree.py: in a session of its own, so a
timeout or Ctrl-C stops the whole tree (make's children, QEMU under vng), and tied to the tool's life, so it
dies with the tool even when that is SIGKILLed. The two are the runner: no other module starts programs.
"""

from __future__ import annotations

import logging
import os
import select
import shlex
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, AnyStr, Generic, Literal, overload

from rdna1_kmgr.core import process_tree, program_env
from rdna1_kmgr.core.errors import HostError, KmgrError
from rdna1_kmgr.core.owner import Owner
from rdna1_kmgr.core.program_path import located
from rdna1_kmgr.core.program_path import which as which  # callers name it runner.which

log = logging.getLogger("rdna1_kmgr.runner")

DEFAULT_TIMEOUT = 120.0
_POLL = 0.1
_LOGGED_OUTPUT = 4000  # characters of a run's output kept in the log


@dataclass(frozen=True)
class Result(Generic[AnyStr]):
    """What a program printed: `Result[str]` from a text run (the default), `Result[bytes]` from `text=False`."""

    argv: list[str]
    returncode: int
    stdout: AnyStr
    stderr: AnyStr

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def last_error_line(self) -> str:
        return last_line(self.stderr if self.stderr else self.stdout)


@overload
def run(
    argv: list[str],
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    check: bool = True,
    input: str | None = None,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    text: Literal[True] = True,
    on_line: Callable[[str], None] | None = None,
    on_tick: Callable[[], None] | None = None,
    merge_stderr: bool = False,
    error: type[KmgrError] = HostError,
    doing: str | None = None,
    hint: str | None = None,
    as_user: Owner | None = None,
) -> Result[str]: ...


@overload
def run(
    argv: list[str],
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    check: bool = True,
    input: bytes | None = None,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    text: Literal[False],
    on_line: Callable[[bytes], None] | None = None,
    on_tick: Callable[[], None] | None = None,
    merge_stderr: bool = False,
    error: type[KmgrError] = HostError,
    doing: str | None = None,
    hint: str | None = None,
    as_user: Owner | None = None,
) -> Result[bytes]: ...


def run(
    argv: list[str],
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    check: bool = True,
    input: Any = None,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    text: bool = True,
    on_line: Callable[[Any], None] | None = None,
    on_tick: Callable[[], None] | None = None,
    merge_stderr: bool = False,
    error: type[KmgrError] = HostError,
    doing: str | None = None,
    hint: str | None = None,
    as_user: Owner | None = None,
) -> Result[Any]:
    """Run argv to its end and return what it printed.

    `on_line` gets each line of its stdout (and stderr, with merge_stderr) as it comes, and `on_tick` is
    called twice a second while it runs: live progress for a long build. With `check`, a non-zero exit raises
    `error`: "<doing> failed (exit N): <last stderr line>".
    A program that is not there, or that runs past `timeout` seconds (killed with all its children), raises
    `error` whatever `check` says. `as_user`: run it as that user (core/process_tree.py)."""
    argv = [str(arg) for arg in argv]
    what = doing or Path(argv[0]).name
    log.info("run: %s", shlex.join(argv))
    started = time.monotonic()
    proc = _start(
        argv,
        what,
        error,
        hint,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        env=env,
        cwd=cwd,
        text=text,
        as_user=as_user,
        **({"errors": "replace"} if text else {}),
    )
    timer = _Watchdog(proc, timeout)
    ticker = _Ticker(proc, on_tick)
    try:
        if on_line is None:
            stdout, stderr = proc.communicate(input)
        else:
            stdout, stderr = _stream_lines(proc, input, on_line)
    except BaseException:
        process_tree.stop(proc)  # Ctrl-C or a failing callback: the whole tree goes
        raise
    finally:
        timer.cancel()  # a watchdog that fired is waited for: its stop ends only once the tree is gone
        ticker.join()
        process_tree.ended(proc.pid)
    empty: Any = "" if text else b""
    result: Result[Any] = Result(argv, proc.returncode, stdout or empty, stderr or empty)
    _log_result(result, time.monotonic() - started)
    if timer.fired:
        raise error(f"{what} did not finish within {timeout:.0f} s and was stopped", hint)
    if check and result.returncode != 0:
        raise error(f"{what} failed (exit {result.returncode}): {result.last_error_line()}", hint)
    return result


def interactive(
    argv: list[str], *, error: type[KmgrError] = HostError, doing: str | None = None, hint: str | None = None
) -> int:
    """Run a program on this terminal (it may ask the user something); its exit code.

    No time limit and no new session: the user is at the keyboard, and the program needs the terminal."""
    argv = [str(arg) for arg in argv]
    log.info("run (interactive): %s", shlex.join(argv))
    try:
        code = subprocess.run(located(argv, None), env=program_env.for_program()).returncode
    except OSError as err:
        raise error(f"{doing or argv[0]}: cannot run {argv[0]}: {err.strerror}", hint) from None
    log.info("exit %d: %s", code, argv[0])
    return code


@contextmanager
def pipe_from(
    argv: list[str], *, error: type[KmgrError] = HostError, doing: str | None = None, hint: str | None = None
) -> Iterator[IO[bytes]]:
    """A program's stdout as a binary stream; a failure of the program raises `error`.

    The reader may stop early (it found what it wanted): the program is then stopped, and that is no failure.
    When reading fails because the program failed (a truncated archive), the program's own message is the
    error, chained to the reader's."""
    argv = [str(arg) for arg in argv]
    what = doing or Path(argv[0]).name
    log.info("run (reading): %s", shlex.join(argv))
    with tempfile.TemporaryFile() as errors:
        proc = _start(argv, what, error, hint, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors)
        stdout = _piped(proc.stdout)
        try:
            yield stdout
        except BaseException as failure:
            try:
                code = proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                code = None
                process_tree.stop(proc)
            stdout.close()
            if code and not isinstance(failure, KeyboardInterrupt):
                raise error(f"{what} failed (exit {code}): {last_line(_read(errors))}", hint) from failure
            raise
        finished = stdout.read(1) == b""
        if not finished:
            process_tree.stop(proc)
        stdout.close()
        code = proc.wait()
        process_tree.ended(proc.pid)
        message = _read(errors)
    log.info("exit %s: %s%s", code, argv[0], f"\n{message[-_LOGGED_OUTPUT:]}" if message.strip() else "")
    if finished and code != 0:
        raise error(f"{what} failed (exit {code}): {last_line(message)}", hint)


class Sink:
    """What `pipe_into` yields: write bytes to the program; once the block ends, `result` says how it ended."""

    def __init__(self, stream: IO[bytes]):
        self._stream = stream
        self._broken = False
        self.result: Result[str] | None = None

    def write(self, data: bytes) -> int:
        # A reader that has gone (it failed) makes writes no-ops: its exit code and message say why.
        if not self._broken:
            try:
                self._stream.write(data)
            except BrokenPipeError:
                self._broken = True
        return len(data)


@contextmanager
def pipe_into(
    argv: list[str],
    *,
    check: bool = True,
    error: type[KmgrError] = HostError,
    doing: str | None = None,
    hint: str | None = None,
) -> Iterator[Sink]:
    """A program's stdin as a binary stream. After the block, with `check` a failure of the program raises
    `error`; without, the yielded Sink's `result` holds its exit code and stderr for the caller to judge."""
    argv = [str(arg) for arg in argv]
    what = doing or Path(argv[0]).name
    log.info("run (writing): %s", shlex.join(argv))
    with tempfile.TemporaryFile() as errors:
        proc = _start(argv, what, error, hint, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors)
        stdin = _piped(proc.stdin)
        sink = Sink(stdin)
        try:
            yield sink
            try:
                stdin.close()
            except BrokenPipeError:
                pass
        except BaseException:
            process_tree.stop(proc)
            raise
        code = proc.wait()
        process_tree.ended(proc.pid)
        message = _read(errors)
    log.info("exit %s: %s%s", code, argv[0], f"\n{message[-_LOGGED_OUTPUT:]}" if message.strip() else "")
    sink.result = Result(argv, code, "", message)
    if check and code != 0:
        raise error(f"{what} failed (exit {code}): {last_line(message)}", hint)


def last_line(text: str | bytes) -> str:
    """A program's most telling line: its last `E:`/`error`-looking line, else its last line of any kind."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("E:", "Error", "error", "ERROR")) or ": error" in line]
    return (errors or lines or ["no message"])[-1]


# --- sessions: a whole tree of processes with its output in a file (VMs) -----------------------------------


@dataclass(frozen=True)
class Outcome:
    returncode: int | None  # None when it was stopped
    timed_out: bool
    stopped_early: bool  # `watch` asked to stop
    elapsed: float
    session: int  # the session id the run had (its first process's pid)


def run_session(
    argv: list[str],
    output: Path,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    watch: Callable[[str], bool] | None = None,
    until: Callable[[], bool] | None = None,
    as_user: Owner | None = None,
) -> Outcome:
    """Run argv with stdout and stderr into `output`; kill its whole session after `timeout` seconds.

    `watch` gets every new chunk of output as it arrives; when it returns True the run is stopped there
    (a probe that has seen enough). `until` is asked every poll (a tenth of a second), output or not; True
    stops the run the same way (a deadline of the caller's that moves, a kernel log it reads). Ctrl-C stops
    the session too, then goes on up. `as_user`: the session runs as that user (core/process_tree.py).

    The output goes through a pipe that this process copies to `output`, not straight to the file:
    QEMU reopens /proc/self/fd/1 for its console with O_TRUNC, which would cut a file back to zero.
    """
    log.info("run (session, %.0f s, output in %s): %s", timeout, output, shlex.join(str(a) for a in argv))
    started = time.monotonic()
    # 0600 and never through a link planted at its name: logs are root's (issue 40)
    sink_fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(sink_fd, "wb") as sink:
        proc = process_tree.start(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            as_user=as_user,
        )
        pipe = _piped(proc.stdout)
        os.set_blocking(pipe.fileno(), False)

        def pump(wait: float) -> tuple[bool, bool]:
            """Copy what the pipe holds to the file: (got something, `watch` asks to stop)."""
            ready, _, _ = select.select([pipe], [], [], wait)
            data = pipe.read() if ready else None
            if not data:
                return False, False
            sink.write(data)
            sink.flush()
            return True, watch is not None and watch(data.decode(errors="replace"))

        def drain() -> None:
            while pump(0)[0]:
                pass

        def end(returncode, timed_out=False, stopped_early=False) -> Outcome:
            drain()
            pipe.close()
            outcome = Outcome(returncode, timed_out, stopped_early, time.monotonic() - started, proc.pid)
            log.info("session ended: %s", outcome)
            return outcome

        try:
            while True:
                code = proc.poll()
                _, enough = pump(_POLL)
                if enough or (until is not None and code is None and until()):
                    process_tree.stop(proc)
                    return end(None, stopped_early=True)
                if code is not None:
                    process_tree.sweep(proc.pid)  # a child may outlive its parent (and hold the pipe open)
                    process_tree.ended(proc.pid)
                    return end(code)
                if time.monotonic() - started >= timeout:
                    process_tree.stop(proc)
                    return end(None, timed_out=True)
        except BaseException:
            process_tree.stop(proc)
            pipe.close()
            raise


# --- internals ---------------------------------------------------------------------------------------------


def _start(argv: list[str], what: str, error: type[KmgrError], hint: str | None, **popen) -> subprocess.Popen:
    """Start argv in a session of its own (so stopping it stops its children); a missing program is `error`."""
    try:
        return process_tree.start(argv, **popen)
    except OSError as err:
        raise error(f"{what}: cannot run {argv[0]}: {err.strerror}", hint or f"install {Path(argv[0]).name}") from None


class _Watchdog:
    """Stops a process (and its session) once `timeout` seconds have passed; None never fires."""

    def __init__(self, proc: subprocess.Popen, timeout: float | None):
        self.fired = False
        self._timer = None
        if timeout is not None:
            self._timer = threading.Timer(timeout, self._fire, args=(proc,))
            self._timer.daemon = True
            self._timer.start()

    def _fire(self, proc: subprocess.Popen) -> None:
        self.fired = True
        process_tree.stop(proc)

    def cancel(self) -> None:
        """Disarm it; when it has fired, wait until its stop is over. The caller's pipes reach their end as the
        program's processes close them on their way out, before they are dead: returning then would report a
        timeout while a child is still running (the flaky test saw it in state R)."""
        if self._timer is not None:
            self._timer.cancel()
            if self.fired:
                self._timer.join()


class _Ticker:
    """Calls `tick` every half second until the process ends (a clock on the progress line)."""

    def __init__(self, proc: subprocess.Popen, tick: Callable[[], None] | None):
        self._thread = None
        if tick is not None:

            def loop() -> None:
                while proc.poll() is None:
                    tick()
                    time.sleep(0.5)

            self._thread = threading.Thread(target=loop, daemon=True)
            self._thread.start()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()


def _stream_lines(proc: subprocess.Popen, input, on_line: Callable[[str], None]) -> tuple:
    """Feed `input`, hand each stdout line to on_line as it arrives, collect stderr on the side."""
    stderr_chunks: list = []
    reader = None
    if proc.stderr is not None:
        stderr = proc.stderr
        reader = threading.Thread(target=lambda: stderr_chunks.append(stderr.read()), daemon=True)
        reader.start()
    if input is not None:
        stdin = _piped(proc.stdin)
        try:
            stdin.write(input)
            stdin.close()
        except BrokenPipeError:
            pass
    lines = []
    for line in _piped(proc.stdout):
        lines.append(line)
        on_line(line.rstrip("\n") if isinstance(line, str) else line.rstrip(b"\n"))
    proc.wait()
    if reader is not None:
        reader.join()
    joiner = "" if isinstance(lines[0] if lines else "", str) else b""
    return joiner.join(lines), stderr_chunks[0] if stderr_chunks else None


def _piped(stream: IO[AnyStr] | None) -> IO[AnyStr]:
    """A stream of a Popen started with it as PIPE (typeshed types every one of them optional)."""
    if stream is None:
        raise ValueError("the program's stream was not opened as a pipe")
    return stream


def _read(handle) -> str:
    handle.seek(0)
    return handle.read().decode(errors="replace")


def _log_result(result: Result[Any], elapsed: float) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    out = result.stdout.decode(errors="replace") if isinstance(result.stdout, bytes) else result.stdout
    err = result.stderr.decode(errors="replace") if isinstance(result.stderr, bytes) else result.stderr
    text = (out + err).strip()
    log.info(
        "exit %d after %.1f s: %s%s",
        result.returncode,
        elapsed,
        result.argv[0],
        f"\n{text[-_LOGGED_OUTPUT:]}" if text else "",
    )
