"""What crosses the federated line: a request down, a reply up. Both are plain data.

A :class:`Request` names a *task* (a string an algorithm registered, e.g. ``"ssca.round"``), the
round, the point w_t, a few scalar settings and optional extra arrays; a :class:`Reply` carries
named arrays (sums over the client's batch) and the counts the server needs to weight them. A
transport asked to tolerate failures yields a :class:`Dropout` in place of the reply of a client
that raised, died or timed out. Nothing else crosses, so the same messages travel through a
pipe, over a network framework, or through secure aggregation (whose key advertisements, masked
sums and recovery shares are ordinary requests and replies, :mod:`ssca_solver.federated.secagg`).
"""

from __future__ import annotations

import traceback
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
      arrays: extra named arrays sent down with w (e.g. the participants' public keys of
        secure aggregation); empty for the algorithms' own tasks. Plain NumPy arrays of any
        numeric dtype.
    """

    task: str
    round: int
    w: np.ndarray
    config: Mapping[str, Scalar] = field(default_factory=dict)
    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)

    def num_floats(self) -> int:
        """8-byte words sent down to one client: w and ``arrays`` (see :func:`words`; the few
        scalars of ``config`` are not counted)."""
        return int(np.size(self.w)) + sum(words(v) for v in self.arrays.values())

    def read_only(self) -> "Request":
        """The request with its own read-only copies of w and ``arrays`` (one broadcast copy
        for all clients)."""
        w = np.array(self.w, dtype=float)
        w.flags.writeable = False
        arrays = {}
        for k, v in self.arrays.items():
            a = np.array(v)
            a.flags.writeable = False
            arrays[k] = a
        return replace(self, w=w, arrays=arrays)


@dataclass(frozen=True)
class Reply:
    """Client -> server: the answer of client ``client`` to one request.

    Attributes:
      client: the client's index i.
      task, round: those of the request answered.
      num_rows: N_i, the rows the client holds.
      batch_size: the rows the sums in ``arrays`` run over (N_i for a full batch).
      arrays: named arrays; what they mean is the task's business. Float arrays as a rule;
        secure aggregation's masked fixed-point sums are uint64, its keys and shares uint8.
      weight: a factor the *server* applies on top of the reply's usual weight
        N_i / (B_i N) (the inverse inclusion probability of partial participation times the
        renormalisation over the clients who answered; 1 when every client takes part).
        Clients never set it.
    """

    client: int
    task: str
    round: int
    num_rows: int
    batch_size: int
    arrays: Mapping[str, np.ndarray]
    weight: float = 1.0

    def num_floats(self) -> int:
        """8-byte words sent up: the total size of ``arrays`` (see :func:`words`)."""
        return int(sum(words(v) for v in self.arrays.values()))


#: The ``client`` of a reply that is the secure sum of several clients' replies.
AGGREGATE = -1


@dataclass(frozen=True)
class Dropout:
    """In place of a reply: client ``client`` did not answer ``task`` at ``round``.

    Yielded by a transport's ``stream(..., tolerate_failures=True)`` for a client that raised,
    whose process died or that did not answer within its timeout; the transport stays usable.

    Attributes:
      client: the client's index i.
      task, round: those of the request not answered.
      error: what happened: the exception's type name and message, or the transport's words.
    """

    client: int
    task: str
    round: int
    error: str


def words(value) -> int:
    """The size of an array in 8-byte words: its number of elements, except byte arrays
    (uint8/int8/bool, e.g. keys and encrypted shares), counted as ceil(bytes / 8)."""
    a = np.asarray(value)
    if a.dtype.itemsize == 1:
        return -(-a.nbytes // 8)
    return int(a.size)


#: The request-config key naming the secure aggregation a masked request belongs to
#: (:mod:`ssca_solver.federated.secagg`).
SECAGG = "secagg"


def aggregation_weight(reply: Reply, num_samples: float, factor: Optional[float] = None) -> float:
    """The one formula every server (and secure aggregation's clients) combines replies with:
    a_i = h_i N_i / (B_i N), so that sum_i a_i x_i of per-row sums x_i is the data-weighted
    mean of eqs. (Fs0bar)/(Fsmbar). h_i = ``factor`` (default ``reply.weight``: partial
    participation's Horvitz-Thompson factor times the renormalisation after dropouts, 1 by
    default), N_i = ``reply.num_rows``, B_i = ``reply.batch_size`` (1 for a reply that is not a
    sum over rows, such as a model, which then counts N_i / N), N = ``num_samples``. Secure
    aggregation's one reply holds N sum_i a_i x_i with N_i = B_i = N, so this formula gives
    back the sum (:mod:`ssca_solver.federated.secagg`)."""
    h = reply.weight if factor is None else factor
    return h * reply.num_rows / (reply.batch_size * num_samples)


#: The request-config key of a request whose replies a shard weights and sums before they
#: leave its worker (:mod:`ssca_solver.federated.shards`); with it, ``"num_samples"`` (N)
#: and :data:`FACTOR`.
SUMMED = "summed"
#: The request-config key of h_i, the client's own factor, in a :data:`SUMMED` request.
FACTOR = "factor"
#: The request-config key naming the request's arrays (comma-separated) that choose what a
#: reply carries, e.g. the functions whose curvature a round asks for: requests that differ
#: in them ask for different arrays (:func:`~ssca_solver.federated.replies.request_kind`).
SELECTS = "selects"


def secagg_active(request: Request) -> bool:
    """Whether ``request`` is the masked step of a secure aggregation (its reply will be
    weighted by the client, masked and summed: a task may then send pre-combined numbers)."""
    return SECAGG in request.config


def summed(request: Request) -> bool:
    """Whether the reply to ``request`` is weighted by a_i = h_i N_i / (B_i N) and summed with
    other clients' replies before the server sees it (secure aggregation's masked step, or a
    shard's sum, :mod:`ssca_solver.federated.shards`): a task may then send numbers
    pre-combined so that the weighted sum is what the server needs (e.g. a variance share,
    which is not linear in the client's statistics). ``config["num_samples"]`` is N then."""
    return SECAGG in request.config or SUMMED in request.config


def own_factor(client, request: Request) -> float:
    """h_i, client i's factor (partial participation) in a summed request; 1 otherwise."""
    if FACTOR in request.config:
        return float(request.config[FACTOR])
    if SECAGG not in request.config:
        return 1.0
    ids = [int(i) for i in np.asarray(request.arrays["ids"]).ravel()]
    return float(np.asarray(request.arrays["factor"])[ids.index(client.index)])


def describe_error(exc: BaseException) -> str:
    """``"TypeName: message"`` of an exception, for a :class:`Dropout`."""
    try:
        text = str(exc)
    except Exception:
        text = "<str() failed>"
    return f"{type(exc).__name__}: {text}"


def exception_parts(exc: BaseException) -> tuple[str, str, str]:
    """(qualified type name, message, traceback text) of the exception being handled, as a
    client sends its own failure to the server (a message whose ``str()`` raises is named as
    such rather than lost)."""
    name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    try:
        text = str(exc)
    except Exception:
        text = f"<str() of the {type(exc).__name__} failed>"
    return name, text, traceback.format_exc()


def array(reply: Reply, name: str) -> np.ndarray:
    """``reply.arrays[name]``; a missing one is the client's fault: a
    :class:`~ssca_solver.errors.ReplyError` (kind "layout") naming the client, round, task and
    array (the first request of a task answered by one client has no other reply to compare
    its layout with, :mod:`.replies`)."""
    try:
        return reply.arrays[name]
    except KeyError:
        from ..errors import ReplyError

        raise ReplyError(reply.client, "evaluation" if reply.task == "evaluate" else reply.round,
                         f"its reply to task {reply.task!r} has no array {name!r} (it has "
                         f"{sorted(reply.arrays)})", kind="layout", array=name) from None


def optional_int(value: Optional[Scalar]) -> Optional[int]:
    """A batch-size setting as sent in ``Request.config``: None (full batch) or an int."""
    return None if value is None else int(value)
