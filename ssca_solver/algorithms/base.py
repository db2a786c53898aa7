"""The algorithm protocol: what the runner needs from a method.

An algorithm is a small object of settings (like a jaxopt solver or an optax transformation)
with pure functions over an immutable state (a NamedTuple with at least ``t``, rounds done, and
``w``, the current point):

    tasks()                -> {task name: handler(client, request) -> Reply}   (client side)
    init(x0)               -> state
    request(state)         -> Request for round state.t + 1
    step(state, replies)   -> (state, info)        (replies: an iterable, consumed once)
    record(info)           -> {column: value}      (one history row; shapes in ``columns``)
    describe(info)         -> str                  (one progress-line fragment)
    state_arrays(state)    -> {name: ndarray}      (checkpoint)
    state_from_arrays(arrays) -> state             (resume)

The runner (:mod:`ssca_solver.runner`) drives any algorithm over any transport; the federated
layer carries its requests to the handlers it registered.

Replies reach ``step`` with a server-side factor ``reply.weight`` (partial participation, the
renormalisation after dropouts; 1 by default): an algorithm combines reply i's arrays as
``weight_i N_i / (B_i N) x_i`` (N_i = ``num_rows``, B_i = ``batch_size``; a reply that is not a
sum over rows, such as a model, sets ``batch_size=1``). An algorithm whose server reads replies
only through that weighted sum may set ``supports_secure_aggregation = True``: under
``secure_aggregation`` it then receives one reply (``client == AGGREGATE``) holding the sum.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Protocol, runtime_checkable

import numpy as np

from ..federated import Reply, Request, TaskHandler


@runtime_checkable
class Algorithm(Protocol):
    """See the module docstring."""

    name: str
    columns: Mapping[str, tuple]

    def tasks(self) -> Mapping[str, TaskHandler]: ...

    def init(self, x0: np.ndarray) -> Any: ...

    def request(self, state) -> Request: ...

    def step(self, state, replies: Iterable[Reply]) -> tuple[Any, Any]: ...

    def record(self, info) -> Mapping[str, Any]: ...

    def describe(self, info) -> str: ...

    def state_arrays(self, state) -> Mapping[str, np.ndarray]: ...

    def state_from_arrays(self, arrays: Mapping[str, np.ndarray]) -> Any: ...
