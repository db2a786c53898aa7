"""Transports carry one request to every client and bring the replies back, in client order.

* :class:`InProcessTransport`: clients in this process, run one after the other when the server
  asks for their reply.
* :class:`ProcessTransport`: each client in its own forked process; requests and replies cross
  a pipe. A client that does not answer within ``timeout`` seconds, or whose process dies, raises
  :class:`~ssca_solver.errors.ClientError` naming the client and the round; an exception raised
  in a client reaches the server as itself (or, when it cannot be pickled, as a ClientError with
  its type and traceback text). After any failure every client process is stopped (killed if
  it does not exit), and so at ``close`` and at interpreter exit: nothing is left behind.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import signal
import traceback
import weakref
from multiprocessing.connection import wait
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

def _picklable(exc: BaseException) -> Optional[BaseException]:
    """``exc`` if it survives a pickle round trip, else None."""
    try:
        back = pickle.loads(pickle.dumps(exc))
    except Exception:
        return None
    return back if type(back) is type(exc) else None


def _client_loop(conn, client: Client) -> None:
    # Ctrl-C goes to the whole process group: the server handles it and stops the clients
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            break
        if request is None:
            break
        request.w.flags.writeable = False      # as with InProcessTransport: w is read-only
        try:
            reply = ("ok", client.handle(request))
        except BaseException as exc:  # travels to the server and is raised there
            name = f"{type(exc).__module__}.{type(exc).__qualname__}"
            reply = ("error", (name, str(exc), traceback.format_exc(), _picklable(exc)))
        try:
            conn.send(reply)
        except Exception as exc:  # e.g. a reply that cannot be pickled
            conn.send(("error", (f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc),
                                 traceback.format_exc(), None)))
    conn.close()


def _stop(procs, conns, grace: float = 2.0) -> None:
    """Ask each process to exit, then terminate, then kill; join every one."""
    for conn in conns:
        with contextlib.suppress(OSError, ValueError):
            conn.send(None)
    for p in procs:
        p.join(timeout=grace)
    for p in procs:
        if p.is_alive():
            p.terminate()      # SIGTERM is not delivered to a stopped process: kill follows
            p.join(timeout=0.5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    for conn in conns:
        with contextlib.suppress(OSError):
            conn.close()


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
        :data:`DEFAULT_CLIENT_TIMEOUT`); None waits forever.

    Uses the ``fork`` start method (Linux, macOS), so user functions need not be picklable.
    """

    def __init__(self, clients: Sequence[Client], timeout: Optional[float] = DEFAULT_CLIENT_TIMEOUT):
        ctx = mp.get_context("fork")
        self.timeout = timeout
        self._conns, self._procs = [], []
        self.num_clients = len(clients)
        self._finalizer = weakref.finalize(self, _stop, self._procs, self._conns)
        for c in clients:
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_client_loop, args=(child, c), daemon=True,
                            name=f"ssca-client-{c.index}")
            p.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(p)
        self._broken = None

    @property
    def pids(self) -> list[int]:
        """The client processes' PIDs, in client order."""
        return [p.pid for p in self._procs]

    def _fail(self, i: int, request: Request, cause: str, tb: Optional[str] = None):
        err = ClientError(i, request.round if request.task != "evaluate" else "evaluation",
                          cause, tb)
        self._broken = str(err)
        self.close()
        return err

    def _dead(self, i: int) -> str:
        p = self._procs[i]
        p.join(timeout=0.1)
        code = p.exitcode
        if code is None:
            return "its connection closed"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"its process (pid {p.pid}) was killed by {signal.Signals(-code).name}"
        return f"its process (pid {p.pid}) exited with code {code}"

    def _receive(self, i: int, request: Request):
        conn, proc = self._conns[i], self._procs[i]
        ready = wait([conn, proc.sentinel], timeout=self.timeout)
        if not ready:
            raise self._fail(i, request, f"no answer within client_timeout={self.timeout:g} s "
                             f"(process pid {proc.pid} is "
                             f"{'alive' if proc.is_alive() else 'gone'})")
        if conn not in ready and not conn.poll(0):
            raise self._fail(i, request, "the client process died: " + self._dead(i))
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError) as exc:
            raise self._fail(i, request, "the client process died: " + self._dead(i)
                             + f" ({type(exc).__name__})") from None
        if kind == "ok":
            return payload
        name, text, tb, exc = payload
        if exc is not None:
            raise exc from _RemoteTraceback(f"raised in client {i}, round {request.round}:\n{tb}")
        raise self._fail(i, request, f"raised {name}: {text} (the exception could not be "
                         "sent back as itself)", tb)

    def _skip(self, j: int) -> None:
        conn, proc = self._conns[j], self._procs[j]
        with contextlib.suppress(EOFError, OSError):
            if wait([conn, proc.sentinel], timeout=self.timeout) and conn.poll(0):
                conn.recv()

    def stream(self, request):
        if self._broken is not None:
            raise RuntimeError(f"this transport was closed after a client failure: {self._broken}")
        if not self._procs:
            raise RuntimeError("this transport is closed")
        for i, conn in enumerate(self._conns):
            try:
                conn.send(request)
            except (OSError, ValueError) as exc:
                raise self._fail(i, request, "cannot send to the client: " + self._dead(i)
                                 + f" ({type(exc).__name__})") from None
        done = 0
        try:
            for i in range(len(self._conns)):
                done = i + 1        # reply i is read (or the transport is closed) past here
                yield self._receive(i, request)
        finally:
            # a reply left in a pipe would be read as the answer to the next request
            if self._procs and done < len(self._conns) and self._broken is None:
                for j in range(done, len(self._conns)):
                    self._skip(j)

    def close(self):
        if self._procs:
            _stop(self._procs, self._conns)
            self._procs.clear()
            self._conns.clear()
