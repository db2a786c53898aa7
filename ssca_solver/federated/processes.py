"""The process transport: each client in its own forked process, requests and replies through
a pipe.

A client that does not answer within ``timeout`` seconds (:class:`~.timeouts.ClientTimeout`: a
number is honoured exactly; the default "auto" follows the measured answer times), or whose
process dies, raises :class:`~ssca_solver.errors.ClientError` naming the client and the round;
an exception raised in a client reaches the server as itself (or, when it cannot be pickled, as
a ClientError with its type and traceback text). No read or write of a pipe waits longer than
``timeout`` (:mod:`.pipes`). After any failure every client process is stopped (killed if it
does not exit), and so at ``close``, when the transport is garbage-collected and at interpreter
exit: nothing is left behind (:mod:`.pool`). The clients hold no copy of the server's ends of
the pipes, so when the server process dies they read end-of-file and exit. Each client process
limits its own BLAS, OpenMP and Numba thread pools (``client_threads``, :mod:`.threads`), so
that N clients do not start N times as many threads as there are cores.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import time
import weakref
from multiprocessing.connection import wait
from multiprocessing.reduction import ForkingPickler
from typing import Optional, Sequence

from ..errors import ClientError
from .client import Client
from .descriptors import _check_descriptors, _fork_errors
from .messages import Dropout, Request
from .pipes import _frame, _Late, _left, _recv, _write
from .pool import _POOLS, _client_loop, _cpu_seconds, _Pool, _process_state, _stop
from .threads import DEFAULT_CLIENT_THREADS, client_thread_count
from .timeouts import AUTO_COMPUTING, AUTO_STEP, DEFAULT_CLIENT_TIMEOUT
from .transport import TimedTransport, participant_order


class _RemoteTraceback(Exception):
    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text


class ProcessTransport(TimedTransport):
    """Each client in its own forked process; requests and replies cross a pipe, pickled.

    Args:
      clients: the clients (forked with their rows; the server process only reads replies).
      timeout: seconds each client may take to answer a request (honoured exactly), None
        (wait forever) or "auto" (the default: chosen from the answer times measured,
        :class:`ClientTimeout`). It bounds sending the request and reading the reply as well.
      client_threads: the threads each client process's BLAS, OpenMP and Numba pools may use
        (:func:`limit_threads`, applied in the client process when it starts): "auto" (the
        default) at most max(1, CPUs // number of clients), so that the clients together do
        not start more threads than there are cores; an integer n exactly n; None leaves the
        pools as the clients inherit them from this process (one per core, by default, in
        every client). The chosen value is :attr:`client_threads`. A matrix product split
        over another number of threads may round differently (in the last bits): the
        iterates equal those of ``transport="inprocess"`` bit for bit when this process runs
        with the clients' thread count (docs/engines.md, "Threads").

    File descriptors: :data:`FDS_PER_CLIENT` = 3 file descriptors per client in the server
    process (its end of the client's pipe and two of the process handle), 3 more for a moment
    while a client is forked; each client process holds a fixed few (its pipe end, the
    standard streams, whatever the server had open when it was forked). With the usual
    ``ulimit -n`` of 1024, about 300 clients fit; when the limit is too low for the clients
    the transport raises :class:`~ssca_solver.errors.ResourceLimitError` (an OSError, errno
    EMFILE) before forking, saying how many are needed and how to raise the limit.

    Uses the ``fork`` start method (Linux, macOS), so user functions need not be picklable.
    With ``stream(..., tolerate_failures=True)`` a client that raised yields a Dropout (its
    process goes on), and a client that died or did not answer in time yields a Dropout and is
    replaced by a fresh process forked from this one (its rows and seed are the same, and
    clients keep no state between rounds that the server relies on).
    """

    def __init__(self, clients: Sequence[Client], timeout=DEFAULT_CLIENT_TIMEOUT,
                 client_threads=DEFAULT_CLIENT_THREADS):
        self._ctx = mp.get_context("fork")
        self.timeout = timeout
        self._clients = tuple(clients)
        self.num_clients = len(self._clients)
        self._threads = client_thread_count(client_threads, self.num_clients)
        self._broken = None
        self._pool = pool = _Pool()
        self._conns, self._procs = pool.conns, pool.procs
        _POOLS.add(pool)
        self._finalizer = weakref.finalize(self, _stop, pool)
        self._finalizer.atexit = False         # _stop_all does it, before multiprocessing's hook
        try:
            _check_descriptors(self.num_clients)
            for i in range(self.num_clients):
                with _fork_errors(self.num_clients, i):
                    self._spawn(i)
        except BaseException:
            _stop(pool)
            raise

    def _spawn(self, i: int) -> None:
        """Fork client i's process (appended, or in place of a dead one)."""
        pool, c = self._pool, self._clients[i]
        parent, child = self._ctx.Pipe()
        if i < len(pool.conns):
            pool.conns[i] = parent
        else:
            pool.conns.append(parent)          # in the pool before the fork: the child closes it
        p = self._ctx.Process(target=_client_loop, args=(child, c, self._threads),
                              daemon=True, name=f"ssca-client-{c.index}")
        try:
            p.start()
        finally:
            child.close()
        os.set_blocking(parent.fileno(), False)
        if i < len(pool.procs):
            pool.procs[i] = p
        else:
            pool.procs.append(p)

    def _restart(self, i: int) -> None:
        """Kill client i's process (no grace: it failed) and fork a fresh one; its pipe, which
        may hold a late answer, goes with it."""
        p, conn = self._procs[i], self._conns[i]
        with contextlib.suppress(Exception):
            p.kill()
        p.join(timeout=5)
        with contextlib.suppress(OSError):
            conn.close()
        with _fork_errors(self.num_clients, self.num_clients - 1):
            self._spawn(i)

    @property
    def client_threads(self) -> Optional[int]:
        """The thread limit of each client process (None: left alone); with "auto", at most
        this many (a pool already smaller is kept)."""
        return None if self._threads is None else self._threads[0]

    @property
    def pids(self) -> list[int]:
        """The client processes' PIDs, in client order (a restarted client has a new one)."""
        return [p.pid for p in self._procs]

    def _deadline(self, request: Request) -> Optional[float]:
        limit = self._timeout.seconds(request.task)
        return None if limit is None else time.monotonic() + limit

    @staticmethod
    def _where(request: Request):
        return request.round if request.task != "evaluate" else "evaluation"

    def _fail(self, i: int, request: Request, cause: str, tb: Optional[str] = None,
              kill: bool = False, tolerate: bool = False):
        """The failure of client i: with ``tolerate``, restart it and return a Dropout; else
        close the transport and return the ClientError to raise."""
        if tolerate:
            self._restart(i)
            return Dropout(i, request.task, request.round, f"ClientError: {cause}")
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

    def _late(self, i: int, what: str, request: Request, waited: Optional[float] = None,
              grace: Optional[str] = None) -> str:
        p = self._procs[i]
        limit = self._timeout.describe(request.task, waited, grace)
        return f"{what} within {limit} (process pid {p.pid} is {_process_state(p)})"

    def _wait(self, i: int, request: Request) -> tuple:
        """Wait until client i's answer begins to arrive or its process ends, within the limit
        (:meth:`ClientTimeout.limits`). On a task's first request under "auto" the limit is
        extended by AUTO_STEP at a time, up to AUTO_FIRST in all, while the process computes
        (a first call compiling); a process that does not (stopped, asleep, blocked) is not
        waited for past AUTO_FLOOR. Returns (ready connections, empty on a timeout; the
        deadline in force; seconds waited; how the grace went: None when none applies, else
        "idle", "stopped" or "over", :meth:`ClientTimeout.describe`)."""
        conn, proc = self._conns[i], self._procs[i]
        start = time.monotonic()
        limit, most = self._timeout.limits(request.task)
        deadline = None if limit is None else start + limit
        looked, cpu = start, _cpu_seconds(proc.pid)
        grace = None if most is None else "idle"
        while True:
            ready = wait([conn, proc.sentinel], timeout=_left(deadline))
            now = time.monotonic()
            if ready or most is None:
                return ready, deadline, now - start, grace
            if now >= start + most:
                return ready, deadline, now - start, "over"
            used = _cpu_seconds(proc.pid)       # None where unreadable: keep extending
            if not (used is None or cpu is None
                    or used - cpu >= AUTO_COMPUTING * (now - looked)):
                return ready, deadline, now - start, grace
            grace = "stopped"
            looked, cpu = now, used
            deadline = min(start + most, now + AUTO_STEP)

    def _receive(self, i: int, request: Request, tolerate: bool = False):
        """("ok", reply) or ("error", description) from client i. When it does not answer in
        time or its process died: ("dropout", Dropout) with ``tolerate`` (client i restarted),
        else ClientError (the transport is closed)."""
        conn = self._conns[i]

        def fail(cause, kill=False):
            out = self._fail(i, request, cause, kill=kill, tolerate=tolerate)
            if tolerate:
                return "dropout", out
            raise out

        ready, deadline, waited, grace = self._wait(i, request)
        if not ready:
            return fail(self._late(i, "no answer", request,
                                   None if grace is None else waited, grace), kill=True)
        if conn not in ready and not conn.poll(0):
            return fail("the client process died: " + self._dead(i))
        try:
            return _recv(conn, deadline)
        except _Late:
            return fail(self._late(i, "its answer did not arrive whole", request), kill=True)
        except (EOFError, OSError) as exc:
            return fail("the client process died: " + self._dead(i)
                        + f" ({type(exc).__name__})")
        except Exception as exc:
            return fail(f"its answer could not be read ({type(exc).__name__}: {exc})")

    def _abandon(self, i: int, request: Request, why: Optional[BaseException]) -> None:
        """Close the transport: client i's reply, unread, must never answer a later request."""
        where = self._where(request)
        where = f"round {where}" if where != "evaluation" else "the full-data evaluation"
        self._broken = (f"when a stream ended on {type(why).__name__} with client {i}'s answer "
                        f"to {where} unread")
        self.close()

    def _drain(self, pending: Sequence[int], request: Request, tolerate: bool) -> None:
        """Read and drop the replies of the clients ``pending`` (each within timeout)."""
        for j in pending:
            try:
                self._receive(j, request, tolerate)
            except ClientError:          # the transport is closed now, and says why
                return
            except BaseException as exc:
                self._abandon(j, request, exc)
                raise

    def _send(self, i: int, message, request: Request, tolerate: bool):
        """Write the framed request to client i: None, or a Dropout (``tolerate``)."""
        try:
            _write(self._conns[i].fileno(), message, self._deadline(request))
        except _Late:
            out = self._fail(i, request, self._late(i, "the request could not be sent", request),
                             kill=True, tolerate=tolerate)
        except (OSError, ValueError) as exc:
            out = self._fail(i, request, "cannot send to the client: " + self._dead(i)
                             + f" ({type(exc).__name__})", tolerate=tolerate)
        except BaseException as exc:     # e.g. Ctrl-C: the request may be half written
            self._abandon(i, request, exc)
            raise
        else:
            return None
        if tolerate:
            return out
        raise out from None

    def stream(self, request, participants=None, tolerate_failures=False):
        if self._broken is not None:
            raise RuntimeError(f"this transport was closed {self._broken}")
        if not self._procs:
            raise RuntimeError("this transport is closed")
        order = participant_order(participants, self.num_clients)
        tolerate = bool(tolerate_failures)
        message = _frame(ForkingPickler.dumps(request))     # pickled once for every client
        unsent = {}         # client -> its Dropout when the request could not be sent
        sent = time.monotonic()
        away = 0.0          # seconds the consumer held the stream (not the clients' time)
        slowest = None      # the slowest answer, from `sent`, less the consumer's time
        for i in order:
            out = self._send(i, message, request, tolerate)
            if out is not None:
                unsent[i] = out
        n = len(order)
        read = 0            # positions in `order` handled so far
        clean = False       # whether the replies not read yet may be drained (else: close)
        why = None
        try:
            for k, i in enumerate(order):
                if i in unsent:
                    kind, payload = "dropout", unsent[i]
                else:
                    kind, payload = self._receive(i, request, tolerate)
                    if kind == "ok":
                        took = time.monotonic() - sent - away
                        slowest = took if slowest is None else max(slowest, took)
                read, clean = k + 1, True
                if kind == "error":
                    name, text, tb, exc = payload
                    if tolerate:
                        payload = Dropout(i, request.task, request.round,
                                          f"{name.rsplit('.', 1)[-1]}: {text}")
                    elif exc is None:
                        raise self._fail(i, request, f"raised {name}: {text} (the exception "
                                         "could not be sent back as itself)", tb)
                    else:
                        raise exc from _RemoteTraceback(
                            f"raised in client {i}, round {request.round}:\n{tb}")
                left = time.monotonic()
                yield payload         # the consumer may leave here (GeneratorExit): drain
                away += time.monotonic() - left
                clean = False
            if slowest is not None:
                self._timeout.record(request.task, slowest)
        except BaseException as exc:
            why = exc
            raise
        finally:
            # a reply left in a pipe would be read as the answer to the next request
            if read < n and self._procs and self._broken is None:
                pending = [j for j in order[read:] if j not in unsent]
                if clean:
                    self._drain(pending, request, tolerate)
                elif pending:     # e.g. Ctrl-C while waiting for reply `read`
                    self._abandon(order[read], request, why)

    def close(self):
        if self._pool.procs or self._pool.conns:
            _stop(self._pool)
