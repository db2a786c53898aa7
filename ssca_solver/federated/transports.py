"""Transports carry one request to the clients and bring the replies back, in their order.

``stream(request, participants=None, tolerate_failures=False)`` sends the request to the clients
``participants`` (a sequence of client indices; None: every client, in index order) and yields
their replies in that order. With ``tolerate_failures=True`` a client that raised, died or timed
out yields a :class:`~ssca_solver.federated.messages.Dropout` in place of its reply and the
transport stays usable (a forked client is restarted: clients are stateless between rounds);
with False (the default) such a client ends the stream with an exception, as below.

* :class:`InProcessTransport`: clients in this process, run one after the other when the server
  asks for their reply.
* :class:`ProcessTransport`: each client in its own forked process; requests and replies cross
  a pipe. A client that does not answer within ``timeout`` seconds (:class:`ClientTimeout`: a
  number is honoured exactly; the default "auto" follows the measured answer times), or whose
  process dies, raises :class:`~ssca_solver.errors.ClientError` naming the client and the
  round; an exception raised
  in a client reaches the server as itself (or, when it cannot be pickled, as a ClientError with
  its type and traceback text). No read or write of a pipe waits longer than ``timeout``. After
  any failure every client process is stopped (killed if it does not exit), and so at ``close``,
  when the transport is garbage-collected and at interpreter exit: nothing is left behind. The
  clients hold no copy of the server's ends of the pipes, so when the server process dies they
  read end-of-file and exit. Each client process limits its own BLAS, OpenMP and Numba thread
  pools (``client_threads``, :func:`limit_threads`; default "auto": the CPUs shared out among
  the clients), so that N clients do not start N times as many threads as there are cores.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import errno
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

import numpy as np
from multiprocessing.connection import wait
from multiprocessing.reduction import ForkingPickler
from typing import Iterator, Optional, Sequence, Union

from ..errors import ClientError, ResourceLimitError
from .client import Client
from .messages import Dropout, Reply, Request, describe_error

#: The default ``client_timeout``: "auto", chosen from the measured answer times
#: (:class:`ClientTimeout`).
DEFAULT_CLIENT_TIMEOUT = "auto"
#: client_timeout="auto": the larger of AUTO_FLOOR seconds and AUTO_FACTOR times the slowest
#: answer of the last AUTO_WINDOW requests of the same task; on the first request of a task,
#: when nothing has been measured, AUTO_FLOOR ...
AUTO_FLOOR = 60.0
AUTO_FACTOR = 10.0
AUTO_WINDOW = 20
#: ... and the grace for a first call's imports and JIT compiling: the process transport
#: extends AUTO_FLOOR by AUTO_STEP seconds at a time, up to AUTO_FIRST seconds in all, while
#: the client's process computes (its CPU time grew by at least AUTO_COMPUTING of the wall
#: time since the last look); a client that waits (stopped, asleep, blocked, deadlocked) is
#: ended at AUTO_FLOOR. Transports that cannot see a client's CPU time (Flower) allow the
#: first request AUTO_FIRST seconds.
AUTO_FIRST = 300.0
AUTO_STEP = 10.0
AUTO_COMPUTING = 0.005

#: ``client_threads`` of :class:`ProcessTransport` (solve option of ``transport="process"``):
#: "auto", each client process's thread pools get at most max(1, CPUs // clients) threads
DEFAULT_CLIENT_THREADS = "auto"

#: Environment variables that thread pools read when they start: set in a client process by
#: :func:`limit_threads` for the libraries it loads later (those already loaded are limited
#: through threadpoolctl)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def available_cpus() -> int:
    """The CPUs this process may run on: its affinity mask where the system tells it (a
    container or ``taskset`` may allow fewer than the machine has), else ``os.cpu_count()``."""
    with contextlib.suppress(AttributeError, OSError):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def check_client_threads(value):
    """``client_threads`` checked: None, "auto" or an integer >= 1 (returned as int)."""
    if value is None or (isinstance(value, str) and value == "auto"):
        return value
    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))
            or value < 1):
        raise ValueError(f"client_threads must be a positive integer, 'auto' (the CPUs shared "
                         f"out among the client processes) or None (leave the threads alone), "
                         f"got {value!r}")
    return int(value)


def client_thread_count(value, processes: int) -> Optional[tuple]:
    """``client_threads`` for ``processes`` client processes running at once, as
    (threads, at_most) for :func:`limit_threads`; None: leave the threads alone.

    "auto" gives at most max(1, :func:`available_cpus` // processes) threads (a pool already
    smaller, e.g. under ``OMP_NUM_THREADS=1``, is not enlarged); an integer n gives exactly n.
    """
    value = check_client_threads(value)
    if value is None:
        return None
    if isinstance(value, str):
        return max(1, available_cpus() // max(1, int(processes))), True
    return value, False


def limit_threads(threads: int, at_most: bool = False) -> dict:
    """Limit this process's thread pools to ``threads`` threads (``at_most``: only lower the
    ones above it), for the rest of its life: meant for a process that only runs clients (a
    forked client, a Flower ClientApp's process), not for the user's.

    * BLAS and OpenMP libraries already loaded (OpenBLAS, MKL, BLIS, libgomp, ...), through
      ``threadpoolctl.threadpool_limits``;
    * Numba's parallel threads (``numba.set_num_threads``; it applies to the calling thread,
      so call this from the thread that runs the client);
    * libraries loaded later, through :data:`THREAD_VARIABLES` in ``os.environ``.

    Returns {library prefix or "numba": threads} for what was limited. Never raises: a client
    whose threads cannot be limited still answers.
    """
    n = max(1, int(threads))
    done = {}
    for var in THREAD_VARIABLES:
        old = os.environ.get(var, "")
        if not at_most or not old.isdigit() or int(old) > n:
            os.environ[var] = str(n)
    with contextlib.suppress(Exception):
        from threadpoolctl import threadpool_info, threadpool_limits

        limits = {}
        for lib in threadpool_info():
            have = lib.get("num_threads")
            if lib.get("prefix") and (not at_most or have is None or have > n):
                limits[lib["prefix"]] = n
        if limits:
            threadpool_limits(limits=limits)        # not as a context: for good
        done.update(limits)
    with contextlib.suppress(Exception):
        import numba

        k = min(n, int(numba.config.NUMBA_NUM_THREADS))
        numba.set_num_threads(k)
        done["numba"] = k
    return done


#: File descriptors the server process holds per client of a :class:`ProcessTransport`: its
#: end of the client's pipe, and the two ends multiprocessing keeps of its process handle
#: (the sentinel that tells the process's exit, and the pipe whose closing tells the client
#: that the server died). Forking one more client needs 3 more for a moment.
FDS_PER_CLIENT = 3


class ClientTimeout:
    """``client_timeout`` as the transports apply it: how long a client may take to answer one
    request.

    Args:
      value: seconds (a positive number, honoured exactly), None (wait forever) or "auto"
        (the default, :data:`DEFAULT_CLIENT_TIMEOUT`).

    With "auto" the limit follows the answer times measured on this transport, task by task
    (a round, a full-data evaluation, a probe each have their own): the larger of
    :data:`AUTO_FLOOR` (60 s) and :data:`AUTO_FACTOR` (10) times the slowest answer among the
    last :data:`AUTO_WINDOW` (20) requests of that task. The first request of a task, with
    nothing measured, has :data:`AUTO_FLOOR` and a bounded grace for a first call's imports
    and JIT compiling (:meth:`limits`): up to :data:`AUTO_FIRST` (300 s) in all while the
    client's process computes (the process transport watches its CPU time); a transport that
    cannot watch allows :data:`AUTO_FIRST` (:meth:`seconds`). An answer time runs from
    sending the request until the client's reply is read (the slowest client of a request
    sets it); failed clients are not measured.
    So a frozen client stops a run of 0.1-second rounds after about a minute, not ten, and a
    run whose rounds slowly grow (a growing batch) keeps ten times its recent pace.
    """

    def __init__(self, value="auto"):
        if isinstance(value, ClientTimeout):
            value = value.value
        if value is not None and not (isinstance(value, str) and value == "auto"):
            if (isinstance(value, (bool, np.bool_, str))
                    or not isinstance(value, (int, float, np.integer, np.floating))
                    or not value > 0):
                raise ValueError(f"client_timeout must be positive seconds, None or 'auto', "
                                 f"got {value!r}")
            value = float(value)
        self.value = value
        self._times: dict = {}

    @property
    def auto(self) -> bool:
        return isinstance(self.value, str)

    def seconds(self, task: str) -> Optional[float]:
        """The limit for one client's answer to a request of ``task`` (None: no limit)."""
        if not self.auto:
            return self.value
        times = self._times.get(task)
        if not times:
            return AUTO_FIRST
        return max(AUTO_FLOOR, AUTO_FACTOR * max(times))

    def limits(self, task: str) -> tuple:
        """(limit, most): the limit for one client's answer to a request of ``task``, and the
        most it may be extended to while the client's process computes (None: no extension;
        only on the first request of a task under "auto": (AUTO_FLOOR, AUTO_FIRST))."""
        if self.auto and not self._times.get(task):
            return min(AUTO_FLOOR, AUTO_FIRST), AUTO_FIRST
        return self.seconds(task), None

    def record(self, task: str, seconds: float) -> None:
        """The slowest answer time of one request of ``task`` (with "auto")."""
        if self.auto:
            if task not in self._times:
                self._times[task] = collections.deque(maxlen=AUTO_WINDOW)
            self._times[task].append(float(seconds))

    def describe(self, task: str, waited: Optional[float] = None,
                 grace: Optional[str] = None) -> str:
        """The limit in force for ``task``, for a message: "client_timeout=2 s", or with "auto"
        the number and how it was chosen. On a task's first request, ``waited`` is how long the
        process transport waited and ``grace`` how the grace of :meth:`limits` went: "idle"
        (the client was not computing at the floor), "stopped" (it computed, then stopped) or
        "over" (it computed to the grace's end)."""
        limit = self.seconds(task) if waited is None else waited
        if not self.auto:
            return f"client_timeout={limit:g} s"
        times = self._times.get(task)
        if times:
            how = (f"the larger of {AUTO_FLOOR:g} s and {AUTO_FACTOR:g} x the slowest answer, "
                   f"{max(times):.3g} s, of the last {len(times)} {task!r} request(s)")
        elif grace is None:
            how = f"the allowance for the first request of task {task!r}"
        else:
            idle = f"under {100 * AUTO_COMPUTING:g} % of a CPU"
            how = f"the first request of task {task!r}: {AUTO_FLOOR:g} s, " + {
                "idle": f"not extended for compiling: the client's process was not computing "
                        f"({idle})",
                "stopped": f"extended by {AUTO_STEP:g} s at a time while the client's process "
                           f"computed, until it stopped ({idle} over the last step)",
                "over": f"extended while the client computed up to the grace's end, "
                        f"{AUTO_FIRST:g} s in all, for a first call's imports and compiling",
            }[grace]
        return (f"{limit:.3g} s (client_timeout='auto': {how}; pass client_timeout=SECONDS to "
                "set it)")


