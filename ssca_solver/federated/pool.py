"""The forked client processes of the process transport: each one's loop, and stopping them.

Every pool of client processes not stopped yet is in ``_POOLS``: stopped at interpreter exit
(before multiprocessing's own exit hook, which would wait forever for a stopped child), and
forgotten in every forked child, so that a client holds no server end of any pipe (the server's
death reaches it as end-of-file) and never stops processes that are not its own.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing.util  # noqa: F401  (registers its exit hook before ours: see _stop_all)
import os
import pickle
import signal
import time
from typing import Optional

from .client import Client
from .messages import exception_parts
from .pipes import _left, _post
from .threads import limit_threads

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
    that are not its own. The handles of the clients forked before it are closed too: a client
    process holds a fixed number of descriptors however many clients there are.
    """
    for pool in list(_POOLS):
        for conn in pool.conns:
            with contextlib.suppress(OSError):
                conn.close()
        for p in pool.procs:    # the siblings' process handles (2 descriptors each)
            fds = getattr(getattr(getattr(p, "_popen", None), "finalizer", None), "_args", ())
            for fd in fds:
                if isinstance(fd, int):
                    with contextlib.suppress(OSError):
                        os.close(fd)
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
    return (*exception_parts(exc), _picklable(exc))


def _client_loop(conn, client: Client, threads: Optional[tuple] = None) -> None:
    # Ctrl-C goes to the whole process group: the server handles it and stops the clients
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _forget_pools()                 # done at fork already; again in case fork hooks did not run
    if threads is not None:         # (threads, at_most): client_threads
        limit_threads(*threads)
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):  # the server closed its end, or died
            break
        if request is None:
            break
        request.w.flags.writeable = False      # as with InProcessTransport: w is read-only
        for a in request.arrays.values():
            a.flags.writeable = False
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


try:
    _CLOCK_TICKS = float(os.sysconf("SC_CLK_TCK"))
except (AttributeError, ValueError, OSError):
    _CLOCK_TICKS = 100.0


def _cpu_seconds(pid: int) -> Optional[float]:
    """The CPU time (user + system, all threads) process ``pid`` has used, from
    /proc/PID/stat; None where it cannot be read (not Linux, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return None

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
