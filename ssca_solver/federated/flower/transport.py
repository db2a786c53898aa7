"""The transport: :class:`FlowerTransport` hands each request to its engine's Grid session and
yields the replies in client order (a failure as a ``ClientError`` or a ``Dropout``);
:func:`make` is the registry's factory for ``transport="flower"``."""

from __future__ import annotations

import contextlib
import time
from typing import Iterator, Optional, Sequence

from ... import errors
from ...errors import ClientError
from ..client import Client
from ..messages import Dropout, Reply, Request
from ..timeouts import DEFAULT_CLIENT_TIMEOUT
from ..transport import TimedTransport, participant_order
from .clientapp import kill_time
from .codec import _Failure
from .engines import ENGINES, _Deployment, _Simulation

#: Seconds to wait for every node to join and answer the handshake (option
#: ``flower_start_timeout``).
DEFAULT_START_TIMEOUT = 120.0


def _raise_failure(i: int, request: Request, failure: _Failure):
    where = request.round if request.task != "evaluate" else "evaluation"
    if failure.kind == "raised":
        module, _, name = failure.type_name.rpartition(".")
        cls = getattr(errors, name, None) if module == errors.__name__ else None
        if (isinstance(cls, type) and issubclass(cls, errors.SSCAError)   # built from its text
                and not any("__init__" in vars(k) for k in cls.__mro__
                            if k.__module__ == errors.__name__)):
            exc = cls(failure.message)
            exc.add_note(f"raised in client {i}, round {request.round} (Flower node); client "
                         f"traceback:\n{failure.tb}")
            raise exc
    raise ClientError(i, where, failure.cause, failure.tb)


class FlowerTransport(TimedTransport):
    """Requests as Flower messages to a ``ClientApp`` hosting the clients (see the module).

    Args:
      clients: the clients (simulation: shipped to the ClientApp; deployment: only their seed
        and task table are used, each node loads its own rows).
      timeout: seconds a client may take to answer one request (``client_timeout``,
        honoured exactly), None (wait forever) or "auto" (the default: chosen from the
        answer times measured, :class:`~ssca_solver.federated.ClientTimeout`). It counts from
        sending the request (plus the time the server itself spent on the replies already
        yielded). In the simulation a client still busy max(:data:`~.clientapp.KILL_GRACE`,
        its limit) seconds past its limit ends its Ray actor's process (Ray starts a new
        one), and when the transport closes every client still busy is ended at once, so a
        user function that never returns holds neither the run nor the interpreter. In a
        deployment a node ends the ClientApp process of a message (one per message) whose
        client is still busy the limit plus max(KILL_GRACE, the limit) after it took the
        message (the node's clock), so the node serves the next messages.
      engine: "simulation" or "deployment".
      superlink: the SuperLink's address (deployment), e.g. "127.0.0.1:9093".
      bridge: where this process listens for the deployment ServerApp ("host:port", port 0: a
        free one).
      start_timeout: seconds for the engine to start and every node to answer.
      backend_config: the simulation's Ray backend config (None: one CPU per node, quiet).
    """

    def __init__(self, clients: Sequence[Client], timeout=DEFAULT_CLIENT_TIMEOUT,
                 engine: str = "simulation", superlink: Optional[str] = None,
                 bridge: str = "127.0.0.1:0", start_timeout: float = DEFAULT_START_TIMEOUT,
                 backend_config: Optional[dict] = None):
        if engine not in ENGINES:
            raise ValueError(f"flower_engine must be one of {ENGINES}, got {engine!r}")
        self.num_clients = len(clients)
        self.timeout = timeout
        self.engine = engine
        self._closed = False
        if engine == "simulation":
            self._engine = _Simulation(clients, start_timeout, backend_config)
        else:
            if superlink is None:
                raise ValueError("flower_engine='deployment' needs flower_superlink='host:port' "
                                 "(the SuperLink's --host:--port, e.g. 127.0.0.1:9093)")
            self._engine = _Deployment(clients, superlink, bridge, start_timeout, timeout)
        self._session = self._engine.session

    def stream(self, request: Request, participants=None,
               tolerate_failures: bool = False) -> Iterator:
        """Yield, in the order of ``participants`` (None: every client), each one's Reply, or a
        Dropout when it failed and ``tolerate_failures`` is True (else ClientError)."""
        if self._closed:
            raise RuntimeError("this transport is closed")
        order = participant_order(participants, self.num_clients)
        limit = self._timeout.seconds(request.task)
        ttl = 3600.0 if limit is None else max(limit + 60.0, 60.0)
        if self.engine == "simulation":     # the node ends a client stuck past its limit
            guard = {"busy": self._engine.busy}
            if limit is not None:
                due = time.time() + limit
                guard.update(deadline=due, kill_at=kill_time(due, limit))
            token = self._session.send(request, order, ttl, guard)
        else:
            # a SuperNode's clock may differ from ours: the node counts from when its ClientApp
            # takes the message (later than we sent it), and ends that ClientApp's process
            # (one per message) if the client is still busy then
            token = self._session.send(request, order, ttl, None if limit is None else
                                       {"kill_in": kill_time(0.0, limit)})
        sent = time.monotonic()
        away = 0.0          # seconds the consumer held the stream: not counted against clients
        slowest = None
        got: dict = {}
        try:
            for i in order:
                while i not in got:
                    left = (1.0 if limit is None
                            else sent + away + limit - time.monotonic())
                    if left <= 0:       # a last look: replies may wait unread
                        for j, outcome in self._session.poll(token, 0.0):
                            got[j] = outcome
                        if i in got:
                            break
                        cause = f"no answer within {self._timeout.describe(request.task)}"
                        for j in order:
                            got.setdefault(j, _Failure(cause))
                        break
                    for j, outcome in self._session.poll(token, min(left, 1.0)):
                        got[j] = outcome
                        if isinstance(outcome, Reply):
                            took = time.monotonic() - sent - away
                            slowest = took if slowest is None else max(slowest, took)
                outcome = got.pop(i)
                if isinstance(outcome, Reply) and outcome.client != i:
                    outcome = _Failure(f"it answered as client {outcome.client}")
                if isinstance(outcome, Reply):
                    gone = time.monotonic()
                    yield outcome
                    away += time.monotonic() - gone
                elif tolerate_failures:
                    yield Dropout(i, request.task, request.round, outcome.cause)
                else:
                    _raise_failure(i, request, outcome)
            if slowest is not None:
                self._timeout.record(request.task, slowest)
        finally:
            with contextlib.suppress(Exception):
                self._session.forget(token)

    def close(self, wait: bool = False) -> None:
        """Stop the clients and the engine. Simulation: clients still busy are ended at once;
        the Simulation Runtime's and Ray's shutdown (a few seconds) finish in the background unless
        ``wait`` (a new simulation, and the interpreter at exit, wait for it), so that a
        solve ending on a client past ``client_timeout`` raises without that delay."""
        if not self._closed:
            self._closed = True
            if self.engine == "simulation":
                self._engine.close(wait=wait)
            else:
                self._engine.close()
        elif wait and self.engine == "simulation":
            self._engine.close(wait=True)


def make(clients, timeout, flower_engine="simulation", flower_superlink=None,
         flower_bridge="127.0.0.1:0", flower_start_timeout=DEFAULT_START_TIMEOUT):
    """The registry's factory for ``transport="flower"`` (options of the same names)."""
    return FlowerTransport(clients, timeout, flower_engine, flower_superlink, flower_bridge,
                           flower_start_timeout)
