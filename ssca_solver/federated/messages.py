"""What crosses the federated line: a request down, a reply up. Both are plain data.

A :class:`Request` names a *task* (a string an algorithm registered, e.g. ``"ssca.round"``), the
round, the point w_t and a few scalar settings; a :class:`Reply` carries named arrays (sums over
the client's batch) and the counts the server needs to weight them. Nothing else crosses, so the
same messages travel through a pipe, over a network framework, or through secure aggregation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Optional, Union

import numpy as np

Scalar = Union[int, float, str, bool, None]


@dataclass(frozen=True)
class Request:
    """Server -> every client: run ``task`` at ``round`` on the point ``w`` (d floats).

    Attributes:
      task: the name of a task registered by the algorithm (or the runner's ``"evaluate"``).
      round: t, the round being run (0 for evaluations outside the rounds).
      w: the point w_t, shape (d,). Clients receive it read-only.
      config: scalar settings of the task (batch size, step size, ...), plain Python scalars.
    """

    task: str
    round: int
    w: np.ndarray
    config: Mapping[str, Scalar] = field(default_factory=dict)

    def num_floats(self) -> int:
        """Floats sent down to one client: w (the few scalars of ``config`` are not counted)."""
        return int(np.size(self.w))

    def read_only(self) -> "Request":
        """The request with its own read-only copy of w (one broadcast copy for all clients)."""
        w = np.array(self.w, dtype=float)
        w.flags.writeable = False
        return replace(self, w=w)


@dataclass(frozen=True)
class Reply:
    """Client -> server: the answer of client ``client`` to one request.

    Attributes:
      client: the client's index i.
      task, round: those of the request answered.
      num_rows: N_i, the rows the client holds.
      batch_size: the rows the sums in ``arrays`` run over (N_i for a full batch).
      arrays: named arrays; what they mean is the task's business.
    """

    client: int
    task: str
    round: int
    num_rows: int
    batch_size: int
    arrays: Mapping[str, np.ndarray]

    def num_floats(self) -> int:
        """Floats sent up: the total size of ``arrays``."""
        return int(sum(np.size(v) for v in self.arrays.values()))


def array(reply: Reply, name: str) -> np.ndarray:
    """``reply.arrays[name]`` with an error naming the client and task when it is missing."""
    try:
        return reply.arrays[name]
    except KeyError:
        raise ValueError(f"client {reply.client}: the reply to task {reply.task!r} has no array "
                         f"{name!r} (it has {sorted(reply.arrays)})") from None


def optional_int(value: Optional[Scalar]) -> Optional[int]:
    """A batch-size setting as sent in ``Request.config``: None (full batch) or an int."""
    return None if value is None else int(value)
