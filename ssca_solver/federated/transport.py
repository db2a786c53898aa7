"""The transport contract and the in-process transport.

A transport carries one request to the clients and brings the replies back, in their order:
``stream(request, participants=None, tolerate_failures=False)`` sends the request to the
clients ``participants`` (a sequence of client indices; None: every client, in index order)
and yields their replies in that order. With ``tolerate_failures=True`` a client that raised,
died or timed out yields a :class:`~ssca_solver.federated.messages.Dropout` in place of its
reply and the transport stays usable; with False (the default) such a client ends the stream
with an exception.

* :class:`InProcessTransport`: clients in this process, run one after the other when the server
  asks for their reply.
* :class:`TimedTransport`: the base of transports that can interrupt a client, which take
  ``client_timeout`` (:mod:`.timeouts`): the process transport (:mod:`.processes`) and the
  Flower one (:mod:`.flower`).
"""

from __future__ import annotations

from typing import Iterator, Optional, Sequence, Union

import numpy as np

from .client import Client
from .messages import Dropout, Reply, Request, describe_error
from .timeouts import ClientTimeout

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


class TimedTransport(Transport):
    """A transport that can interrupt a client: each answer is bounded by ``client_timeout``,
    held as a :class:`~ssca_solver.federated.timeouts.ClientTimeout` that measures the answer
    times under "auto"."""

    @property
    def timeout(self):
        """``client_timeout``: seconds, None or "auto" (:class:`ClientTimeout`); settable."""
        return self._timeout.value

    @timeout.setter
    def timeout(self, value) -> None:
        self._timeout = ClientTimeout(value)


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
