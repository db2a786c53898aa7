"""The client side: rows, a seed, and the tasks an algorithm registered.

A client is stateless between rounds: its mini-batch at round t is a pure function of
(seed, client, round, draw) (:meth:`Client.batch`), so any engine that hosts clients (this
process, a forked process, a framework that starts a fresh process per message) gives the same
batches and hence the same iterates.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional

import numpy as np

from ..model.data import ClientData
from .messages import Reply, Request

#: A task handler: ``handler(client, request) -> Reply``. Algorithms register them by name.
TaskHandler = Callable[["Client", Request], Reply]


class Client:
    """One client: its rows, its seed and a table of task handlers.

    Args:
      index: i, the client's position in the federated data.
      data: its rows.
      seed: the run's seed entropy (an int, from ``np.random.SeedSequence(seed).entropy``).
      tasks: task name -> handler; :meth:`handle` runs ``tasks[request.task]``.
    """

    def __init__(self, index: int, data: ClientData, seed: int,
                 tasks: Mapping[str, TaskHandler]):
        self.index = int(index)
        self.X = data.X
        self.y = data.y
        self.seed = int(seed)
        self.tasks = dict(tasks)

    @property
    def num_rows(self) -> int:
        return int(self.X.shape[0])

    def handle(self, request: Request) -> Reply:
        """Run the handler registered for ``request.task`` and return its reply."""
        try:
            handler = self.tasks[request.task]
        except KeyError:
            raise ValueError(f"client {self.index}: no handler for task {request.task!r} "
                             f"(registered: {sorted(self.tasks)})") from None
        return handler(self, request)

    def rng(self, round: int, draw: int = 0) -> np.random.Generator:
        """The generator of (seed, client, round, draw): the same on every engine."""
        return np.random.default_rng(
            np.random.SeedSequence(self.seed, spawn_key=(self.index, int(round), int(draw))))

    def batch(self, round: int, batch_size: Optional[int], draw: int = 0):
        """Rows (X, y, b) of the mini-batch for ``round`` (and local step ``draw``).

        ``batch_size=None`` (or N_i) gives every row; otherwise B rows drawn uniformly without
        replacement by :meth:`rng`.
        """
        n = self.num_rows
        if batch_size is None or batch_size >= n:
            return self.X, self.y, n
        idx = self.rng(round, draw).choice(n, size=int(batch_size), replace=False)
        return self.X[idx], (None if self.y is None else self.y[idx]), int(batch_size)

    def reply(self, request: Request, arrays: Mapping[str, np.ndarray],
              batch_size: Optional[int] = None) -> Reply:
        """A :class:`Reply` to ``request`` from this client."""
        return Reply(self.index, request.task, request.round, self.num_rows,
                     self.num_rows if batch_size is None else int(batch_size), dict(arrays))


def build_clients(data, seed: int, tasks: Mapping[str, TaskHandler]) -> list[Client]:
    """One :class:`Client` per block of ``data`` (a FederatedData), all with the same task table."""
    return [Client(i, cd, seed, tasks) for i, cd in enumerate(data.clients)]
