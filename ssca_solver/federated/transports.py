"""Transports carry one request to every client and bring the replies back, in client order.

* :class:`InProcessTransport`: clients in this process, run one after the other when the server
  asks for their reply.
* :class:`ProcessTransport`: each client in its own forked process; requests and replies cross
  a pipe. A client that does not answer within ``timeout`` seconds, or whose process dies, raises
  :class:`~ssca_solver.errors.ClientError` naming the client and the round; an exception raised
  in a client reaches the server as itself (or, when it cannot be pickled, as a ClientError with
  its type and traceback text). No read or write of a pipe waits longer than ``timeout``. After
  any failure every client process is stopped (killed if it does not exit), and so at ``close``,
  when the transport is garbage-collected and at interpreter exit: nothing is left behind. The
  clients hold no copy of the server's ends of the pipes, so when the server process dies they
  read end-of-file and exit.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import multiprocessing.util  # noqa: F401  (registers its exit hook before ours: see _stop_all)
import os
import pickle
import select
import signal
import struct
import time
import traceback
import weakref
from multiprocessing.connection import wait
from multiprocessing.reduction import ForkingPickler
from typing import Iterator, Optional, Sequence

from ..errors import ClientError
from .client import Client
from .messages import Reply, Request

#: Default seconds a client process may take to answer one request (option ``client_timeout``).
DEFAULT_CLIENT_TIMEOUT = 600.0


class Transport:
    """Carries a request to every client; ``stream`` yields replies one by one in client order.

    ``exchange`` is ``list(stream(request))``. The server's round consumes ``stream``, adding
    replies to its statistics as they come, so it never holds more than a bounded number.
    """

    num_clients: int = 0

    def stream(self, request: Request) -> Iterator[Reply]:
        raise NotImplementedError

    def exchange(self, request: Request) -> list[Reply]:
        return list(self.stream(request))

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class InProcessTransport(Transport):
    """Clients in this process, handed one read-only copy of each request's w.

    The copy is made once per request and shared: no client can alias the server's arrays or
    change what the next client receives. ``stream`` runs client i only when the server asks for
    reply i. A client here cannot be interrupted, so ``timeout`` does not apply (use
    ``transport="process"`` for that).
    """

    def __init__(self, clients: Sequence[Client]):
        self._clients = tuple(clients)
        self.num_clients = len(self._clients)

    def stream(self, request):
        request = request.read_only()
        for c in self._clients:
            yield c.handle(request)


# -- forked clients ---------------------------------------------------------------------------

class _Pool:
    """The client processes of one ProcessTransport and the server's ends of their pipes."""

    def __init__(self):
        self.procs: list = []
        self.conns: list = []


#: Every pool whose processes are not stopped yet (stopped by :func:`_stop_all` at exit).
_POOLS: set = set()


def _stop_all() -> None:
    for pool in list(_POOLS):
        _stop(pool)


# atexit calls the last registered first: this runs before multiprocessing's own exit hook
# (registered when multiprocessing.util was imported, above), which SIGTERMs every daemon child
# and then joins it without a timeout, forever for a stopped (SIGSTOP) one.
atexit.register(_stop_all)


def _forget_pools() -> None:
    """In a forked child: close the inherited server ends of every pipe.

    A client then holds no copy of its own pipe's server end nor of the others', so the server's
    death (or exit) reaches every client as end-of-file; and the child never stops processes
    that are not its own.
    """
    for pool in list(_POOLS):
        for conn in pool.conns:
            with contextlib.suppress(OSError):
                conn.close()
        pool.conns.clear()      # and a transport collected here stops nothing: not its children
        pool.procs.clear()
    _POOLS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def _picklable(exc: BaseException) -> Optional[BaseException]:
    """``exc`` if it survives a pickle round trip, else None."""
    try:
        back = pickle.loads(pickle.dumps(exc))
    except Exception:
        return None
    return back if type(back) is type(exc) else None


def _describe(exc: BaseException) -> tuple:
    """(qualified type name, message, traceback text, the exception if it can be pickled)."""
    name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    try:
        text = str(exc)
    except Exception:
        text = f"<str() of the {type(exc).__name__} failed>"
    return name, text, traceback.format_exc(), _picklable(exc)


