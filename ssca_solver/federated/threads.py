"""``client_threads``: the thread pools of a process that only runs clients.

N client processes that each start one BLAS, OpenMP or Numba thread per core start N times as
many threads as there are cores; :func:`limit_threads` caps a client process's pools, and
:func:`client_thread_count` shares the CPUs out among the clients ("auto").
"""

from __future__ import annotations

import contextlib
import os
from typing import Optional

import numpy as np

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
