"""Every reply checked when it arrives, before an algorithm combines it (plain aggregation).

Secure aggregation checks what its protocol needs (each client checks its weighted values are
finite and in range before masking them; the server checks that every masked reply has the
same layout, :mod:`.secagg`). Under plain aggregation the server reads each reply itself, and
:class:`ReplyCheck` refuses, with a :class:`~ssca_solver.errors.ReplyError` (a ClientError)
naming the client, the request and what is wrong, a reply that

* is not a :class:`~.messages.Reply` (kind ``"type"``);
* answers as another client, or another task or round than the request's (``"identity"``);
* gives a row count ``num_rows`` other than the client's N_i known to the server, or a
  ``batch_size`` outside 1..N_i (``"counts"``): the weights N_i / (B_i N) come from them;
* carries a value that is not a NumPy array or scalar of real numbers, integer or float
  (``"dtype"``): not complex, object or text, and not bool either (True and False would be
  summed as 1 and 0: a flag is no statistic). Integer arrays are accepted as they are: they
  combine as the floats they equal (a count, say);
* carries a NaN or an infinity (``"nonfinite"``): every task's numbers are finite (a client
  whose functions are not finite at a point says so as the task defines, e.g. method "ssca"'s
  one-array ``"nonfinite"`` reply to a backtracking trial point, or raises);
* has an array whose shape differs from the same array in the other clients' replies to the
  same request (``"shape"``). The clients at fault are those that differ from the most
  common shape (all replies are read to find it); between two clients that disagree, the one
  that differs from the shape agreed in an earlier request of the same task, else the later
  one (the message names both). Arrays named with a prefix in :data:`RAGGED` are lists of
  rows whose number may differ between clients: only their other axes must agree.

* carries other arrays than the other clients' replies to the same request (``"layout"``):
  a missing or an unexpected array, judged as shapes are (the most common set of names, else
  the set agreed in an earlier request, else the earlier reply's). Arrays named with a prefix
  in :data:`OPTIONAL` are per-client extras that some replies carry and others do not (the
  noise numbers of adaptive sampling, the gradient check's retries) and are left out of the
  comparison; a reply that carries an array of :data:`STAND_IN` answers in place of the
  task's usual arrays (method "ssca"'s one-array answer at a trial point where a function is
  not finite) and is not compared either. The one reply of a request that no other reply can
  be compared with (one client asked, or one left) is compared with the set of arrays its
  task's replies carried in an earlier request of the same kind: the same task with the same
  switches (the bool and text entries of the request's ``config``, e.g. the evaluation's
  ``with_grad``); a task's first request answered by a single client has nothing to be
  compared with.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping, Optional, Sequence

import numpy as np

from ..errors import ReplyError
from .messages import SELECTS, Reply, Request

#: Name prefixes of arrays that are lists of rows, whose number may differ between clients
#: (method "ssca"'s gradient-check retries, ``"recheck:m"``): only their other axes must agree.
RAGGED = ("recheck:",)

#: Name prefixes of arrays that some clients' replies carry and others' do not (method
#: "ssca"'s noise numbers, sent only from a mini-batch, and its gradient-check retries): left
#: out when the clients' sets of arrays are compared.
OPTIONAL = ("noise", "recheck:")
#: Names of arrays that stand in for a reply's usual arrays (method "ssca"'s answer at a trial
#: point where a function is not finite): a reply carrying one is not compared with the others.
STAND_IN = ("nonfinite",)
#: Name prefixes of arrays that may hold NaN (never an infinity): method "ssca"'s probe marks
#: "no finite difference along the gradient" with a NaN, and the server warns instead of
#: checking the gradient.
NAN_ALLOWED = ("probe",)
#: The pseudo-array under which each reply's set of array names is compared (``"layout"``)
LAYOUT = "<array names>"

_REAL = "iuf"         # signed and unsigned integers, floats


def where(request: Request):
    """The ``round`` a ClientError about ``request`` names ("evaluation" for a full-data one)."""
    return "evaluation" if request.task == "evaluate" else request.round


def _shape_key(name: str, shape: tuple) -> tuple:
    return shape[1:] if name.startswith(RAGGED) else shape


def _fmt(shape: tuple) -> str:
    return str(tuple(int(s) for s in shape))


class ReplyCheck:
    """The server's checks of the replies of one run (module docstring).

    Args:
      sizes: N_i of every client, as the server knows them (from client ``first`` on).
    """

    def __init__(self, sizes: Sequence[int], first: int = 0):
        self.sizes = [int(n) for n in sizes]
        #: the index of the client whose N_i is ``sizes[0]`` (a shard's first client)
        self.first = int(first)
        self.agreed: dict = {}        # task -> {array name: shape agreed in an earlier request}
        self.layouts: dict = {}       # request_kind -> the set of arrays agreed in the last
                                      # request of that kind (RequestCheck.alone)

    def start(self, request: Request, order: Sequence[int]) -> "RequestCheck":
        """The checks of the replies to ``request`` from the clients ``order``, in that
        order."""
        return RequestCheck(self, request, order)


class RequestCheck:
    """The replies to one request, checked one by one as they arrive (:meth:`check`); shapes
    are compared with the replies already seen (:meth:`shapes`)."""

    def __init__(self, owner: ReplyCheck, request: Request, order: Sequence[int]):
        self.owner = owner
        self.request = request
        self.order = list(order)
        self.seen: dict = {}          # array name -> {shape key: [clients]}
        self.first: dict = {}         # array name -> (shape key, client) of its first reply
        self.kind = request_kind(request)

    def fail(self, client, cause: str, kind: str, array: Optional[str] = None) -> ReplyError:
        r = self.request
        return ReplyError(client, where(r), f"its reply to task {r.task!r} {cause}",
                          kind=kind, array=array)

    def check(self, reply, client: int) -> float:
        """Raise :class:`ReplyError` if ``reply`` (expected from ``client``) is malformed in
        itself (all but the comparison of shapes between clients, :meth:`shapes`); else return
        the largest magnitude among its numbers (0 for none; a NaN that an array may carry
        is skipped), read in the same pass as the finiteness check."""
        r = self.request
        if not isinstance(reply, Reply):
            raise ReplyError(client, where(r), f"it answered task {r.task!r} with a "
                             f"{type(reply).__name__}, not a Reply", kind="type")
        if isinstance(reply.client, (bool, np.bool_)) or reply.client != client:
            raise self.fail(client, f"says it comes from client {reply.client!r}", "identity")
        if reply.task != r.task or reply.round != r.round:
            raise self.fail(client, f"says it answers task {reply.task!r} at round "
                            f"{reply.round!r} (the request was round {r.round})", "identity")
        at = client - self.owner.first
        n = self.owner.sizes[at] if 0 <= at < len(self.owner.sizes) else None
        rows, batch = reply.num_rows, reply.batch_size
        if not _is_int(rows) or (n is not None and int(rows) != n):
            raise self.fail(client, f"gives num_rows={rows!r}, but the server's data gives "
                            f"client {client} {n} rows (a node's rows must have the block "
                            "sizes of the problem's data)", "counts")
        if not _is_int(batch) or not 1 <= int(batch) <= int(rows):
            raise self.fail(client, f"gives batch_size={batch!r}, outside 1..num_rows = "
                            f"1..{rows}", "counts")
        arrays = reply.arrays
        if not isinstance(arrays, Mapping):
            raise self.fail(client, f"has arrays of type {type(arrays).__name__}, not a "
                            "mapping of names to arrays", "type")
        top = 0.0
        for name, value in arrays.items():
            if not isinstance(name, str):
                raise self.fail(client, f"names an array {name!r}, not with a string", "type")
            if isinstance(value, (np.ndarray, np.generic)):
                a = value
            elif isinstance(value, (bool, int, float)):
                a = np.asarray(value)
            else:
                raise self.fail(client, f"has array {name!r} of type {type(value).__name__}, "
                                "not a NumPy array", "type", name)
            if a.dtype.kind not in _REAL:
                why = (" (True and False would be summed as 1 and 0: a flag is no statistic)"
                       if a.dtype.kind == "b" else "")
                raise self.fail(client, f"has array {name!r} of dtype {a.dtype}; replies carry "
                                f"real numbers (integer or float arrays){why}", "dtype", name)
            if not a.size:
                continue
            if a.dtype.kind != "f":
                top = max(top, float(np.max(np.abs(a.astype(float)))))
                continue
            size = float(np.max(np.abs(a)))       # not finite iff an entry is inf or NaN
            if not np.isfinite(size):
                finite = np.isfinite(a)
                bad = int(a.size - np.count_nonzero(finite))
                nan = int(np.count_nonzero(np.isnan(a)))
                if not (nan == bad and name.startswith(NAN_ALLOWED)):
                    raise self.fail(client, f"has {bad} non-finite value(s) ({nan} NaN, "
                                    f"{bad - nan} infinite) in array {name!r} (of {a.size}); "
                                    "a reply's numbers must be finite", "nonfinite", name)
                size = float(np.max(np.abs(a[finite]), initial=0.0))
            top = max(top, size)
        return top

    def note(self, reply: Reply) -> Optional[str]:
        """Record the shapes of ``reply``'s arrays; the name of the first array whose shape
        differs from the first reply that had it (None: all agree so far)."""
        odd = None
        items = [(name, _shape_key(name, tuple(np.shape(value))))
                 for name, value in reply.arrays.items()]
        if not any(name in STAND_IN for name in reply.arrays):
            items.insert(0, (LAYOUT, tuple(sorted(name for name in reply.arrays
                                                  if not name.startswith(OPTIONAL)))))
        for name, key in items:
            first = self.first.setdefault(name, (key, reply.client))
            self.seen.setdefault(name, {}).setdefault(key, []).append(reply.client)
            if odd is None and key != first[0]:
                odd = name
        return odd

    def shape_error(self, name: str) -> ReplyError:
        """The error for array ``name``, whose shapes differ between the replies noted: it
        names the first client whose shape is not the most common (module docstring)."""
        groups = self.seen[name]
        counts = Counter({k: len(v) for k, v in groups.items()})
        top = counts.most_common()
        agreed = self.owner.agreed.get(self.request.task, {}).get(name)
        best = top[0][1]
        tied = [k for k, c in top if c == best]
        if len(tied) == 1:
            right = tied[0]
        elif agreed is not None and agreed in tied:
            right = agreed
        else:             # e.g. two clients: the earlier reply's shape is taken as the right one
            right = min(tied, key=lambda k: min(map(self._position, groups[k])))
        wrong = sorted((c for k, v in groups.items() if k != right for c in v),
                       key=self._position)
        client = wrong[0]
        got = next(k for k, v in groups.items() if client in v)
        others = wrong[1:]
        how = ("the most common shape" if len(tied) == 1 else
               "the shape agreed in an earlier request" if right == agreed else
               "the earlier reply's shape (two shapes, equally common: one of the two "
               "clients is at fault)")
        more = f"; clients {others} differ too" if others else ""
        if name == LAYOUT:
            how = how.replace("shape", "set of arrays")
            peers = sorted(groups[right], key=self._position)
            return self._layout_error(client, got, right, f"the replies of clients {peers} to "
                                      f"the same request carry", f"{how}{more}")
        axes = " (all axes but the first)" if name.startswith(RAGGED) else ""
        return self.fail(client, f"has array {name!r} of shape{axes} {_fmt(got)}, but the "
                         f"replies of clients {sorted(groups[right], key=self._position)} to "
                         f"the same request have {_fmt(right)} ({how}){more}", "shape", name)

    def _layout_error(self, client, got: tuple, right: tuple, whose: str,
                      how: str) -> ReplyError:
        missing, extra = sorted(set(right) - set(got)), sorted(set(got) - set(right))
        what = "; ".join(([f"missing {missing}"] if missing else [])
                         + ([f"unexpected {extra}"] if extra else []))
        return self.fail(client, f"carries the arrays {list(got)} ({what}), but {whose} "
                         f"{list(right)} ({how})", "layout", (missing or extra)[0])

    def alone(self) -> Optional[ReplyError]:
        """The error for the only reply noted (no other reply to compare it with) when its
        set of arrays differs from the one agreed in an earlier request of the same kind
        (:func:`request_kind`); None otherwise, or when there is no such request."""
        groups = self.seen.get(LAYOUT, {})
        if len(groups) != 1:
            return None
        (got, clients), = groups.items()
        right = self.owner.layouts.get(self.kind)
        if len(clients) != 1 or right is None or got == right:
            return None
        return self._layout_error(clients[0], got, right, f"the replies to the earlier "
                                  f"requests of task {self.request.task!r} carried",
                                  "the only reply to this request: compared with the set of "
                                  "arrays agreed earlier")

    def _position(self, client) -> int:
        return self.order.index(client) if client in self.order else len(self.order)

    def screen(self, replies: list) -> tuple[list, list]:
        """(the replies whose shapes agree, the ReplyErrors of the others) for a request whose
        replies, each passed by :meth:`check`, are all here (``on_client_failure="drop"``):
        one client at fault is left out after another until the rest agree."""
        good, bad = list(replies), []
        while True:
            self.seen.clear()
            self.first.clear()
            odd = None
            for reply in good:
                odd = self.note(reply) or odd
            if odd is None:
                return good, bad
            err = self.shape_error(odd)
            bad.append(err)
            good = [r for r in good if r.client != err.client]

    def done(self) -> None:
        """Every reply arrived and agreed: remember the shapes for later requests of the task."""
        agreed = self.owner.agreed.setdefault(self.request.task, {})
        for name, groups in self.seen.items():
            if len(groups) == 1:
                agreed[name] = next(iter(groups))
        if len(self.seen.get(LAYOUT, ())) == 1:
            self.owner.layouts[self.kind] = next(iter(self.seen[LAYOUT]))


def shard_layout(reply: Reply, request: Request, shard: int,
                 agreed: Optional[dict]) -> Optional[dict]:
    """A shard's summed reply (:mod:`.shards`) checked: real finite arrays, and the arrays
    and shapes ``agreed`` by the shards before it (None: the first). Returns its
    {name: shape} (None for a stand-in reply, e.g. "nonfinite"); ReplyError naming the shard
    otherwise (its clients' own replies were checked in the shard)."""
    who = f"shard {shard}"

    def fail(cause, kind, array=None):
        return ReplyError(who, where(request), f"its summed reply to task {request.task!r} "
                          f"{cause}", kind=kind, array=array)

    if any(name in STAND_IN for name in reply.arrays):
        return None
    layout = {}
    for name, value in reply.arrays.items():
        a = np.asarray(value)
        if a.dtype.kind not in _REAL:
            raise fail(f"has array {name!r} of dtype {a.dtype}", "dtype", name)
        if a.size and not np.isfinite(np.max(np.abs(a))):
            raise fail(f"has non-finite values in array {name!r} (the sum of its clients' "
                       "finite numbers overflowed?)", "nonfinite", name)
        layout[name] = a.shape
    if agreed is not None and layout != agreed:
        raise fail(f"carries arrays {sorted(layout.items())}, the shards before it "
                   f"{sorted(agreed.items())}", "layout")
    return layout


def request_kind(request: Request) -> tuple:
    """What makes two requests of a task ask for the same arrays: the task and its switches,
    the bool and text entries of ``config`` (numbers, such as a batch size or a step, set how
    much, not what), and the contents of the arrays its config names under
    :data:`~ssca_solver.federated.messages.SELECTS` (index lists that choose what a reply
    carries, e.g. the functions whose curvature a round asks for). Other arrays (a point, a
    sketch's directions, secure aggregation's participant lists) choose nothing."""
    switches = tuple(sorted((k, v) for k, v in request.config.items()
                            if isinstance(v, (bool, np.bool_, str))))
    names = [k for k in str(request.config.get(SELECTS) or "").split(",") if k]
    arrays = request.arrays or {}
    chosen = tuple((k, tuple(np.asarray(arrays[k]).ravel().tolist()) if k in arrays else None)
                   for k in sorted(names))
    return request.task, switches + chosen


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