def _client_loop(conn, client: Client) -> None:
    # Ctrl-C goes to the whole process group: the server handles it and stops the clients
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _forget_pools()                 # done at fork already; again in case fork hooks did not run
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):  # the server closed its end, or died
            break
        if request is None:
            break
        request.w.flags.writeable = False      # as with InProcessTransport: w is read-only
        try:
            reply = ("ok", client.handle(request))
        except BaseException as exc:  # travels to the server and is raised there
            reply = ("error", _describe(exc))
        try:
            conn.send(reply)
        except OSError:               # the server is gone
            break
        except Exception as exc:      # e.g. a reply that cannot be pickled
            try:
                conn.send(("error", _describe(exc)))
            except OSError:
                break
    conn.close()


# the server's side of a pipe: non-blocking, every wait bounded by a deadline

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


def _process_state(p) -> str:
    if not p.is_alive():
        return "gone"
    with contextlib.suppress(OSError, IndexError):
        with open(f"/proc/{p.pid}/status") as f:
            for line in f:
                if line.startswith("State:") and line.split()[1] == "T":
                    return "alive but stopped"
    return "alive"


def _stop(pool: _Pool, grace: float = 2.0) -> None:
    """Ask each process to exit, then terminate, then kill; join every one."""
    procs, conns = pool.procs, pool.conns
    for conn in conns:
        _post(conn, None)
    for p in procs:
        if _process_state(p) == "alive but stopped":     # it cannot exit: no grace
            p.kill()
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(timeout=_left(deadline))
    late = [p for p in procs if p.is_alive()]
    for p in late:
        p.terminate()
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGCONT)   # a stopped process acts on SIGTERM once continued
    deadline = time.monotonic() + 0.5
    for p in late:
        p.join(timeout=_left(deadline))
    for p in late:
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    for conn in conns:
        with contextlib.suppress(OSError):
            conn.close()
    procs.clear()
    conns.clear()
    _POOLS.discard(pool)


class _RemoteTraceback(Exception):
    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text


