"""How the server collects the replies to one request: who takes part, what a failure does,
whether the replies are summed securely, and what crossed the line.

:class:`Gatherer` sits between the runner and a transport. For a request it yields the replies
the algorithm (or the evaluator) combines, each with its server-side factor ``Reply.weight``:

* every client, failures raise (the default): the transport's stream as it is (weight 1);
* K sampled clients (:mod:`.sampling`): weight h_i, the Horvitz-Thompson factor;
* ``on_client_failure="drop"``: clients that fail yield :class:`Dropout` (recorded; in a
  full-data evaluation a failed client is asked once more first); the weights of those who
  answered are multiplied by
  s = sum_{i sampled} h_i N_i / sum_{i answered} h_i N_i, so the data they stand for adds up
  to the same total (s = N / N_answered without sampling); a request that no client answered
  raises :class:`~ssca_solver.errors.RoundFailedError`;
* secure aggregation (:mod:`.secagg`): one reply, ``client == AGGREGATE``, whose arrays are the
  weighted sum computed under masks (weight s).

Without secure aggregation every reply is checked as it arrives (:mod:`.replies`: the client,
task and round it answers, its row counts, real finite arrays, shapes that agree with the
other clients', and the one reply of a request with the arrays of earlier requests of its
kind): a malformed one raises :class:`~ssca_solver.errors.ReplyError` (a
ClientError naming the client), or with ``on_client_failure="drop"`` is a Dropout like any
failure.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator, Optional, Sequence

import numpy as np

from ..errors import ReplyError, RoundFailedError
from .messages import Dropout, Reply, Request
from .replies import ReplyCheck, shard_layout, where


#: When the iterates diverge at a round, a client whose reply to that round holds a number
#: larger than OUTLIER_FACTOR times the largest in every other client's reply is named in the
#: DivergenceError (:meth:`Gatherer.outlier`): a corrupted or buggy reply of finite but absurd
#: numbers (1e300) is no malformed reply, and nothing refuses it, but the error should not
#: blame the solver's steps for it
OUTLIER_FACTOR = 1e6

#: With on_client_failure="drop", a client that timed out k times in a row sits out the next
#: min(2^(k-1), SKIP_MAX) rounds (:meth:`Gatherer.collect`)
SKIP_MAX = 32
#: what every transport's timeout dropout says (``ClientTimeout.describe``)
TIMEOUT_MARK = "client_timeout"


class Gatherer:
    """Collects replies through ``transport`` (see the module docstring).

    Args:
      transport: the :class:`~ssca_solver.federated.Transport`.
      sizes: N_i of every client.
      drop: ``on_client_failure == "drop"``.
      secure: a :class:`~ssca_solver.federated.secagg.SecureAggregation`, or None.
      tally: the runner's :class:`~ssca_solver.engine.runner.Tally`, counted as messages cross.

    Attributes:
      pending: the Dropouts of the requests collected since the last :meth:`take`.
    """

    def __init__(self, transport, sizes: Sequence[int], drop: bool = False, secure=None,
                 tally=None):
        self.transport = transport
        self.sizes = np.asarray(sizes, dtype=float)
        self.drop = bool(drop)
        self.secure = secure
        self.tally = tally
        self.pending: list[Dropout] = []
        self.check = ReplyCheck(self.sizes.astype(int))
        #: (round, {client: the largest magnitude in its reply}) of the latest round request
        #: (plain aggregation; :meth:`outlier`)
        self.magnitudes: tuple = (None, {})
        #: client -> (timeouts in a row, the round of the last, the last round it sits out)
        self._skip: dict = {}

    def take(self) -> list[Dropout]:
        """The dropouts recorded since the last call (and forget them)."""
        out, self.pending = self.pending, []
        return out

    # -- counting ---------------------------------------------------------------------------------
    def count(self, kind: str, up: int, down: int, clients: int = 1) -> None:
        """The message pairs of ``clients`` clients (one by default) in a round
        (``kind="round"``) or an evaluation or probe (``"eval"``): ``up`` words up and
        ``down`` words down each."""
        t = self.tally
        if t is None or clients <= 0:
            return
        if kind == "round":
            t.up += clients * up
            t.down += clients * down
            t.up_per_client_round = max(t.up_per_client_round, up)
            t.down_per_client_round = down
        else:
            t.eval_up += clients * up
            t.eval_down += clients * down

    # -- what the replies of a round held ---------------------------------------------------------
    def _measure(self, reply: Reply, kind: str, top: float) -> None:
        """Note ``top``, the largest magnitude in a round's reply (from its check)."""
        if kind == "round":
            self.magnitudes[1][reply.client] = top

    def outlier(self, round) -> Optional[str]:
        """A sentence naming the client whose reply to ``round`` held a number more than
        :data:`OUTLIER_FACTOR` times the largest of every other client's reply (None: no
        such client, fewer than two replies, or secure aggregation, where the server sees no
        single reply)."""
        at, tops = self.magnitudes
        if at != round or len(tops) < 2:
            return None
        client, top = max(tops.items(), key=lambda kv: kv[1])
        rest = max(v for c, v in tops.items() if c != client)
        if not (rest > 0.0 and top > OUTLIER_FACTOR * rest):
            return None
        return (f"client {client}'s reply to round {round} held a number of magnitude "
                f"{top:.3g}, {top / rest:.3g} times the largest in the other clients' replies "
                f"({rest:.3g}): a reply wrong by that much makes the iterates diverge, so check "
                f"that client (its data, its functions, what reached the server) before the "
                "solver's options")

    # -- collecting -------------------------------------------------------------------------------
    def collect(self, request: Request, participants: Optional[Sequence[int]] = None,
                factors: Optional[np.ndarray] = None, kind: str = "round") -> Iterator[Reply]:
        """The replies to ``request`` from ``participants`` (None: every client) with their
        weights ``factors`` (h_i; None: 1), as described in the module docstring.

        With ``on_client_failure="drop"`` a client that did not answer within
        ``client_timeout`` is not asked again at once: after its k-th timeout in a row it sits
        out the next min(2^(k-1), SKIP_MAX) requests' rounds (each a Dropout, "not asked"),
        and the weights of those asked are scaled so that the data of the clients left out
        still add up (the same renormalisation as for a failure). A client stuck in its
        function then costs ``client_timeout`` about log2(rounds) times plus once every
        SKIP_MAX rounds, not at every round. Other failures (a raise, a dead process, a
        malformed reply) cost no wait: such a client is asked again at the next request."""
        if not self.drop:
            yield from self._collect(request, participants, factors, kind)
            return
        order = list(range(len(self.sizes))) if participants is None else list(participants)
        h = np.ones(len(order)) if factors is None else np.asarray(factors, dtype=float)
        now = int(request.round)
        out = [i for i in order if self._skip.get(i, (0, 0, -1))[2] >= now]
        if not out or len(out) == len(order):       # nobody left out, or nobody left to ask
            asked, hk, ratio = participants, factors, 1.0
            out = []
        else:
            keep = [k for k, i in enumerate(order) if i not in out]
            asked = [order[k] for k in keep]
            hk = h[keep]
            # the data of those left out, renormalised away as for those who fail
            ratio = self.renormalisation(order, h, asked, request, [])
        before = len(self.pending)
        done = False
        try:
            for reply in self._collect(request, asked, hk, kind):
                yield reply if ratio == 1.0 else replace(reply, weight=reply.weight * ratio)
                del reply
            done = True
        finally:
            # only a timeout costs the round its wait; a client that raised, died or sent a
            # malformed reply answers at once and is asked again next round
            failed = {d.client for d in self.pending[before:] if TIMEOUT_MARK in d.error}
            for i in (order if asked is None else asked):
                if i in failed:
                    k = self._skip.get(i, (0, 0, -1))[0] + 1
                    self._skip[i] = (k, now, now + min(2 ** (k - 1), SKIP_MAX))
                elif done:
                    self._skip.pop(i, None)
            for i in out:
                n, last, until = self._skip[i]
                self.pending.append(Dropout(
                    i, request.task, request.round,
                    f"not asked: it did not answer within client_timeout {n} time(s) in a "
                    f"row, most recently at round {last}; asked again at round {until + 1} "
                    "(on_client_failure='drop')"))

    def _collect(self, request: Request, participants, factors, kind) -> Iterator[Reply]:
        if self.secure is not None:
            yield from self.secure.collect(self, request, participants, factors, kind)
            return
        if getattr(self.transport, "sharded", False) and self.transport.sums(request.task):
            yield from self._collect_shards(request, participants, factors, kind)
            return
        order = list(range(len(self.sizes))) if participants is None else list(participants)
        check = self.check.start(request, order)
        if kind == "round":
            self.magnitudes = (request.round, {})
        down = request.num_floats()
        if not self.drop:
            if participants is None:       # a stream(request) of old works
                stream = self.transport.stream(request)
                factor = None
            else:
                stream = self.transport.stream(request, participants, False)
                h = np.ones(len(order)) if factors is None else np.asarray(factors, dtype=float)
                factor = dict(zip(order, h))
            items = iter(stream)
            k = 0
            # each reply is handed on once the next one has been checked against it: a first
            # reply that lacks an array (or has one more) is then found by the comparison
            # with the others before the algorithm folds it (one reply more held at a time)
            held = None
            try:
                for reply in items:
                    top = check.check(reply, order[k] if k < len(order)
                                      else _extra(request, reply))
                    k += 1
                    self.count(kind, reply.num_floats(), down)
                    self._measure(reply, kind, top)
                    odd = check.note(reply)
                    if odd is not None:
                        raise self._disagreement(check, odd, items, order, k)
                    ready = reply if factor is None else replace(
                        reply, weight=float(factor[reply.client]))
                    del reply
                    if held is not None:
                        yield held
                    held = ready
                    del ready  # the algorithm has what it was given; keep no second reference
                if k < len(order):
                    raise ReplyError(order[k], where(request), "no reply arrived (the "
                                     "transport's stream ended before this client's reply)",
                                     kind="type")
                odd = check.alone()          # one reply: compared with earlier requests'
                if odd is not None:
                    raise odd
                check.done()
                if held is not None:
                    yield held
                    held = None
            finally:           # a transport's stream left early reads (or drops) what is left
                getattr(items, "close", lambda: None)()
            return
        h = np.ones(len(order)) if factors is None else np.asarray(factors, dtype=float)
        factor = dict(zip(order, h))
        stream = self.transport.stream(request, participants, self.drop)
        answered, dropped = [], []

        def collect(items, asked):
            k = 0
            for item in items:
                expected = asked[k] if k < len(asked) else _extra(request, item)
                k += 1
                if isinstance(item, Dropout) and item.client == expected:
                    dropped.append(item)
                    self.count(kind, 0, down)
                    continue
                self.count(kind, item.num_floats() if isinstance(item, Reply) else 0, down)
                try:
                    top = check.check(item, expected)
                except ReplyError as exc:
                    dropped.append(_dropout(request, exc))
                else:
                    answered.append(item)
                    self._measure(item, kind, top)
            dropped.extend(Dropout(i, request.task, request.round, "ReplyError: no reply "
                                   "arrived (the transport's stream ended before it)")
                           for i in asked[k:])

        def screened():
            nonlocal answered
            answered, bad = check.screen(answered)
            odd = check.alone() if len(answered) == 1 else None
            if odd is not None:              # one reply: compared with earlier requests'
                answered, bad = [], bad + [odd]
            dropped.extend(_dropout(request, exc) for exc in bad)

        collect(stream, order)       # held until all arrived: s depends on who answered
        screened()
        if dropped and kind == "eval":
            # a full-data evaluation asks the failed clients once more (a dead process client
            # has been restarted): only a second failure leaves it out
            retry, dropped[:] = [d.client for d in dropped], []
            collect(self.transport.stream(request, retry, True), retry)
            screened()
            answered.sort(key=lambda r: order.index(r.client))
        if not dropped:
            check.done()
        self.pending.extend(dropped)
        s = self.renormalisation(order, h, [r.client for r in answered], request, dropped)
        while answered:
            reply = answered.pop(0)
            yield replace(reply, weight=float(factor[reply.client] * s))
            del reply

    def _collect_shards(self, request: Request, participants, factors, kind) -> Iterator[Reply]:
        """The shards' summed replies (:mod:`.shards`): each checked as it arrives (real,
        finite, the same arrays as the other shards'), and with ``on_client_failure="drop"``
        weighted by the renormalisation over the clients who answered (held until every
        shard answered: it depends on who did). The messages are counted as the clients'
        own: a shard's sum has the layout of each client's reply and stands for the replies
        of the clients who answered (what a deployment without shards would send)."""
        down = request.num_floats()
        answered, dropped = [], []
        layout = None

        def gather(who, hw):
            nonlocal layout
            for part in self.transport.aggregate(request, who, hw, self.drop):
                up = 0 if part.reply is None else part.reply.num_floats()
                self.count(kind, up, down, len(part.answered))
                self.count(kind, 0, down, len(part.dropouts))
                dropped.extend(part.dropouts)
                if part.reply is not None:
                    layout = shard_layout(part.reply, request, part.shard, layout) or layout
                    answered.extend(part.answered)
                    yield part.reply

        if not self.drop:
            yield from gather(participants, factors)
            return
        held = list(gather(participants, factors))
        order = list(range(len(self.sizes))) if participants is None else list(participants)
        h = np.ones(len(order)) if factors is None else np.asarray(factors, dtype=float)
        if dropped and kind == "eval":
            # a full-data evaluation asks the failed clients once more
            retry = [d.client for d in dropped]
            dropped.clear()
            factor = dict(zip(order, h))
            held += gather(retry, np.array([factor[i] for i in retry]))
        self.pending.extend(dropped)
        s = self.renormalisation(order, h, answered, request, dropped)
        while held:
            reply = held.pop(0)
            yield reply if s == 1.0 else replace(reply, weight=float(s))
            del reply

    @staticmethod
    def _disagreement(check, name, items, order, k) -> ReplyError:
        """The error for array ``name``, whose shape differs between the replies so far: the
        replies still to come are read (their shapes only) so that the most common shape
        tells which client is at fault."""
        try:
            for item in items:
                if k < len(order) and isinstance(item, Reply) and item.client == order[k]:
                    check.note(item)
                k += 1
        except Exception:             # a later client's failure: the shapes seen decide
            pass
        return check.shape_error(name)

    def renormalisation(self, order, h, answered, request, dropped) -> float:
        """s = sum_{sampled} h_i N_i / sum_{answered} h_i N_i (1.0 when all answered);
        RoundFailedError when none did."""
        if not answered:
            raise RoundFailedError(request, dropped)
        if len(answered) == len(order):
            return 1.0
        factor = dict(zip(order, h))
        total = float(sum(factor[i] * self.sizes[i] for i in order))
        got = float(sum(factor[i] * self.sizes[i] for i in answered))
        return total / got


def _extra(request: Request, item):
    """A reply beyond those asked for: its error."""
    raise ReplyError(getattr(item, "client", "?"), where(request), "the transport "
                     "yielded more replies than clients were asked", kind="identity")


def _dropout(request: Request, exc: ReplyError) -> Dropout:
    return Dropout(exc.client, request.task, request.round, f"ReplyError: {exc.cause}")