class Transport:
    """Carries a request to the clients; ``stream`` yields replies one by one in their order.

    ``stream(request, participants=None, tolerate_failures=False)``: ``participants`` is a
    sequence of distinct client indices (None: every client, in index order); with
    ``tolerate_failures`` a client that fails yields a :class:`Dropout` instead of raising.
    ``exchange`` is ``list(stream(...))``. The server's round consumes ``stream``, adding
    replies to its statistics as they come, so it never holds more than a bounded number.
    """

    num_clients: int = 0

    def stream(self, request: Request, participants: Optional[Sequence[int]] = None,
               tolerate_failures: bool = False) -> Iterator[Union[Reply, Dropout]]:
        raise NotImplementedError

    def exchange(self, request: Request, participants: Optional[Sequence[int]] = None,
                 tolerate_failures: bool = False) -> list[Union[Reply, Dropout]]:
        if participants is None and not tolerate_failures:   # a stream(request) of old works
            return list(self.stream(request))
        return list(self.stream(request, participants, tolerate_failures))

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def participant_order(participants: Optional[Sequence[int]], num_clients: int) -> list[int]:
    """``participants`` as a list of distinct client indices in 0..num_clients-1 (None: all)."""
    if participants is None:
        return list(range(num_clients))
    order = []
    for i in participants:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)) \
                or not 0 <= int(i) < num_clients:
            raise ValueError(f"participants must be client indices in 0..{num_clients - 1}, "
                             f"got {i!r}")
        order.append(int(i))
    if len(set(order)) != len(order):
        raise ValueError(f"participants must be distinct, got {list(order)}")
    return order


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

    def stream(self, request, participants=None, tolerate_failures=False):
        order = participant_order(participants, self.num_clients)
        request = request.read_only()
        for i in order:
            if not tolerate_failures:
                yield self._clients[i].handle(request)
                continue
            try:
                reply = self._clients[i].handle(request)
            except Exception as exc:       # Ctrl-C and the like are not a client's failure
                reply = Dropout(i, request.task, request.round, describe_error(exc))
            yield reply


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
    name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    try:
        text = str(exc)
    except Exception:
        text = f"<str() of the {type(exc).__name__} failed>"
    return name, text, traceback.format_exc(), _picklable(exc)


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


