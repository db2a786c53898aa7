"""``client_timeout``: how long a client may take to answer one request.

A number is honoured exactly; None waits forever; "auto" (the default) follows the answer
times measured on the transport, task by task (:class:`ClientTimeout`). The process and Flower
transports apply it (:class:`~ssca_solver.federated.transport.TimedTransport`); in-process
clients cannot be interrupted.
"""

from __future__ import annotations

import collections
from typing import Optional

import numpy as np

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
