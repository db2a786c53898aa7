"""The federated boundary: clients keep their rows and send statistics only.

Algorithms 1 and 2, steps 3-4: the server broadcasts w_t; client i draws its own mini-batch
N_i^(t) of size B from its N_i rows and returns q_m(w_t, batch) for every stochastic function m.
The server combines the messages with weights N_i / (B N) (eqs. (Fs0bar)/(Fsmbar)).

Messages are plain frozen dataclasses of NumPy arrays and numbers, so they pickle and can cross a
process (``ProcessTransport``) or, later, a network transport. Server code only ever receives
messages; the client objects that hold rows live behind a :class:`Transport`.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import numpy as np

from ._kernels import axpy, scaled
from .data import ClientData
from .functions import SampleFunction, checked_value_and_grad, checked_values


# -- messages (everything that crosses the boundary) -----------------------------------------------

@dataclass(frozen=True)
class RoundRequest:
    """Server -> clients at round t: the current point w_t (d floats) and the batch size."""

    round: int
    w: np.ndarray
    batch_size: Optional[int]  # None: every row of the client (full batch)
    tau: float


@dataclass(frozen=True)
class ClientMessage:
    """Client -> server at round t: q_m for every stochastic function m, as sums over the batch.

    ``stats[m]`` is a dict of arrays named by the function's builder (:class:`Statistic`).
    ``num_rows`` is N_i and ``batch_size`` is the number of rows the sums run over.
    """

    client: int
    round: int
    num_rows: int
    batch_size: int
    stats: tuple

    def num_floats(self) -> int:
        return int(sum(np.size(v) for s in self.stats for v in s.values()))


@dataclass(frozen=True)
class EvaluationRequest:
    """Server -> clients: evaluate every stochastic function (and gradient) on all local rows."""

    w: np.ndarray
    with_grad: bool = True


@dataclass(frozen=True)
class EvaluationMessage:
    """Client -> server: sums over all N_i rows of f_m(w, x_n) (values) and of its gradient."""

    client: int
    num_rows: int
    values: np.ndarray            # (number of functions,)
    grads: Optional[np.ndarray]   # (number of functions, d) or None

    def num_floats(self) -> int:
        return int(self.values.size + (0 if self.grads is None else self.grads.size))


@dataclass(frozen=True)
class LocalSGDRequest:
    """Server -> clients for the SGD baselines: run ``steps`` local SGD steps of batch
    ``batch_size`` from ``w`` with learning rate ``lr``; ``ridge`` adds 2 ridge w to the
    gradient (an exact lambda |w|^2 term)."""

    round: int
    w: np.ndarray
    batch_size: Optional[int]
    steps: int
    lr: float
    ridge: float = 0.0


@dataclass(frozen=True)
class ModelMessage:
    """Client -> server for the SGD baselines: the local model after its steps (d floats)."""

    client: int
    num_rows: int
    w: np.ndarray

    def num_floats(self) -> int:
        return int(self.w.size)


# -- the client side ------------------------------------------------------------------------------

class Client:
    """One client: its rows, its random generator, and the functions it evaluates.

    Only :meth:`handle` is meant to be called, by a transport; it returns a message.
    """

    def __init__(self, index: int, data: ClientData, functions: Sequence[SampleFunction],
                 builders: Sequence, seed):
        self.index = index
        self._X = data.X
        self._y = data.y
        self._functions = tuple(functions)
        self._builders = tuple(builders)
        self._rng = np.random.default_rng(seed)

    @property
    def num_rows(self) -> int:
        return int(self._X.shape[0])

    def handle(self, request):
        if isinstance(request, RoundRequest):
            return self._round(request)
        if isinstance(request, EvaluationRequest):
            return self._evaluate(request)
        if isinstance(request, LocalSGDRequest):
            return self._local_sgd(request)
        raise TypeError(f"client {self.index}: unknown request {type(request).__name__}")

    def _round(self, req: RoundRequest) -> ClientMessage:
        n = self.num_rows
        if req.batch_size is None or req.batch_size == n:
            X, y, b = self._X, self._y, n
        else:
            idx = self._rng.choice(n, size=req.batch_size, replace=False)
            X, y, b = self._X[idx], (None if self._y is None else self._y[idx]), req.batch_size
        where = f"client {self.index}, round {req.round}"
        stats = []
        for fn, builder in zip(self._functions, self._builders):
            tau = builder.tau if builder.tau is not None else req.tau
            stats.append(builder.statistics(fn, req.w, X, y, tau, where))
        return ClientMessage(self.index, req.round, n, b, tuple(stats))

    def _local_sgd(self, req: LocalSGDRequest) -> ModelMessage:
        """E local SGD steps on the objective (function 0), as FedAvg's clients do."""
        n, fn = self.num_rows, self._functions[0]
        w = req.w.copy()
        for k in range(req.steps):
            if req.batch_size is None or req.batch_size == n:
                X, y = self._X, self._y
            else:
                idx = self._rng.choice(n, size=req.batch_size, replace=False)
                X, y = self._X[idx], (None if self._y is None else self._y[idx])
            where = f"client {self.index}, round {req.round}, local step {k + 1}"
            _, g = checked_value_and_grad(fn, w, X, y, where)
            w -= req.lr * (g + 2.0 * req.ridge * w)
        return ModelMessage(self.index, n, w)

    def _evaluate(self, req: EvaluationRequest) -> EvaluationMessage:
        n, d = self.num_rows, req.w.size
        where = f"client {self.index}, full-data evaluation"
        if not req.with_grad:
            vals = np.array([checked_values(f, req.w, self._X, self._y, n, where).sum()
                             for f in self._functions])
            return EvaluationMessage(self.index, n, vals, None)
        both = [checked_value_and_grad(f, req.w, self._X, self._y, where)
                for f in self._functions]
        vals = np.array([v.sum() for v, _ in both])
        grads = np.array([n * g for _, g in both]).reshape(len(self._functions), d)
        return EvaluationMessage(self.index, n, vals, grads)