# the server's side of a pipe: non-blocking, every wait bounded by a deadline

class _Late(Exception):
    """The deadline passed before a message was written or read whole."""


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


def _open_descriptors() -> Optional[int]:
    """Descriptors this process has open now (None where /proc or /dev/fd cannot tell)."""
    for d in ("/proc/self/fd", "/dev/fd"):
        with contextlib.suppress(OSError):
            return len(os.listdir(d)) - 1          # less the one listdir opened
    return None


def _nofile_limits() -> tuple:
    """(soft, hard) RLIMIT_NOFILE, each None when unlimited or unknown."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return None, None
    inf = getattr(resource, "RLIM_INFINITY", -1)
    return (None if soft == inf else int(soft)), (None if hard == inf else int(hard))


def _descriptor_message(num_clients: int, started: int, others: Optional[int],
                        soft: Optional[int], hard: Optional[int]) -> str:
    """What to raise, for ``num_clients`` clients of which ``started`` had been forked;
    ``others``: the descriptors open that are not the transport's (None: unknown)."""
    need = FDS_PER_CLIENT * num_clients + FDS_PER_CLIENT      # and one fork's moment
    have = "" if others is None else f" and {others} are open for other things"
    target = need + (others or 0) + 64
    target = 1 << (target - 1).bit_length()                   # the next power of two
    text = (f"transport='process' cannot open the descriptors for {num_clients} clients: it "
            f"needs {FDS_PER_CLIENT} file descriptors per client in the server process "
            f"(about {need} for {num_clients} clients), but the limit of open files "
            f"(ulimit -n) is {soft if soft is not None else 'unknown'}{have}")
    if started:
        text += f" (the limit was hit after {started} client processes had started)"
    text += (f". Raise the limit to at least {target}: `ulimit -n {target}` in the shell "
             f"that starts Python, or in the program before solving, "
             f"`resource.setrlimit(resource.RLIMIT_NOFILE, ({target}, hard))`")
    if hard is not None:
        text += f" (the hard limit here is {hard}"
        text += ("; above it only root or the system's limits configuration can raise it)"
                 if hard < target else ")")
    text += "; or use fewer clients, or transport='inprocess'"
    return text


