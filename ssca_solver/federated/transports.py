"""The transports under one name: a facade over the modules of their parts.

* :mod:`.transport`: the contract (``Transport.stream``), :class:`InProcessTransport` and
  :class:`TimedTransport`, the base of the transports that take ``client_timeout``;
* :mod:`.timeouts`: ``client_timeout`` (:class:`ClientTimeout`, the "auto" rule's constants);
* :mod:`.threads`: ``client_threads`` (:func:`limit_threads` and the CPUs shared out);
* :mod:`.processes`: :class:`ProcessTransport`, each client in a forked process, with
  :mod:`.pool` (the client processes: their loop, stopping them) and :mod:`.pipes` (the
  server's end of a pipe, every wait bounded by a deadline);
* :mod:`.descriptors`: the file descriptors the forked clients need.

Every name code imported from here before the split is still here. Setting one of them here
sets it in the modules that hold it (as when they were one module): a test that replaces
``transports.AUTO_FLOOR`` or ``transports.available_cpus`` changes what the transports use.
"""

from __future__ import annotations

import sys
import types

from . import descriptors, pipes, pool, processes, threads, timeouts, transport
from .descriptors import FDS_PER_CLIENT, _check_descriptors  # noqa: F401  (tests use them)
from .messages import describe_error
from .pool import _cpu_seconds  # noqa: F401
from .processes import ProcessTransport
from .threads import (DEFAULT_CLIENT_THREADS, THREAD_VARIABLES, available_cpus,
                      check_client_threads, client_thread_count, limit_threads)
from .timeouts import (AUTO_COMPUTING, AUTO_FACTOR, AUTO_FIRST, AUTO_FLOOR, AUTO_STEP,
                       AUTO_WINDOW, DEFAULT_CLIENT_TIMEOUT, ClientTimeout)
from .transport import InProcessTransport, TimedTransport, Transport, participant_order

__all__ = ["AUTO_COMPUTING", "AUTO_FACTOR", "AUTO_FIRST", "AUTO_FLOOR", "AUTO_STEP",
           "AUTO_WINDOW", "DEFAULT_CLIENT_THREADS", "DEFAULT_CLIENT_TIMEOUT", "FDS_PER_CLIENT",
           "THREAD_VARIABLES", "ClientTimeout", "InProcessTransport", "ProcessTransport",
           "TimedTransport", "Transport", "available_cpus", "check_client_threads",
           "client_thread_count", "describe_error", "limit_threads", "participant_order"]

_PARTS = (timeouts, threads, transport, pipes, pool, descriptors, processes)
_MISSING = object()


class _Facade(types.ModuleType):
    def __setattr__(self, name, value):
        # the parts that hold the object this name holds here (imported from one another)
        old = self.__dict__.get(name, _MISSING)
        if old is not _MISSING:
            for part in _PARTS:
                if vars(part).get(name, _MISSING) is old:
                    setattr(part, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Facade
