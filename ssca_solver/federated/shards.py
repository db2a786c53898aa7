"""Clients in shards: a worker answers for many clients with one reply.

With thousands of clients, per-client work dominates a round: one Python call per client and
function, one message per client, one check and one addition per reply on the server. The
simulators that serve thousands of clients (pfl-research, FedML's Parrot, FLUTE) run many
virtual clients per worker and send one reduced message per worker; so does this module.

A :class:`Shard` holds consecutive clients and their rows once: a view of the rows when the
clients' arrays are consecutive blocks of one array (as :meth:`FederatedData.split` and
``dirichlet`` make them), else one concatenation. For a request whose replies the server
reads only through their weighted sum sum_i a_i x_i, a_i = h_i N_i / (B_i N)
(:func:`~.messages.aggregation_weight`; the methods that declare
``supports_secure_aggregation``), the shard answers with one reply holding
N sum_{i in shard} a_i x_i (``client == AGGREGATE``, num_rows = batch_size = N: the usual
weight then gives back the sum, as for secure aggregation's one reply):

* **pooled** where the task allows it (its ``pooling(request)`` gives a :class:`Pooling`):
  each client's batch is drawn exactly as on its own (:meth:`Client.batch`: the same rows, a
  pure function of seed, client and round), the clients with equal weights
  c_i = h_i N_i / B_i are pooled and the task's ``row_sums`` evaluates each pool once (one
  call of the user's functions per distinct weight: one per shard on full batches without
  partial participation), and the shard sends sum_pools c x_pool. A task's arrays must be
  sums over rows for this (the proximal-linear statistics, a Hessian's sum, the full-data
  values and gradients), and the result equals the sum of the clients' own replies up to
  rounding (the order of the additions);
* **one by one** otherwise (the noise numbers of a sampled round, a custom surrogate
  builder, another method's local steps): each client's task runs on its own, with
  ``config["summed"]`` set so that it may send pre-combined numbers
  (:func:`~.messages.summed`), its reply is checked here
  (:class:`~.replies.ReplyCheck`, the server's checks, per worker) and added in.

A pooled evaluation that raises is repeated one client at a time, which names the client at
fault (and with ``on_client_failure="drop"`` leaves out that client alone). Tasks whose
handler sets ``per_client = True`` (method "ssca"'s probe, whose gradient check the server
reads client by client) are answered client by client, as by :class:`InProcessTransport`.

Trust: the server sees one sum per shard, not the clients' replies; the worker that hosts a
shard sees its clients' rows and replies (it is their host), so a shard is one trust domain
(docs/running.md, "Many clients").
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator, NamedTuple, Optional, Sequence

import numpy as np

from ..errors import ClientError
from ..model.data import ClientData
from .client import Client
from .messages import (AGGREGATE, FACTOR, SECAGG, SUMMED, Dropout, Reply, Request,
                       aggregation_weight, describe_error)
from .replies import STAND_IN, ReplyCheck
from .transport import InProcessTransport, participant_order


#: The most floats of X one pooled call of a function reads (2^19: 4 MiB, about 17,000 rows
#: of 30 features): a function's temporaries over that many rows (margins, activations) stay
#: in the processor's caches, and a call over more rows ran slower per row, not faster
#: (benchmarks/many_clients.py). The pieces' sums add up to the pool's.
POOL_FLOATS = 2 ** 19


class Pooling(NamedTuple):
    """How a task's batch is drawn when a shard pools its clients' rows: each client's rows
    are ``Client.batch(request.round, batch_size, draw)`` (None: every row)."""

    batch_size: Optional[int]
    draw: int = 0


class ShardAnswer(NamedTuple):
    """A shard's answer to one request: ``reply`` (the weighted sum of the replies of
    ``answered``, or None when none answered) and the ``dropouts`` of its other clients."""

    shard: int
    reply: Optional[Reply]
    answered: list
    dropouts: list


def shard_bounds(num_clients: int, shards: int) -> list[tuple[int, int]]:
    """The clients [lo, hi) of each of ``shards`` shards of consecutive clients, as equal in
    number as they can be."""
    shards = max(1, min(int(shards), int(num_clients)))
    edges = np.linspace(0, num_clients, shards + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def stack_rows(arrays: Sequence[Optional[np.ndarray]]) -> Optional[np.ndarray]:
    """The arrays one after the other along their first axis: a view when they are
    consecutive blocks of one C-contiguous array (no copy), else one concatenation."""
    if arrays[0] is None:
        return None
    first = arrays[0]
    base = first.base if first.base is not None else first
    if (isinstance(base, np.ndarray) and base.flags.c_contiguous and base.ndim == first.ndim
            and all(a.base is base or a is base for a in arrays)
            and all(a.flags.c_contiguous and a.dtype == base.dtype for a in arrays)):
        row = base.strides[0] if base.ndim else 0
        start = base.__array_interface__["data"][0]
        at = first.__array_interface__["data"][0]
        ok = row > 0 and (at - start) % row == 0
        for a in arrays:
            if a.__array_interface__["data"][0] != at or a.shape[1:] != base.shape[1:]:
                ok = False
                break
            at += a.shape[0] * row
        if ok:
            lo = (first.__array_interface__["data"][0] - start) // row
            hi = lo + sum(a.shape[0] for a in arrays)
            view = base[lo:hi]
            view.flags.writeable = False
            return view
    return np.concatenate(arrays, axis=0)


class Shard:
    """Consecutive clients held by one worker, and their rows once (module docstring).

    Args:
      index: the shard's number k.
      clients: its clients (consecutive indices).
      num_samples: N, the rows of every client of the run (the weights' denominator).
    """

    def __init__(self, index: int, clients: Sequence[Client], num_samples: int):
        self.index = int(index)
        self.clients = {c.index: c for c in clients}
        self.num_samples = int(num_samples)
        sizes = [c.num_rows for c in clients]
        self.X = stack_rows([c.X for c in clients])
        self.y = stack_rows([c.y for c in clients])
        self.first = min(self.clients)
        if list(self.clients) != list(range(self.first, self.first + len(sizes))):
            raise ValueError("a shard holds consecutive clients, in index order")
        #: N_i and the first row of each client in the shard's rows
        self.sizes = np.array(sizes, dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.check = ReplyCheck(sizes, first=self.first)

    def __getstate__(self):
        # the rows once (the shard's block), not again in every client's view of it
        state = self.__dict__.copy()
        state["clients"] = [(c.index, c.seed, c.tasks) for c in self.clients.values()]
        return state

    def __setstate__(self, state):
        specs = state.pop("clients")
        self.__dict__.update(state)
        self.clients = {}
        for (i, seed, tasks), a, n in zip(specs, self.starts.tolist(), self.sizes.tolist()):
            rows = ClientData(self.X[a:a + n], None if self.y is None else self.y[a:a + n])
            self.clients[i] = Client(i, rows, seed, tasks)

    @property
    def members(self) -> list[int]:
        return list(self.clients)

    def describe(self) -> str:
        return f"shard {self.index} (clients {self.span()})"

    def span(self) -> str:
        """"first..last": the shard's clients, as a ClientError names them."""
        return f"{self.first}..{self.first + len(self.sizes) - 1}"

    def each(self, request: Request, members: Sequence[int], tolerate: bool = False) -> list:
        """The clients' own replies to ``request`` (read-only already), in ``members``'
        order; with ``tolerate`` a client that fails is a Dropout, else its exception
        propagates."""
        out = []
        for i in members:
            try:
                out.append(self.clients[i].handle(request))
            except Exception as exc:       # Ctrl-C and the like are not a client's failure
                if not tolerate:
                    raise
                out.append(Dropout(i, request.task, request.round, describe_error(exc)))
        return out

    def handler(self, task: str):
        """The handler of ``task`` (every client of a run has the same task table)."""
        return next(iter(self.clients.values())).tasks.get(task)

    # -- answering --------------------------------------------------------------------------------
    def answer(self, request: Request, members: Sequence[int], factors: Sequence[float],
               tolerate: bool = False) -> ShardAnswer:
        """The weighted sum of the replies of ``members`` (h_i = ``factors``) to ``request``
        (read-only already); with ``tolerate`` a client that fails is a Dropout, else its
        exception propagates."""
        handler = self.handler(request.task)
        if handler is None:
            next(iter(self.clients.values())).handle(request)       # its error, unchanged
        marked = replace(request, config={**request.config, SUMMED: True,
                                          "num_samples": self.num_samples})
        plan = getattr(handler, "pooling", None)
        plan = plan(marked) if plan is not None else None
        arrays = None
        if plan is not None:
            try:
                arrays = self._pooled(handler, plan, marked, members, factors)
            except Exception:
                arrays = None    # whose failure: the clients one by one tell (that one alone)
        if arrays is not None:
            return ShardAnswer(self.index, self._reply(request, arrays), list(members), [])
        return self._one_by_one(request, marked, members, factors, tolerate)

    def _reply(self, request: Request, arrays: dict) -> Reply:
        N = self.num_samples
        return Reply(AGGREGATE, request.task, request.round, N, N, arrays)

    def _pooled(self, handler, plan: Pooling, request: Request, members, factors) -> dict:
        """sum over pools of c x_pool (module docstring)."""
        members = np.asarray(members, dtype=np.int64)
        h = np.asarray(factors, dtype=float)
        n = self.sizes[members - self.first]
        at = self.starts[members - self.first]
        b = plan.batch_size
        if b is None or b >= n.max():
            c = h                       # full batches: c_i = h_i N_i / N_i
            parts = None
        else:
            # each client's rows drawn as Client.batch draws them
            c = h * n / np.minimum(n, b)
            parts = [np.arange(a, a + k) if b >= k else
                     a + self.clients[int(i)].rng(request.round, plan.draw).choice(
                         k, size=b, replace=False)
                     for i, a, k in zip(members.tolist(), at.tolist(), n.tolist())]
        if np.all(c == c[0]):           # one pool (full batches, every h_i alike)
            pools = [(float(c[0]), np.arange(c.size))]
        else:
            values, pool = np.unique(c, return_inverse=True)
            pools = [(v, np.flatnonzero(pool == g)) for g, v in enumerate(values.tolist())]
        total: dict = {}
        for weight, pick in pools:
            if parts is not None:
                index = np.concatenate([parts[k] for k in pick.tolist()])
            elif pick.size == 1 or np.all(at[pick[1:]] == at[pick[:-1]] + n[pick[:-1]]):
                index = slice(int(at[pick[0]]), int(at[pick[-1]] + n[pick[-1]]))
            else:                       # the pool's clients' blocks, one index array
                lens = n[pick]
                index = (np.repeat(at[pick] - np.cumsum(lens) + lens, lens)
                         + np.arange(int(lens.sum())))
            where = (f"{self.describe()}, {pick.size} clients pooled, "
                     + ("full-data evaluation" if request.task == "evaluate"
                        else f"round {request.round}"))
            for chunk in self._chunks(index):
                X = self.X[chunk]
                y = None if self.y is None else self.y[chunk]
                arrays = handler.row_sums(request, X, y, where)
                if any(k in STAND_IN for k in arrays):
                    return {k: np.ones(1) for k in arrays if k in STAND_IN}
                for k, v in arrays.items():
                    v = weight * np.asarray(v, dtype=float)
                    total[k] = v if k not in total else total[k] + v
        return total

    def _chunks(self, index):
        """``index`` (a slice or an index array of rows) in pieces of at most
        :data:`POOL_FLOATS` floats of X each."""
        per_row = max(1, int(np.prod(self.X.shape[1:], dtype=np.int64)))
        step = max(1, POOL_FLOATS // per_row)
        if isinstance(index, slice):
            lo, hi = index.start, index.stop
            return [slice(a, min(a + step, hi)) for a in range(lo, hi, step)]
        return [index[a:a + step] for a in range(0, index.size, step)]

    def _one_by_one(self, request: Request, marked: Request, members, factors,
                    tolerate: bool) -> ShardAnswer:
        """Each client's handler on its own, its reply checked here and added in as it comes
        (with ``tolerate`` the replies are held until all arrived: a reply whose shapes
        differ from the others' is then left out as a dropout, as the server does)."""
        N = self.num_samples
        check = self.check.start(marked, members)
        sums: dict = {}
        stand_in: set = set()
        answered, held, dropouts = [], [], []

        def add(h, reply):
            if any(k in STAND_IN for k in reply.arrays):
                stand_in.update(k for k in reply.arrays if k in STAND_IN)
                return
            a = N * aggregation_weight(reply, N, factor=h)
            for k, v in reply.arrays.items():
                v = a * np.asarray(v, dtype=float)
                sums[k] = v if k not in sums else sums[k] + v

        for i, h in zip(members, factors):
            ask = replace(marked, config={**marked.config, FACTOR: float(h)})
            try:
                reply = self.clients[i].handle(ask)
                check.check(reply, i)
            except Exception as exc:       # Ctrl-C and the like are not a client's failure
                if not tolerate:
                    raise
                dropouts.append(Dropout(i, request.task, request.round, describe_error(exc)))
                continue
            if tolerate:
                held.append((float(h), reply))
                continue
            odd = check.note(reply)
            if odd is not None:
                raise check.shape_error(odd)
            add(float(h), reply)
            answered.append(i)
            del reply
        if tolerate:
            good, bad = check.screen([r for _, r in held])
            keep = {r.client for r in good}
            dropouts += [Dropout(e.client, request.task, request.round,
                                 f"ReplyError: {e.cause}") for e in bad]
            for h, reply in held:
                if reply.client in keep:
                    add(h, reply)
                    answered.append(reply.client)
            held.clear()
        if not answered:
            return ShardAnswer(self.index, None, [], dropouts)
        check.done()
        arrays = {k: np.ones(1) for k in stand_in} if stand_in else sums
        return ShardAnswer(self.index, self._reply(request, arrays), answered, dropouts)


#: Request config of a request to a shard's worker: "sum" (one ShardAnswer) or "each" (the
#: clients' own replies, a list in the participants' order)
SHARD_MODE = "shard:mode"
#: Request config: the worker turns its clients' failures into Dropouts
SHARD_TOLERATE = "shard:tolerate"
#: Request arrays: the participants (client indices) and their factors h_i; absent: every
#: client of the shard, h = 1
SHARD_PARTICIPANTS, SHARD_FACTORS = "shard:participants", "shard:factors"


#: Arrays of a shard's masked reply beside "masked" and "layout": the clients that answered
#: (int64) and the dropouts of the others (JSON text, [[client, error], ...])
SHARD_ANSWERED, SHARD_DROPPED = "shard:answered", "shard:dropped"
#: the protocol steps of secure aggregation (:mod:`.secagg`), and the masked step's arrays
#: that are the protocol's, not the task's
SECAGG_STEPS = ("secagg.keys", "secagg.shares", "secagg.unmask")
MASK_ARRAYS = ("ids", "cipher", "factor")


class ShardWorker:
    """A shard as a transport's client: ``handle(request)`` answers the shard's part of a
    request to the shards (:data:`SHARD_MODE` and friends in its config and arrays), so any
    transport that carries clients' requests (this process, forked processes, Ray actors)
    carries shards. ``index`` is the shard's number."""

    def __init__(self, shard: Shard):
        self.shard = shard
        self.index = shard.index

    @property
    def num_rows(self) -> int:
        return int(self.shard.sizes.sum())

    def reply(self, request: Request, arrays, batch_size: Optional[int] = None) -> Reply:
        """A reply of this worker itself (secure aggregation's protocol steps)."""
        n = self.num_rows
        return Reply(self.index, request.task, request.round, n,
                     n if batch_size is None else int(batch_size), dict(arrays))

    def handle(self, request: Request):
        if request.task in SECAGG_STEPS:             # secure aggregation between the shards
            from . import secagg

            return {secagg.KEYS: secagg.keys_task, secagg.SHARES: secagg.shares_task,
                    secagg.UNMASK: secagg.unmask_task}[request.task](self, request)
        if SECAGG in request.config:
            return self._masked(request)
        return self._answer(request)

    def _answer(self, request: Request):
        config, arrays = dict(request.config), dict(request.arrays)
        mode = config.pop(SHARD_MODE)
        tolerate = bool(config.pop(SHARD_TOLERATE, False))
        p, f = arrays.pop(SHARD_PARTICIPANTS, None), arrays.pop(SHARD_FACTORS, None)
        inner = replace(request, config=config, arrays=arrays)
        shard = self.shard
        if p is None:
            members, factors = shard.members, np.ones(len(shard.sizes))
        else:
            p = np.asarray(p, dtype=np.int64)
            mine = np.flatnonzero((p >= shard.first) & (p < shard.first + len(shard.sizes)))
            members = p[mine].tolist()
            factors = (np.ones(mine.size) if f is None
                       else np.asarray(f, dtype=float)[mine])
        if mode == "sum":
            return shard.answer(inner, members, factors, tolerate)
        return shard.each(inner, members, tolerate)

    def _masked(self, request: Request) -> Reply:
        """The masked step of a secure aggregation between the shards: the shard's sum
        N sum_i a_i x_i over its participants (the request's SHARD_PARTICIPANTS and
        SHARD_FACTORS), weighted, encoded and masked by :class:`~.secagg.MaskedTask` as one
        participant's reply (factor 1), with the clients who answered (``SHARD_ANSWERED``)
        and the dropouts of the others (``SHARD_DROPPED``, JSON text) beside it: who
        answered is what secure aggregation tells the server anyway."""
        import json

        from .secagg import MaskedTask, _text

        found = {}

        def summed_here(worker, req):
            # the task's own config stays (under SECAGG its tasks act as under secure
            # aggregation: a point where a function is not finite raises, for one)
            arrays = {k: v for k, v in req.arrays.items() if k not in MASK_ARRAYS}
            got = worker._answer(replace(req, config={**req.config, SHARD_MODE: "sum"},
                                         arrays=arrays))
            found["answer"] = got
            if got.reply is None:
                raise RuntimeError(f"{worker.shard.describe()}: none of its clients answered ("
                                   + "; ".join(f"client {d.client}: {d.error}"
                                               for d in got.dropouts[:3]) + ")")
            return replace(got.reply, client=worker.index)

        reply = MaskedTask(summed_here)(self, request)
        got = found.get("answer")
        if got is None or "masked" not in reply.arrays:
            return reply
        arrays = dict(reply.arrays)
        arrays[SHARD_ANSWERED] = np.asarray(got.answered, dtype=np.int64)
        arrays[SHARD_DROPPED] = _text(json.dumps([[d.client, d.error] for d in got.dropouts]))
        return replace(reply, arrays=arrays)


class ShardedTransport(InProcessTransport):
    """Clients in ``shards`` shards (module docstring): the server gets one reply per shard
    for the tasks it reads only through their weighted sum (:meth:`aggregate`), and the
    clients' own replies for the others (``stream``).

    Args:
      clients: every client, in index order.
      shards: the number of shards (at most the number of clients).
      carrier: None (the shards answer in this process), or ``carrier(workers) ->
        Transport``: a transport whose clients are the shards' :class:`ShardWorker` s (the
        process transport: one forked process per shard; Ray: one actor per shard). A
        worker that fails (its process died, it did not answer in time) fails for its
        clients: each is a Dropout with ``tolerate_failures``, else a ClientError names the
        shard's clients.
    """

    #: the gatherer asks :meth:`aggregate` for the tasks :meth:`sums` names
    sharded = True

    def __init__(self, clients: Sequence[Client], shards: int, carrier=None):
        super().__init__(clients)
        N = sum(c.num_rows for c in self._clients)
        self.shards = [Shard(k, self._clients[lo:hi], N)
                       for k, (lo, hi) in enumerate(shard_bounds(self.num_clients, shards))]
        self.shard_of = np.concatenate([np.full(len(s.clients), s.index) for s in self.shards])
        self.workers = [ShardWorker(s) for s in self.shards]
        self.carrier = None if carrier is None else carrier(self.workers)

    @property
    def timeout(self):
        """The carrier's ``client_timeout`` (per shard's answer); None in this process."""
        return None if self.carrier is None else getattr(self.carrier, "timeout", None)

    @timeout.setter
    def timeout(self, value) -> None:
        if self.carrier is not None and hasattr(self.carrier, "timeout"):
            self.carrier.timeout = value

    def sums(self, task: str) -> bool:
        """Whether the shards answer ``task`` with one summed reply each (not for a task
        whose handler sets ``per_client``)."""
        handler = self.shards[0].handler(task)
        return handler is not None and not getattr(handler, "per_client", False)

    def _order(self, participants) -> np.ndarray:
        if participants is None:
            return np.arange(self.num_clients)
        order = np.asarray(participants)
        if (order.ndim != 1 or order.dtype.kind not in "iu"
                or np.unique(order).size != order.size
                or (order.size and not 0 <= order.min() <= order.max() < self.num_clients)):
            participant_order(list(participants), self.num_clients)   # its error
            raise ValueError(f"participants must be distinct client indices, got "
                             f"{participants!r}")
        return order

    def shards_holding(self, participants) -> list[int]:
        """The shards that hold a participant (None: every client), in shard order."""
        return np.unique(self.shard_of[self._order(participants)]).tolist()

    def shard_request(self, clients, participants, factors, mode: str = "sum",
                      tolerate: bool = False) -> tuple[dict, dict]:
        """(config, arrays) that tell the workers what to answer: ``mode``, ``tolerate``
        and, unless every client takes part with factor 1, the participants and their
        factors."""
        arrays = {}
        if participants is not None:
            arrays[SHARD_PARTICIPANTS] = self._order(participants).astype(np.int64)
        if factors is not None:
            arrays[SHARD_FACTORS] = np.asarray(factors, dtype=float)
        return {SHARD_MODE: mode, SHARD_TOLERATE: bool(tolerate)}, arrays

    def worker_stream(self, request: Request, shards: Sequence[int], tolerate: bool = False):
        """The workers of ``shards`` answering ``request`` themselves, in that order: their
        answers, or (``tolerate``) a Dropout of shard k for a worker that failed; without
        ``tolerate`` a worker's failure raises (a ClientError names its clients)."""
        request = request.read_only()
        if self.carrier is None:
            for k in shards:
                try:
                    yield self.workers[k].handle(request)
                except Exception as exc:   # Ctrl-C and the like are not a worker's failure
                    if not tolerate:
                        raise
                    yield Dropout(k, request.task, request.round, describe_error(exc))
            return
        try:
            yield from self.carrier.stream(request, list(shards), tolerate)
        except ClientError as exc:
            if type(exc) is not ClientError or not isinstance(exc.client, int) \
                    or exc.client not in shards:
                raise
            raise ClientError(self.shards[exc.client].span(), exc.round,
                              f"the worker of shard {exc.client} failed: {exc.cause}",
                              exc.remote_traceback) from exc

    def take_members(self, reply: Reply, answered: list, dropped: list) -> Reply:
        """A shard's masked reply without its list of the clients who answered and its
        dropouts, which go to ``answered`` ((shard, client) pairs) and ``dropped`` ((shard,
        Dropout) pairs)."""
        import json

        from .secagg import _untext

        arrays = dict(reply.arrays)
        k = reply.client
        got = arrays.pop(SHARD_ANSWERED, None)
        text = arrays.pop(SHARD_DROPPED, None)
        if got is not None:
            answered.extend((k, int(i)) for i in np.asarray(got).ravel())
        if text is not None:
            dropped.extend((k, Dropout(int(i), reply.task, reply.round, str(e)))
                           for i, e in json.loads(_untext(text)))
        return replace(reply, arrays=arrays)

    def _ask(self, request: Request, mode: str, participants, factors,
             tolerate: bool) -> Iterator[tuple]:
        """(shard, its worker's answer or a Dropout of the worker) for every shard that
        holds a participant, in shard order."""
        ks = self.shards_holding(participants)
        config, arrays = self.shard_request(None, participants, factors, mode, tolerate)
        asked = replace(request, config={**request.config, **config},
                        arrays={**request.arrays, **arrays})
        yield from zip(ks, self.worker_stream(asked, ks, tolerate))

    def member_dropouts(self, k: int, request: Request, order: np.ndarray,
                        error: str) -> list:
        """A Dropout for each participant (``order``) of shard k, whose worker failed."""
        mine = order[self.shard_of[order] == k].tolist()
        return [Dropout(i, request.task, request.round,
                        f"its shard's worker failed (shard {k}): {error}") for i in mine]

    def aggregate(self, request: Request, participants: Optional[Sequence[int]] = None,
                  factors: Optional[Sequence[float]] = None,
                  tolerate_failures: bool = False) -> Iterator[ShardAnswer]:
        """One :class:`ShardAnswer` per shard that holds a participant (None: every client),
        in shard order; ``factors``: h_i of the participants (None: 1)."""
        for k, got in self._ask(request, "sum", participants, factors, tolerate_failures):
            if isinstance(got, Dropout):
                got = ShardAnswer(k, None, [], self.member_dropouts(
                    k, request, self._order(participants), got.error))
            yield got

    def stream(self, request, participants=None, tolerate_failures=False):
        if self.carrier is None:
            yield from super().stream(request, participants, tolerate_failures)
            return
        order = self._order(participants)
        got = {}
        for k, answer in self._ask(request, "each", participants, None, tolerate_failures):
            if isinstance(answer, Dropout):
                answer = self.member_dropouts(k, request, order, answer.error)
            for item in answer:
                got[item.client] = item
        for i in order.tolist():
            yield got[i]

    def close(self) -> None:
        if self.carrier is not None:
            self.carrier.close()
