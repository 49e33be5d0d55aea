"""Progress for long work: a live line on a terminal, a few plain lines in a pipe or a log.

The one road for what the tool tells while it works: `say` and `Progress` write to the stream of the innermost
`reporting_to` (stderr outside any), so that a caller who keeps a story -- `follow`'s log, which also goes to
apt's output -- gets every line, the downloads' and the VM test's included, without each stage taking a stream.

Compilation progress is counted from kbuild's own output: every object it compiles prints a line
`  CC [M]  <path>.o` (or `  CC      <path>.o` for built-in objects), so feeding the build log
line by line to `Progress.feed` is enough to follow any kbuild run, DKMS's included.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Protocol

# kbuild's quiet-mode line for one compiled C or assembler object.
_COMPILED = re.compile(r"^\s+(?:CC|AS)(?: \[M\])?\s+\S+\.o$")
# Object names in kbuild Makefiles: `foo.o`, `bar/baz.o`.
_MAKEFILE_OBJECT = re.compile(r"([A-Za-z0-9_\-]+)\.o\b")


class Stream(Protocol):
    """Where progress lines go: a terminal, a pipe, or a writer of the caller's (the follow's story)."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...

    def isatty(self) -> bool: ...


_STREAM: ContextVar[Stream | None] = ContextVar("rdna1_kmgr_progress_stream", default=None)


def current_stream() -> Stream:
    """Where progress goes now: the innermost reporting_to's stream, or stderr."""
    return _STREAM.get() or sys.stderr


@contextmanager
def reporting_to(stream: Stream) -> Iterator[Stream]:
    """Send every line of progress said inside (this thread's) to `stream`."""
    token = _STREAM.set(stream)
    try:
        yield stream
    finally:
        _STREAM.reset(token)


def say(line: str) -> None:
    """One line of progress, whole."""
    stream = current_stream()
    stream.write(line + "\n")
    stream.flush()


def is_compiled_object(line: str) -> bool:
    """True for kbuild's line announcing that it compiles one object (the `.mod.o` stub counts too)."""
    return bool(_COMPILED.match(line.rstrip("\n")))


def count_sources(tree: Path) -> int:
    """How many objects a full kbuild run of `tree` compiles, estimated from the tree itself.

    A C or assembler file counts when some Makefile of the tree names its object (`name.o`); files
    left out of every Makefile (tools, unused generations of a block) do not. Config-dependent
    objects still count, so this is an upper bound, close enough for a progress total: for
    drivers/gpu/drm/amd it gives 698 against the 696 objects kbuild compiles for 6.1, 869 against
    864 for 6.12.
    """
    named: set[str] = set()
    for makefile in tree.rglob("Makefile"):
        try:
            named.update(_MAKEFILE_OBJECT.findall(makefile.read_text(errors="replace")))
        except OSError:
            continue
    total = 0
    for pattern in ("*.c", "*.S"):
        total += sum(1 for src in tree.rglob(pattern) if src.stem in named)
    return total


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


class Progress:
    """Reports `done of total` and the elapsed time for one long step.

    On a terminal it redraws one line at most a few times a second; anywhere else it writes a plain
    line at the start, at each quarter of the total (or every `plain_interval` seconds when the
    total is unknown) and at the end, so a CI log stays short.
    """

    def __init__(
        self,
        label: str,
        total: int | None = None,
        unit: str = "objects",
        stream: Stream | None = None,
        live: bool | None = None,
        plain_interval: float = 60.0,
        clock=time.monotonic,
    ):
        self.label = label
        self.total = total
        self.unit = unit
        self.stream = stream if stream is not None else current_stream()
        self.live = self.stream.isatty() if live is None else live
        self.plain_interval = plain_interval
        self._clock = clock
        self.started = clock()
        self.done = 0
        self._last_draw = float("-inf")
        self._next_quarter = 1
        self._last_plain = self.started
        self._finished = False
        # A build feeds lines from a log-following thread while the main thread ticks the clock.
        self._lock = threading.Lock()
        if not self.live:
            self._plain(f"{label}: started" + (f", {total} {unit} to go" if total else ""))

    @property
    def elapsed(self) -> float:
        return self._clock() - self.started

    def feed(self, line: str) -> None:
        """Count one line of kbuild output."""
        if is_compiled_object(line):
            self.advance()

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            self._report()

    def tick(self) -> None:
        """Redraw the elapsed time even when nothing was counted (call it now and then)."""
        with self._lock:
            self._report()

    def finish(self, outcome: str = "done") -> None:
        """The last line; "done" shows N/N, whatever the estimated total was."""
        with self._lock:
            self._finish(outcome)

    def _finish(self, outcome: str) -> None:
        if self._finished:
            return
        self._finished = True
        if outcome == "done" and self.total:
            # The total was an estimate from the tree (an upper bound); done, the count is what it was.
            self.total = self.done
        text = f"{self.label}: {outcome}, {self._count()} in {_clock(self.elapsed)}"
        if self.live:
            self.stream.write("\r\033[K" + text + "\n")
            self.stream.flush()
        else:
            self._plain(text)

    def _count(self) -> str:
        if self.total:
            # The total is an estimate from the tree; never show more done than the total.
            return f"{self.done}/{max(self.total, self.done)} {self.unit}"
        return f"{self.done} {self.unit}"

    def _report(self) -> None:
        if self._finished:
            return
        now = self._clock()
        if self.live:
            if now - self._last_draw >= 0.2:
                self._last_draw = now
                self.stream.write(f"\r\033[K{self.label}: {self._count()}, {_clock(now - self.started)}")
                self.stream.flush()
            return
        if self.total:
            crossed = False
            while self._next_quarter < 4 and self.done >= self.total * self._next_quarter / 4:
                self._next_quarter += 1
                crossed = True
            if crossed:
                self._plain(f"{self.label}: {self._count()}, {_clock(now - self.started)}")
        elif now - self._last_plain >= self.plain_interval:
            self._last_plain = now
            self._plain(f"{self.label}: {self._count()}, {_clock(now - self.started)}")

    def _plain(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


_MB = 1 << 20


class ByteProgress:
    """Progress counted in bytes, shown in MB."""

    def __init__(self, label: str, total: int | None):
        self._bytes = 0
        self._progress = Progress(label, total=-(-total // _MB) if total else None, unit="MB")

    def advance(self, n: int) -> None:
        before = self._bytes // _MB
        self._bytes += n
        if self._bytes // _MB > before:
            self._progress.advance(self._bytes // _MB - before)

    def finish(self, outcome: str = "done") -> None:
        if outcome == "done":  # count the last partial MB, so a whole job reads N/N
            self._progress.advance(-(-self._bytes // _MB) - self._bytes // _MB)
        self._progress.finish(outcome)