def _check_descriptors(num_clients: int) -> None:
    """Refuse before forking when the clients' descriptors cannot fit under the soft limit."""
    soft, hard = _nofile_limits()
    open_now = _open_descriptors()
    if soft is None or open_now is None:
        return
    if open_now + FDS_PER_CLIENT * (num_clients + 1) > soft:
        raise ResourceLimitError(errno.EMFILE, _descriptor_message(
            num_clients, 0, open_now, soft, hard))


def _descriptor_error(num_clients: int, started: int, exc: OSError) -> ResourceLimitError:
    """The error for an EMFILE/ENFILE met while forking client ``started``."""
    soft, hard = _nofile_limits()
    open_now = _open_descriptors()
    others = None if open_now is None else max(0, open_now - FDS_PER_CLIENT * started)
    text = _descriptor_message(num_clients, started, others, soft, hard)
    if exc.errno == errno.ENFILE:
        text += (" (the error was ENFILE: the whole system's table of open files is full, "
                 "not only this process's limit)")
    return ResourceLimitError(exc.errno, text)


class _RemoteTraceback(Exception):
    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text


class ProcessTransport(Transport):
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
                try:
                    self._spawn(i)
                except OSError as exc:
                    if exc.errno not in (errno.EMFILE, errno.ENFILE):
                        raise
                    raise _descriptor_error(self.num_clients, i, exc) from exc
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
        try:
            self._spawn(i)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            raise _descriptor_error(self.num_clients, self.num_clients - 1, exc) from exc

    @property
    def client_threads(self) -> Optional[int]:
        """The thread limit of each client process (None: left alone); with "auto", at most
        this many (a pool already smaller is kept)."""
        return None if self._threads is None else self._threads[0]

    @property
    def pids(self) -> list[int]:
        """The client processes' PIDs, in client order (a restarted client has a new one)."""
        return [p.pid for p in self._procs]

    @property
    def timeout(self):
        """``client_timeout``: seconds, None or "auto" (:class:`ClientTimeout`); settable."""
        return self._timeout.value

    @timeout.setter
    def timeout(self, value) -> None:
        self._timeout = ClientTimeout(value)

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
            used = _cpu_seconds(proc.pid)       # None where unreadable: extend, as before
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
