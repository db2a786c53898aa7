"""The server's end of a client's pipe: non-blocking, every wait bounded by a deadline.

Messages are framed as :class:`multiprocessing.connection.Connection` frames them (the client
reads with ``conn.recv``), so that a stopped or stuck client can hold the server no longer than
the deadline: a write or read that does not complete in time raises :class:`_Late`.
"""

from __future__ import annotations

import contextlib
import os
import select
import struct
import time
from multiprocessing.reduction import ForkingPickler
from typing import Optional


class _Late(Exception):
    """The deadline passed before a message was written or read whole."""


def _left(deadline: Optional[float]) -> Optional[float]:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _until(fd: int, event: int, deadline: Optional[float]) -> None:
    poller = select.poll()
    poller.register(fd, event)
    while True:
        left = _left(deadline)
        if left == 0.0:
            raise _Late
        if poller.poll(None if left is None else max(1, int(left * 1000) + 1)):
            return       # ready, hung up or in error: the next write or read tells which


def _frame(payload) -> tuple:
    """``payload`` with the header of multiprocessing.Connection, which the clients read."""
    n = len(payload)
    return (struct.pack("!i", n) if n <= 0x7fffffff else struct.pack("!iQ", -1, n)), payload


def _write(fd: int, parts, deadline: Optional[float]) -> None:
    for part in parts:
        view = memoryview(part).cast("B")
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                _until(fd, select.POLLOUT, deadline)


def _read(fd: int, n: int, deadline: Optional[float]) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        try:
            k = os.readv(fd, [view[got:]])
        except BlockingIOError:
            _until(fd, select.POLLIN, deadline)
            continue
        if k == 0:
            raise EOFError
        got += k
    return buf


def _recv(conn, deadline: Optional[float]):
    fd = conn.fileno()
    n, = struct.unpack("!i", _read(fd, 4, deadline))
    if n == -1:
        n, = struct.unpack("!Q", _read(fd, 8, deadline))
    return ForkingPickler.loads(_read(fd, n, deadline))


def _post(conn, obj) -> None:
    """Send ``obj`` if the pipe takes it now; never waits (the client may be stopped)."""
    with contextlib.suppress(OSError, ValueError, _Late):
        _write(conn.fileno(), _frame(ForkingPickler.dumps(obj)), time.monotonic())