# -- transports ------------------------------------------------------------------------------------

class Transport:
    """Carries one request to every client and brings their messages back, in client order.

    A transport implements ``stream``; ``exchange`` is ``list(stream(request))``. The server's
    round (:func:`ssca_solver.driver.step`) consumes ``stream``, adding messages to the averaged
    statistics as they come, so it never needs to hold more than a bounded number of them.
    """

    def stream(self, request) -> Iterator:
        """Send ``request`` to every client; yield their replies one by one, in client order."""
        raise NotImplementedError

    def exchange(self, request) -> list:
        """Send ``request`` to every client and return all replies, in client order."""
        return list(self.stream(request))

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class InProcessTransport(Transport):
    """Clients in this process, handed one read-only copy of each request's w.

    The copy is made once per request and shared by the clients: none of them can alias the
    server's arrays or change what the next client receives (a user function that writes into
    w raises a :class:`UserFunctionError` saying so). ``stream`` runs client i only when the
    server asks for message i.
    """

    def __init__(self, clients: Sequence[Client]):
        self._clients = tuple(clients)

    def stream(self, request):
        request = _read_only_request(request)
        for c in self._clients:
            yield c.handle(request)


def _read_only_request(request):
    """The request with its own read-only copy of w (the in-process broadcast)."""
    from dataclasses import replace

    w = np.array(request.w, dtype=float)
    w.flags.writeable = False
    return replace(request, w=w)


def _client_loop(conn, client: Client):
    while True:
        request = conn.recv()
        if request is None:
            break
        request.w.flags.writeable = False      # as with InProcessTransport: w is read-only
        try:
            conn.send(("ok", client.handle(request)))
        except BaseException as exc:  # the error travels to the server and is raised there
            conn.send(("error", exc))
    conn.close()


class ProcessTransport(Transport):
    """Each client in its own forked process; requests and messages cross a pipe, pickled.

    Each client computes on its own copy of its rows, in its own process; the server's process
    only receives messages. (The server process may still hold the user's ``FederatedData``;
    ``tests/test_federated.py`` overwrites those arrays with NaN after the fork and gets the same
    iterates, which shows the server never reads them.) Uses the ``fork`` start method (Linux,
    macOS), so user functions need not be picklable.
    """

    def __init__(self, clients: Sequence[Client]):
        ctx = mp.get_context("fork")
        self._conns, self._procs = [], []
        for c in clients:
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_client_loop, args=(child, c), daemon=True)
            p.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(p)

    def stream(self, request):
        for conn in self._conns:
            conn.send(request)
        pending = list(self._conns)
        try:
            while pending:
                kind, payload = pending.pop(0).recv()
                if kind == "error":
                    raise payload
                yield payload
        finally:
            # a reply left in a pipe would be read as the answer to the next request
            for conn in pending:
                with contextlib.suppress(EOFError, OSError):   # a dead client left nothing
                    conn.recv()

    def close(self):
        for conn in self._conns:
            try:
                conn.send(None)
                conn.close()
            except (OSError, BrokenPipeError):
                pass
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
        self._conns, self._procs = [], []


# -- the server side -------------------------------------------------------------------------------

def combine(messages: Sequence[ClientMessage], num_samples: int) -> tuple:
    """sum_i N_i / (B_i N) q_{m,i}: the mini-batch estimate of eqs. (Fs0bar)/(Fsmbar).

    With B_i = B for every client this is exactly the paper's weight N_i / (B N); each client's
    sums are turned into an unbiased estimate of its share N_i/N of the full average.
    """
    num_fns = len(messages[0].stats)
    out = []
    for m in range(num_fns):
        acc = {}
        for msg in messages:
            wgt = msg.num_rows / (msg.batch_size * num_samples)
            for k, v in msg.stats[m].items():
                if k in acc:
                    axpy(wgt, v, acc[k])
                else:
                    acc[k] = scaled(wgt, v)
        out.append(acc)
    return tuple(out)