class ProcessTransport(Transport):
    """Each client in its own forked process; requests and replies cross a pipe, pickled.

    Args:
      clients: the clients (forked with their rows; the server process only reads replies).
      timeout: seconds each client may take to answer a request (default
        :data:`DEFAULT_CLIENT_TIMEOUT`); None waits forever. It bounds sending the request and
        reading the reply as well.

    Uses the ``fork`` start method (Linux, macOS), so user functions need not be picklable.
    """

    def __init__(self, clients: Sequence[Client], timeout: Optional[float] = DEFAULT_CLIENT_TIMEOUT):
        ctx = mp.get_context("fork")
        self.timeout = timeout
        self.num_clients = len(clients)
        self._broken = None
        self._pool = pool = _Pool()
        self._conns, self._procs = pool.conns, pool.procs
        _POOLS.add(pool)
        self._finalizer = weakref.finalize(self, _stop, pool)
        self._finalizer.atexit = False         # _stop_all does it, before multiprocessing's hook
        try:
            for c in clients:
                parent, child = ctx.Pipe()
                pool.conns.append(parent)      # in the pool before the fork: the child closes it
                p = ctx.Process(target=_client_loop, args=(child, c), daemon=True,
                                name=f"ssca-client-{c.index}")
                p.start()
                child.close()
                os.set_blocking(parent.fileno(), False)
                pool.procs.append(p)
        except BaseException:
            _stop(pool)
            raise

    @property
    def pids(self) -> list[int]:
        """The client processes' PIDs, in client order."""
        return [p.pid for p in self._procs]

    def _deadline(self) -> Optional[float]:
        return None if self.timeout is None else time.monotonic() + self.timeout

    @staticmethod
    def _where(request: Request):
        return request.round if request.task != "evaluate" else "evaluation"

    def _fail(self, i: int, request: Request, cause: str, tb: Optional[str] = None,
              kill: bool = False):
        err = ClientError(i, self._where(request), cause, tb)
        self._broken = f"after a client failure: {err}"
        if kill:                              # it does not answer: no grace
            with contextlib.suppress(Exception):
                self._procs[i].kill()
        self.close()
        return err

    def _dead(self, i: int) -> str:
        p = self._procs[i]
        p.join(timeout=1.0)
        code = p.exitcode
        if code is None:
            return "its connection closed"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"its process (pid {p.pid}) was killed by {signal.Signals(-code).name}"
        return f"its process (pid {p.pid}) exited with code {code}"

    def _late(self, i: int, what: str) -> str:
        p = self._procs[i]
        return (f"{what} within client_timeout={self.timeout:g} s (process pid {p.pid} is "
                f"{_process_state(p)})")

    def _receive(self, i: int, request: Request):
        """("ok", reply) or ("error", description) from client i; ClientError (the transport is
        closed) when it does not answer in time or its process died."""
        conn, proc = self._conns[i], self._procs[i]
        deadline = self._deadline()
        ready = wait([conn, proc.sentinel], timeout=_left(deadline))
        if not ready:
            raise self._fail(i, request, self._late(i, "no answer"), kill=True)
        if conn not in ready and not conn.poll(0):
            raise self._fail(i, request, "the client process died: " + self._dead(i))
        try:
            return _recv(conn, deadline)
        except _Late:
            raise self._fail(i, request, self._late(i, "its answer did not arrive whole"),
                             kill=True) from None
        except (EOFError, OSError) as exc:
            raise self._fail(i, request, "the client process died: " + self._dead(i)
                             + f" ({type(exc).__name__})") from None
        except Exception as exc:
            raise self._fail(i, request, f"its answer could not be read ({type(exc).__name__}: "
                             f"{exc})") from None

    def _abandon(self, i: int, request: Request, why: Optional[BaseException]) -> None:
        """Close the transport: client i's reply, unread, must never answer a later request."""
        where = self._where(request)
        where = f"round {where}" if where != "evaluation" else "the full-data evaluation"
        self._broken = (f"when a stream ended on {type(why).__name__} with client {i}'s answer "
                        f"to {where} unread")
        self.close()

    def _drain(self, start: int, request: Request) -> None:
        """Read and drop the replies of clients start, start + 1, ... (each within timeout)."""
        for j in range(start, len(self._conns)):
            try:
                self._receive(j, request)
            except ClientError:          # the transport is closed now, and says why
                return
            except BaseException as exc:
                self._abandon(j, request, exc)
                raise

    def stream(self, request):
        if self._broken is not None:
            raise RuntimeError(f"this transport was closed {self._broken}")
        if not self._procs:
            raise RuntimeError("this transport is closed")
        message = _frame(ForkingPickler.dumps(request))     # pickled once for every client
        for i, conn in enumerate(self._conns):
            try:
                _write(conn.fileno(), message, self._deadline())
            except _Late:
                raise self._fail(i, request, self._late(i, "the request could not be sent"),
                                 kill=True) from None
            except (OSError, ValueError) as exc:
                raise self._fail(i, request, "cannot send to the client: " + self._dead(i)
                                 + f" ({type(exc).__name__})") from None
            except BaseException as exc:     # e.g. Ctrl-C: the request may be half written
                self._abandon(i, request, exc)
                raise
        n = len(self._conns)
        read = 0            # replies read so far
        clean = False       # whether the replies not read yet may be drained (else: close)
        why = None
        try:
            for i in range(n):
                kind, payload = self._receive(i, request)
                read, clean = i + 1, True
                if kind == "error":
                    name, text, tb, exc = payload
                    if exc is None:
                        raise self._fail(i, request, f"raised {name}: {text} (the exception "
                                         "could not be sent back as itself)", tb)
                    raise exc from _RemoteTraceback(
                        f"raised in client {i}, round {request.round}:\n{tb}")
                yield payload         # the consumer may leave here (GeneratorExit): drain
                clean = False
        except BaseException as exc:
            why = exc
            raise
        finally:
            # a reply left in a pipe would be read as the answer to the next request
            if read < n and self._procs and self._broken is None:
                if clean:
                    self._drain(read, request)
                else:             # e.g. Ctrl-C while waiting for reply `read`
                    self._abandon(read, request, why)

    def close(self):
        if self._pool.procs or self._pool.conns:
            _stop(self._pool)
