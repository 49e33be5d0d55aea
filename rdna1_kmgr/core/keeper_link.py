"""This process's line to the keeper (core/keeper.py): started on the runner's first program (and again when
it was killed), told of each program's session and its pipes, so it can stop them when the tool dies. The
runner starts the keeper (core/process_tree.py: only the runner starts programs) through the `start` it passes
here."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("rdna1_kmgr.runner")

_keeper_lock = threading.Lock()
_keeper: Any = None  # the keeper's Popen
_keeper_channel: socket.socket | None = None
_live: dict[int, int] = {}  # session -> start time: this process's programs whose sessions still run


# Starts the keeper with its end of the channel as its stdin; gives back its Popen.
Start = Callable[[int], Any]


def ensure(start: Start) -> None:
    """A keeper is running (started now when there was none)."""
    with _keeper_lock:
        _keeper_alive(start)


def listed(session: int) -> bool:
    """The session is one the keeper was told of and not yet told is over."""
    return session in _live


def track(start: Start, session: int, started: int | None, outputs: Sequence[int] = ()) -> None:
    """List a session with the keeper (started: its start time; outputs: the read ends of its pipes, which
    the keeper reads once the tool is gone) or take it off (None)."""
    global _keeper
    with _keeper_lock:
        if started is None:
            _live.pop(session, None)
        else:
            _live[session] = started
        messages = [(f"+ {session} {started}" if started is not None else f"- {session}", list(outputs))]
        for _ in (1, 2):
            if _keeper_alive(start):  # a new keeper gets the whole list
                messages = [(f"+ {s} {t}", list(outputs) if s == session else []) for s, t in _live.items()]
            if _keeper is None or _keeper_channel is None:  # no keeper could be started
                return
            try:
                for text, fds in messages:
                    socket.send_fds(_keeper_channel, [text.encode()], fds)
                return
            except OSError:  # it was killed since
                _keeper = None


def _keeper_alive(start: Start) -> bool:
    """Start the keeper when there is none (first program, or it was killed; the caller holds the lock): True
    when this call started it."""
    global _keeper, _keeper_channel
    if _keeper is not None and _keeper.poll() is None:
        return False
    # Message boundaries (one per program, its pipes' fds with it), and the end seen when the tool's end closes.
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        with ours, theirs:
            _keeper = start(theirs.fileno())
            _keeper_channel = ours.dup()
        return True
    except OSError as err:
        _keeper = None
        log.warning("cannot start the keeper (%s): programs may outlive a killed rdna1-kmgr", err)
        return False
